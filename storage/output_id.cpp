#include "storage/output_id.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <system_error>
#include <vector>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Proving a file is ours]
// A name proves nothing: a user's own dataset.h5, or an HDF5 file of theirs that happens to be
// called like a shard, sits in an output folder exactly as ours would. So every file the tool
// writes there carries the folder's output id, and a run, `run --overwrite` and `merge` delete or
// replace a file with one of the tool's names only when it carries that id (a file with another
// name is never touched at all). The id is looked for in the file's bytes rather than through
// HDF5 or a JSON parser: the check must also work for a file that is damaged (a shard whose
// sha256 no longer matches is ours to delete and redo, and HDF5 may crash on its bytes), and it
// must cost little for a folder of thousands of shards. The writers put the id first among a
// file's attributes or fields, so it sits in the first kilobytes (tested by
// OutputIdTest.TheIdOfAShardIsInItsFirstBlock); a file without it is read to its end once.
// The id is made from the config fingerprint (a SHA-256 of everything that changes stored
// values), not drawn at random: a resumed run, a run redone in another folder and the ranks of a
// split job then write the same bytes as one uninterrupted run (docs/format.md, "Commit
// protocol"), and a merged output is made of its ranks' files as they are. What it proves is
// that the tool wrote the file for an output of these settings; a folder's files must all carry
// its index's id, so a shard of an output of other settings is refused like a user's file. A
// file that lost the id to damage cannot be proven, and the run refuses it by name: moving it
// away is the user's decision.

namespace {

constexpr size_t kBlockBytes = size_t{1} << 16;

bool is_hex_digit(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// The output id starting at `text[at]`, where the prefix was found, or "".
std::string id_at(std::string_view text, size_t at) {
  const size_t length = kOutputIdPrefix.size() + kOutputIdHexDigits;
  if (text.size() - at < length) return {};
  const std::string_view candidate = text.substr(at, length);
  return is_output_id(candidate) ? std::string(candidate) : std::string();
}

}  // namespace

std::string output_id_for(std::string_view config_fingerprint) {
  PC_ASSERT(config_fingerprint.size() >= kOutputIdHexDigits &&
                std::all_of(config_fingerprint.begin(),
                            config_fingerprint.begin() + kOutputIdHexDigits, is_hex_digit),
            "not a config fingerprint: '", config_fingerprint, "'");
  return std::string(kOutputIdPrefix) + std::string(config_fingerprint.substr(0, kOutputIdHexDigits));
}

bool is_output_id(std::string_view text) {
  return text.size() == kOutputIdPrefix.size() + kOutputIdHexDigits &&
         text.substr(0, kOutputIdPrefix.size()) == kOutputIdPrefix &&
         std::all_of(text.begin() + static_cast<std::ptrdiff_t>(kOutputIdPrefix.size()),
                     text.end(), is_hex_digit);
}

std::optional<std::string> find_output_id(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  PC_CHECK(fd >= 0, StorageError, "cannot read ", file, ": ",
           std::generic_category().message(errno));
  // A window of the previous block's tail and the next block, so an id cut by a block boundary
  // is still seen whole.
  const size_t keep = kOutputIdPrefix.size() + kOutputIdHexDigits - 1;
  std::string window;
  std::vector<char> block(kBlockBytes);
  std::optional<std::string> found;
  for (;;) {
    const ssize_t n = ::read(fd, block.data(), block.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int error = errno;
      ::close(fd);
      PC_THROW(StorageError, "cannot read ", file, ": ", std::generic_category().message(error));
    }
    const bool end = n == 0;
    window.append(block.data(), static_cast<size_t>(n));
    for (size_t at = window.find(kOutputIdPrefix); at != std::string::npos;
         at = window.find(kOutputIdPrefix, at + 1)) {
      // Only a candidate cut short by the window's end waits for the next block.
      if (!end && window.size() - at < keep + 1) break;
      if (auto id = id_at(window, at); !id.empty()) {
        found = std::move(id);
        break;
      }
    }
    if (found || end) break;
    if (window.size() > keep) window.erase(0, window.size() - keep);
  }
  ::close(fd);
  return found;
}

}  // namespace precompute
