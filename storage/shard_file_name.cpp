#include "storage/shard_file_name.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Shard files named by their bytes]
// dataset.h5 maps every shard by its file name, and HDF5 opens a mapped file by name when a
// reader reaches its rows. A reader that holds an old view open across a rewrite (`run
// --overwrite`, `--retry-failed`) would read whatever file now has that name: with names that
// only count shards, rows of the new output under the old view's offsets, neither the old
// output nor the new. So the name carries the file's own hash: a rewrite that changes a shard's
// bytes writes another name, and the old view finds the old bytes (a file still open, or not
// yet deleted) or no file at all, which it reads as the view's fill values (docs/format.md,
// "One-file view"), never another output's rows. A redone shard with the same bytes gets the
// same name, so a resumed run and an uninterrupted one still write the same files. Eight hex
// digits: two versions of one shard index in one folder collide once in 4 billion rewrites.

namespace {

constexpr std::string_view kPrefix = "shard-";
constexpr std::string_view kSuffix = ".h5";

bool is_lower_hex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

}  // namespace

std::string shard_file_name(int64_t shard_index, std::string_view sha256) {
  PC_ASSERT(shard_index >= 0, "shard index ", shard_index);
  PC_ASSERT(sha256.size() >= kShardNameHashDigits &&
                std::all_of(sha256.begin(), sha256.begin() + kShardNameHashDigits, is_lower_hex),
            "not a hex SHA-256: '", sha256, "'");
  return fmt::format("{}{:06d}-{}{}", kPrefix, shard_index, sha256.substr(0, kShardNameHashDigits),
                     kSuffix);
}

bool is_shard_file_name(std::string_view name) {
  if (name.size() < kPrefix.size() + 6 + 1 + kShardNameHashDigits + kSuffix.size() ||
      name.substr(0, kPrefix.size()) != kPrefix ||
      name.substr(name.size() - kSuffix.size()) != kSuffix) {
    return false;
  }
  std::string_view middle =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  const std::string_view hash = middle.substr(middle.size() - kShardNameHashDigits);
  middle.remove_suffix(kShardNameHashDigits);
  if (middle.empty() || middle.back() != '-') return false;
  middle.remove_suffix(1);
  // Six digits or more, as many as an int64 index can have.
  return middle.size() >= 6 && middle.size() <= 18 &&
         std::all_of(middle.begin(), middle.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
         std::all_of(hash.begin(), hash.end(), is_lower_hex);
}

}  // namespace precompute
