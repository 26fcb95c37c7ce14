#include "pipeline/input/tar_index_cache.hpp"

#include <sys/stat.h>

#include <charconv>
#include <fstream>
#include <iterator>
#include <system_error>

#include <spdlog/spdlog.h>

#include "pipeline/core/sha256.hpp"
#include "pipeline/input/tar_shards.hpp"

namespace precompute {

// Note [Tar indexes kept in the output folder]
// Reading a shard's headers costs one read per member; on a network file system each is a round
// trip, and a resumed run over thousands of shards would pay them all again. So each tar's index
// is kept in the output folder (tars often sit on read-only storage), one file per tar named by
// its resolved path (storage's kTarIndexFilePrefix and a digest), written once the run may
// change the folder. They describe the input, not the output, so --overwrite leaves them, and
// verify reads them without writing any. A later run uses a kept
// index only when the tar is still the file it describes: the same resolved path, size,
// modification time, inode and device; otherwise, or when the file is damaged, cut short or of
// another version (a digest of its bytes ends it), it scans the tar again and keeps the new
// index. A tar rewritten in place with the same size and time would pass these checks, and so
// could a tar changed after them: opening a member reads its header again and fails the sample
// when it is not the member's (Note [A member's header is read again before its bytes]), so stale
// ranges are never decoded. A rank keeps its indexes in its own folder. Fresh indexes wait in
// memory, encoded, until the folder may change; past kMaxKeptBytes the rest are not kept (the
// next run scans those tars again).

namespace {

constexpr std::string_view kMagic = "precompute-tar-index 1\n";
constexpr int64_t kMaxKeptBytes = int64_t{256} << 20;
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;

// Reads the numbers and byte strings encode_tar_index writes; any deviation ends it.
class Cursor {
 public:
  explicit Cursor(std::string_view bytes) : rest_(bytes) {}

