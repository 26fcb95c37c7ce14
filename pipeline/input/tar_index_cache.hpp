#pragma once
// Tar indexes kept between runs in the output folder, so that a resumed run does not read every
// shard's headers again (Note [Tar indexes kept in the output folder] in tar_index_cache.cpp).

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeline/input/tar_index.hpp"

namespace precompute {

class TarIndexCache {
 public:
  // `folder`: the output folder the run writes (a rank's folder for a rank). Empty: nothing is
  // looked up or kept, every tar is scanned. `keep_fresh` false: indexes scanned now are not
  // kept for take_files() (a reader of the folder, such as verify, that writes nothing).
  explicit TarIndexCache(std::filesystem::path folder = {}, bool keep_fresh = true);

  // The index of `tar`: the one kept in the folder when there is one that still describes the
  // tar as it is (the same resolved path, size, modification time, inode and device), else a
  // fresh scan (index_tar, whose InputError it throws), kept for take_files(). Thread-safe.
  TarIndex index(const std::filesystem::path& tar);

  // The index of `tar` read from the tar itself, kept in place of what index() gave: for a tar
  // whose kept index turned out stale (a member's header not where it said). Thread-safe.
  TarIndex rescan(const std::filesystem::path& tar);

  // The files to write into the folder for the tars scanned afresh, as (name, bytes), once the
  // run may change the folder; the kept bytes are released.
  std::vector<std::pair<std::string, std::string>> take_files();

  int64_t reused() const { return reused_; }
  int64_t scanned() const { return scanned_; }

 private:
  TarIndex scan(const std::filesystem::path& tar, const std::string& name);

  std::filesystem::path folder_;
  bool keep_fresh_ = true;
  std::mutex mutex_;
  std::vector<std::pair<std::string, std::string>> fresh_;
  int64_t fresh_bytes_ = 0;
  bool over_cap_ = false;
  std::atomic<int64_t> reused_{0};
  std::atomic<int64_t> scanned_{0};
};

// The name of `tar`'s file in the output folder: ".precompute.tar-index." and 16 hex digits of
// the SHA-256 of its resolved path.
std::string tar_index_file_name(const std::filesystem::path& tar);

// A kept index's bytes, and back: nullopt for bytes that are not one whole file of this format
// (damaged, cut short, another version), which a run treats as no file.
std::string encode_tar_index(const TarIndex& index);
std::optional<TarIndex> decode_tar_index(std::string_view bytes);

}  // namespace precompute
