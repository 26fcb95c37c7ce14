#pragma once
// The run's counters as its summary reports them: the one place where RunStats becomes
// RunSummary (pipeline/runner.hpp), which the end-of-run line and the summary file
// (pipeline/summary_file.hpp) read.

#include <array>

#include "pipeline/core/modality.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/runner.hpp"

namespace precompute {

// A summary holding what `stats` counted; `configured`: the modalities with an encoder, whose
// encode times it lists. The runner adds what the counters do not hold (the output, its totals,
// the times of the start-up, the decoders set up, the exit).
RunSummary summary_from_stats(const RunStats& stats,
                              const std::array<bool, kNumModalities>& configured);

}  // namespace precompute
