#pragma once
// The output id: the mark that every file precompute writes into an output folder carries (an
// HDF5 attribute `output_id` in shards and dataset.h5, a JSON field `output_id` in index.json,
// job.json and summary.json), so that the tool deletes or replaces only what it can prove it wrote there (Note
// [Proving a file is ours] in output_id.cpp). It is made from the run's config fingerprint, so
// every file of one output carries the same id, and so do the ranks of a split job and its
// merged output, while an output of other settings carries another.
//
// Thread-safe: free functions without shared state.

#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace precompute {

// An output id is this prefix followed by 32 lowercase hex digits.
inline constexpr std::string_view kOutputIdPrefix = "precompute-output-";
inline constexpr size_t kOutputIdHexDigits = 32;

// The id of the output of a run with this config fingerprint (64 hex digits): the prefix and
// the fingerprint's first 32 digits.
std::string output_id_for(std::string_view config_fingerprint);

bool is_output_id(std::string_view text);

// The first output id found in the file's bytes, without parsing the file (a damaged HDF5 file
// may crash the library that opens it). std::nullopt when it holds none. Throws StorageError
// when the file cannot be read.
std::optional<std::string> find_output_id(const std::filesystem::path& file);

}  // namespace precompute
