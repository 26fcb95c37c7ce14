#pragma once
// The oneTBB flow graph that runs a precompute job; the only file pair that knows oneTBB
// (Note [The graph] in graph.cpp). The stages it wires are plain classes in pipeline/stages/.

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "pipeline/core/sample.hpp"
#include "pipeline/stages/batch_router.hpp"
#include "pipeline/stages/encode_stage.hpp"
#include "pipeline/stages/sample_preparer.hpp"
#include "pipeline/stages/shard_assembler.hpp"

namespace precompute {

struct RunStats;

struct GraphSettings {
  // Worker threads of the oneTBB arena the graph runs in (0: oneTBB's default). Decode bodies,
  // one body per encoder and the two serial stages each occupy a thread.
  int threads = 0;
  int decode_concurrency = 1;  // samples decoded at once
  size_t max_in_flight = 64;   // samples between the source and the writer
  std::array<size_t, kNumModalities> encode_concurrency{};  // encoders per modality (0: none)
  // Called by the source before each sample; may wait (host memory back-pressure).
  std::function<void()> before_sample;
};

// Decodes and tokenises one sample (thread-safe): SamplePreparer, in crash containment.
using PrepareFn = std::function<PreparedSamplePtr(const SampleSpec&)>;

// Runs the samples input[p] for p in `positions` (ascending; a resumed run passes only those
// not yet committed) through the stages, in an arena of settings.threads, and returns when the
// last shard is handed to the committer, or, after a stop request, once the encoder calls under
// way have ended, the samples in flight dropped (Note [A stop drops the samples in flight] in
// graph.cpp). Rethrows the first exception a stage let escape, after cancelling the rest of the
// graph.
void run_graph(const std::vector<SampleSpec>& input, const std::vector<int64_t>& positions,
               const PrepareFn& prepare, BatchRouter& router, const EncodeStage& encoder,
               ShardAssembler& assembler, RunStats& stats, const GraphSettings& settings);

}  // namespace precompute
