#pragma once
// Crash-safe replacement of one file: the bytes go to a temporary file in the same folder, which
// is fsynced, renamed over the target, and the folder is fsynced. After a crash the target holds
// either the old or the new bytes, never a mix. Thread-safe for different targets.

#include <filesystem>
#include <functional>
#include <string>
#include <string_view>

namespace precompute {

// Throws StorageError naming the path and the system error (ENOSPC, EIO, EACCES ...).
void write_file_atomically(const std::filesystem::path& target, std::string_view bytes);

// The same for a file whose name is known only once its bytes are on disk (a shard, named by
// its hash): the temporary file is named after `stem`, and `name()`, called after it is synced,
// gives the target's name in `folder`. Returns the target's path.
std::filesystem::path write_named_file_atomically(const std::filesystem::path& folder,
                                                  std::string_view stem, std::string_view bytes,
                                                  const std::function<std::string()>& name);

// Prefix of temporary files; a run that finds such files left by a crash may delete them.
inline constexpr std::string_view kTempFilePrefix = ".tmp-";

}  // namespace precompute
