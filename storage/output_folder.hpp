#pragma once
// The output folder before a run writes to it: created if missing, proven writable, and checked
// for a previous run. Fails in seconds, before any decoding, with the path and the fix.

#include <filesystem>

namespace precompute {

// Creates `dir` (and parents) and writes a probe file in it. A folder that already holds a run
// (index.json or shard files) is refused unless `overwrite`, in which case precompute's own files
// are removed (nothing else in the folder is touched). Throws OutputFolderError.
void prepare_output_folder(const std::filesystem::path& dir, bool overwrite);

}  // namespace precompute