  // A decimal number followed by `end` (' ' or '\n').
  template <class T>
  bool number(T& value, char end) {
    const auto [next, error] = std::from_chars(rest_.data(), rest_.data() + rest_.size(), value);
    if (error != std::errc() || next == rest_.data() || next == rest_.data() + rest_.size() ||
        *next != end) {
      return false;
    }
    rest_.remove_prefix(static_cast<size_t>(next - rest_.data()) + 1);
    return true;
  }
  bool bytes(std::string& out, int64_t size) {
    if (size < 0 || static_cast<uint64_t>(size) > rest_.size()) return false;
    out.assign(rest_.data(), static_cast<size_t>(size));
    rest_.remove_prefix(static_cast<size_t>(size));
    return true;
  }
  bool literal(std::string_view text) {
    if (rest_.substr(0, text.size()) != text) return false;
    rest_.remove_prefix(text.size());
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  std::string_view rest_;
};

std::optional<std::string> read_small_file(const std::filesystem::path& file) {
  std::error_code error;
  const auto size = std::filesystem::file_size(file, error);
  if (error || size > static_cast<uintmax_t>(kMaxFileBytes)) return std::nullopt;
  std::ifstream in(file, std::ios::binary);
  if (!in) return std::nullopt;
  std::string bytes(static_cast<size_t>(size), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!in) return std::nullopt;
  return bytes;
}

bool same_file(const TarIndex& kept, const std::filesystem::path& tar) {
  struct stat info {};
  if (::stat(tar.c_str(), &info) != 0) return false;
  const int64_t modified_ns = int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
  return kept.tar_bytes == info.st_size && kept.modified_ns == modified_ns &&
         kept.inode == info.st_ino && kept.device == info.st_dev;
}

}  // namespace

std::string tar_index_file_name(const std::filesystem::path& tar) {
  return ".precompute.tar-index." + sha256_hex(resolved_tar_path(tar).string()).substr(0, 16);
}

std::string encode_tar_index(const TarIndex& index) {
  std::string out(kMagic);
  const std::string path = index.tar.string();
  out += std::to_string(path.size()) + ' ' + std::to_string(index.tar_bytes) + ' ' +
         std::to_string(index.modified_ns) + ' ' + std::to_string(index.inode) + ' ' +
         std::to_string(index.device) + ' ' + std::to_string(index.members.size()) + '\n';
  out += path;
  out += '\n';
  for (const TarMember& member : index.members) {
    out += std::to_string(member.offset) + ' ' + std::to_string(member.size) + ' ' +
           std::to_string(member.name.size()) + ' ' + std::to_string(member.refusal.size()) +
           '\n';
    out += member.name;
    out += member.refusal;
    out += '\n';
  }
  out += "end " + sha256_hex(out) + '\n';
  return out;
}

std::optional<TarIndex> decode_tar_index(std::string_view bytes) {
  // The digest first: a damaged file is no file, whatever it parses to.
  const size_t end = bytes.rfind("end ");
  if (end == std::string_view::npos || bytes.size() != end + 4 + 64 + 1 || bytes.back() != '\n' ||
      bytes.substr(end + 4, 64) != sha256_hex(bytes.substr(0, end))) {
    return std::nullopt;
  }
  Cursor in(bytes.substr(0, end));
  TarIndex index;
  size_t path_size = 0;
  size_t members = 0;
  std::string path;
  if (!in.literal(kMagic) || !in.number(path_size, ' ') || !in.number(index.tar_bytes, ' ') ||
      !in.number(index.modified_ns, ' ') || !in.number(index.inode, ' ') ||
      !in.number(index.device, ' ') || !in.number(members, '\n') ||
      !in.bytes(path, static_cast<int64_t>(path_size)) || !in.literal("\n")) {
    return std::nullopt;
  }
  index.tar = path;
  // Each member takes at least 9 bytes, so a count the file cannot hold is refused before any
  // allocation.
  if (members > bytes.size() / 9) return std::nullopt;
  index.members.resize(members);
  for (TarMember& member : index.members) {
    int64_t name_size = 0;
    int64_t refusal_size = 0;
    if (!in.number(member.offset, ' ') || !in.number(member.size, ' ') ||
        !in.number(name_size, ' ') || !in.number(refusal_size, '\n') ||
        !in.bytes(member.name, name_size) || !in.bytes(member.refusal, refusal_size) ||
        !in.literal("\n") || member.offset < 0 || member.size < 0 ||
        member.offset > index.tar_bytes - member.size) {
      return std::nullopt;
    }
  }
  if (!in.done()) return std::nullopt;
  return index;
}

TarIndexCache::TarIndexCache(std::filesystem::path folder, bool keep_fresh)
    : folder_(std::move(folder)), keep_fresh_(keep_fresh) {}

TarIndex TarIndexCache::index(const std::filesystem::path& tar) {
  if (folder_.empty()) {
    TarIndex index = index_tar(tar);
    ++scanned_;
    return index;
  }
  const std::filesystem::path path = resolved_tar_path(tar);
  const std::string name = tar_index_file_name(tar);
  if (const auto bytes = read_small_file(folder_ / name)) {
    auto kept = decode_tar_index(*bytes);
    if (kept && kept->tar == path && same_file(*kept, tar)) {
      kept->tar = tar;
      ++reused_;
      return std::move(*kept);
    }
    spdlog::debug("the kept index of tar {} ({}) is stale or damaged: reading its headers again",
                  tar.string(), (folder_ / name).string());
  }
  return scan(tar, name);
}

TarIndex TarIndexCache::rescan(const std::filesystem::path& tar) {
  return scan(tar, tar_index_file_name(tar));
}

TarIndex TarIndexCache::scan(const std::filesystem::path& tar, const std::string& name) {
  TarIndex index = index_tar(tar);
  ++scanned_;
  if (!keep_fresh_) return index;
  TarIndex keep = index;
  keep.tar = resolved_tar_path(tar);
  std::string bytes = encode_tar_index(keep);
  const std::lock_guard lock(mutex_);
  // A rescan replaces what an earlier scan of the tar kept.
  for (auto it = fresh_.begin(); it != fresh_.end(); ++it) {
    if (it->first == name) {
      fresh_bytes_ -= static_cast<int64_t>(it->second.size());
      fresh_.erase(it);
      break;
    }
  }
  if (fresh_bytes_ + static_cast<int64_t>(bytes.size()) > kMaxKeptBytes) {
    if (!over_cap_) {
      spdlog::info("tar indexes: past {} MiB of fresh indexes, the rest are not kept in the "
                   "output folder (a later run reads those tars' headers again)",
                   kMaxKeptBytes >> 20);
    }
    over_cap_ = true;
    return index;
  }
  fresh_bytes_ += static_cast<int64_t>(bytes.size());
  fresh_.emplace_back(name, std::move(bytes));
  return index;
}

std::vector<std::pair<std::string, std::string>> TarIndexCache::take_files() {
  const std::lock_guard lock(mutex_);
  fresh_bytes_ = 0;
  return std::exchange(fresh_, {});
}

}  // namespace precompute
