#pragma once
// The names of shard files: "shard-" + the shard index (six digits or more) + "-" + the first
// eight hex digits of the file's SHA-256 + ".h5", e.g. shard-000012-3f9a0c1d.h5. A name is
// never reused for other bytes (Note [Shard files named by their bytes] in shard_file_name.cpp).
// Thread-safe: pure functions.

#include <cstdint>
#include <string>
#include <string_view>

namespace precompute {

inline constexpr size_t kShardNameHashDigits = 8;

// `sha256`: the file's SHA-256 as hex (at least kShardNameHashDigits digits).
std::string shard_file_name(int64_t shard_index, std::string_view sha256);

// True for a name shard_file_name() makes, and nothing else, so that a user's
// shard-final-results.h5 (or shard-000000.h5) is never taken for one. Names only: whether the
// file is ours is proven by its output id (storage/output_id.hpp).
bool is_shard_file_name(std::string_view name);

}  // namespace precompute
