#pragma once
// The files a run reports to beside its output: run.summary_json (--summary-json) and
// run.metrics_file (--metrics-file). Where each process of a job writes them, and the checks
// that refuse a path that cannot work before any work starts (Note [Where a run reports] in
// report_files.cpp).

#include <filesystem>

#include "pipeline/core/config.hpp"
#include "pipeline/core/partition.hpp"

namespace precompute {

// `path` with the rank put before its extension: summary.json becomes
// summary.rank-00002-of-00004.json for rank 2 of 4; unchanged for a single process.
std::filesystem::path rank_report_path(const std::filesystem::path& path,
                                       const Partition& partition);

// Checks the files this process writes for config.run.summary_json and metrics_file
// (rank_report_path()), then sets them: not a folder, in a folder that exists and is writable,
// not inside the output folder, not a file the run reads (the config, the input, a model), not
// the other report's file, no NUL byte, a name short enough for its temporary file. Throws
// ConfigError naming the key, its flag and the fix, and leaves the config as it was.
void place_report_files(Config& config, const Partition& partition);

// Removes a summary left at run.summary_json by an earlier command, so that after this one the
// file is this command's or absent, never an older run's. Throws StorageError.
void remove_earlier_summary(const Config& config);

}  // namespace precompute
