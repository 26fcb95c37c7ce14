#pragma once
// The run's summary as JSON (docs/format.md, "Run summary"): what --summary-json PATH
// (run.summary_json) receives and the output folder keeps as summary.json, built from a
// RunSummary here and nowhere else (Note [The run's summary file] in summary_file.cpp).

#include <filesystem>
#include <string>
#include <string_view>

#include "pipeline/runner.hpp"

namespace precompute {

// The "format" and "format_version" fields of a summary file.
inline constexpr std::string_view kSummaryFormat = "precompute-summary";
inline constexpr int kSummaryFormatVersion = 1;

// The end a summary records for an exit code: done (0), too_many_failures (3), stopped (129,
// 130, 143), refused (2, 65, 69, 73: the run changed nothing), failed (anything else).
std::string_view summary_end_name(int exit_code);

// The summary's JSON text (ends with a line feed). Strings that are not UTF-8 (a path may hold
// any bytes) are written with U+FFFD in place of the bytes that are not.
std::string summary_text(const RunSummary& summary);

// Writes the summary to `path` (when not empty) and, when `keep_in_output`, to the output
// folder's summary.json (summary.output), each atomically; the folder's copy carries the output
// id, so it must be set then. Throws StorageError naming the file.
void write_summary_files(const RunSummary& summary, const std::filesystem::path& path,
                         bool keep_in_output);

// True when `folder`'s summary.json is a summary that ended with `exit_code` (a run that had
// nothing to do leaves such a file as it is).
bool kept_summary_ended_with(const std::filesystem::path& folder, int exit_code);

}  // namespace precompute
