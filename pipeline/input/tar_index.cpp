#include "pipeline/input/tar_index.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstring>
#include <optional>
#include <string_view>

#include "pipeline/core/error.hpp"
#include "pipeline/core/tar_header.hpp"
#include "pipeline/input/printable_text.hpp"

namespace precompute {

// Note [Tar members read in place]
// A WebDataset shard is a plain tar: 512-byte headers, each followed by the member's data padded
// to 512 bytes. Reading one header after another while skipping the data gives every member's
// byte range, and a member is then read as that range of the tar (MediaSource,
// ffmpeg::open_input), so nothing is extracted and nothing but the output is written. The tar
// is untrusted: every header's checksum is checked, sizes must be numbers that fit, a member
// must end within the file, and a member that is not a regular file (a link whose target
// another member or the file system would give, a device, a FIFO) or whose name a tar tool
// would extract outside its folder ("../x.mp4", "/x.mp4") is indexed with the reason it is not
// read, so that its sample is recorded as failed rather than silently dropped. Damage to the
// structure itself (a bad checksum, a truncated tar) leaves the members after it unknown, so it
// refuses the tar rather than guess: the message names the tar, the byte offset and the last
// member read.

namespace {

constexpr int64_t kBlock = kTarBlock;
using Block = std::array<unsigned char, kBlock>;

class TarReader {
 public:
  explicit TarReader(std::filesystem::path tar) : tar_(std::move(tar)) {}
  TarReader(const TarReader&) = delete;
  TarReader& operator=(const TarReader&) = delete;
  ~TarReader() {
    if (fd_ >= 0) ::close(fd_);
  }

  TarIndex read();

 private:
  [[noreturn]] void fail(int64_t at, const std::string& what) const {
    PC_THROW(InputError, "tar ", tar_, ": ", what, " at byte ", at,
             last_.empty() ? std::string(", before its first member")
                           : ", after member '" + printable(last_) + "'",
             "; the tar is damaged: make it again (or download it again), or leave it out of "
             "the input");
  }

  // Reads `size` bytes at `at`; false at the end of the file (or a short read there).
  bool read_at(int64_t at, unsigned char* out, int64_t size) const {
    int64_t done = 0;
    while (done < size) {
      const ssize_t got = ::pread(fd_, out + done, static_cast<size_t>(size - done), at + done);
      if (got < 0 && errno == EINTR) continue;
      PC_CHECK(got >= 0, InputError, "cannot read tar ", tar_, ": ", std::strerror(errno));
      if (got == 0) return false;
      done += got;
    }
    return true;
  }

  std::string read_data(int64_t at, int64_t size, const char* what) {
    // Long names and PAX records are small; a huge one is damage or an attack on memory.
    constexpr int64_t kMaxRecordBytes = 1 << 20;
    if (size > kMaxRecordBytes)
      fail(at, std::string(what) + " of " + std::to_string(size) + " bytes");
    if (size > bytes_ - at) fail(at, std::string("the tar ends inside a ") + what);
    std::string data(static_cast<size_t>(size), '\0');
    if (size > 0 && !read_at(at, reinterpret_cast<unsigned char*>(data.data()), size)) {
      fail(at, std::string("the tar ends inside a ") + what);
    }
    return data;
  }

  static bool all_zero(const Block& block) {
    for (const unsigned char c : block) {
      if (c != 0) return false;
    }
    return true;
  }

  // PAX extended header records: "LENGTH key=value\n", LENGTH counting the whole record.
  void read_pax(const std::string& data, int64_t at, std::optional<std::string>& path,
                std::optional<int64_t>& size) const {
    size_t pos = 0;
    while (pos < data.size()) {
      if (data[pos] == '\0') break;  // padding some writers leave
      size_t space = pos;
      int64_t length = 0;
      while (space < data.size() && data[space] >= '0' && data[space] <= '9' && length < 1 << 21) {
        length = length * 10 + (data[space] - '0');
        ++space;
      }
      if (space == pos || space >= data.size() || data[space] != ' ' || length <= 0 ||
          static_cast<size_t>(length) > data.size() - pos || data[pos + length - 1] != '\n') {
        fail(at, "a malformed PAX extended header");
      }
      const std::string_view record(data.data() + space + 1, pos + length - 1 - (space + 1));
      const size_t equals = record.find('=');
      if (equals == std::string_view::npos) fail(at, "a malformed PAX extended header");
      const std::string_view key = record.substr(0, equals);
      const std::string_view value = record.substr(equals + 1);
      if (key == "path") path = std::string(value);
      if (key == "size") {
        int64_t v = 0;
        bool digits = false;
        for (const char c : value) {
          if (c < '0' || c > '9' || v > (INT64_MAX - 9) / 10)
            fail(at, "a PAX size that is not a number");
          v = v * 10 + (c - '0');
          digits = true;
        }
        if (!digits) fail(at, "a PAX size that is not a number");
        size = v;
      }
      pos += static_cast<size_t>(length);
    }
  }

  static std::string name_refusal(const std::string& name) {
    if (name.find('\0') != std::string::npos) {
      return "its name holds a NUL character, which no file name can";
    }
    if (!name.empty() && name.front() == '/') {
      return "its name is an absolute path, which a tar tool would extract outside its folder; "
             "make the tar with relative names";
    }
    std::string_view rest(name);
    while (!rest.empty()) {
      const size_t slash = rest.find('/');
      if (rest.substr(0, slash) == "..") {
        return "its name climbs out of the tar's folder ('..'), which a tar tool would extract "
               "outside it; make the tar with names inside one folder";
      }
      if (slash == std::string_view::npos) break;
      rest.remove_prefix(slash + 1);
    }
    return {};
  }

  static std::string type_refusal(char type) {
    switch (type) {
      case '1':
        return "a hard link member, not a file; precompute reads only regular members: make "
               "the tar with the file itself (tar --hard-dereference)";
      case '2':
        return "a symbolic link member, not a file; precompute reads only regular members: "
               "make the tar with the file itself (tar --dereference)";
      case '3':
        return "a character device member, not a file";
      case '4':
        return "a block device member, not a file";
      case '6':
        return "a FIFO member, not a file";
      case 'S':
        return "a GNU sparse member, which precompute does not read in place: make the tar "
               "without --sparse";
      default:
        return std::string("a member of tar type '") + printable(std::string(1, type)) +
               "', not a regular file";
    }
  }

  std::filesystem::path tar_;
  int fd_ = -1;
  int64_t bytes_ = 0;
  std::string last_;  // the last member read, for messages
};

TarIndex TarReader::read() {
  fd_ = ::open(tar_.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  PC_CHECK(fd_ >= 0, InputError, "cannot open tar '", printable(tar_.string()),
           "': ", std::strerror(errno), "; check the path in input.tars or --input");
  struct stat info {};
  PC_CHECK(::fstat(fd_, &info) == 0, InputError, "cannot stat tar ", tar_, ": ",
           std::strerror(errno));
  PC_CHECK(S_ISREG(info.st_mode), InputError, "tar ", tar_,
           " is not a regular file; give tar shards as files");
  bytes_ = info.st_size;

  TarIndex index;
  index.tar = tar_;
  index.tar_bytes = bytes_;
  index.modified_ns = int64_t{info.st_mtim.tv_sec} * 1'000'000'000 + info.st_mtim.tv_nsec;
  index.inode = info.st_ino;
  index.device = info.st_dev;
  std::optional<std::string> long_name;  // from a GNU 'L' or PAX 'x' record, for the next member
  std::optional<int64_t> long_size;      // from a PAX 'x' record
  int64_t at = 0;
  Block block{};
  while (at < bytes_) {
    if (bytes_ - at < kBlock || !read_at(at, block.data(), kBlock)) {
      fail(at, "the tar ends inside a header (it is truncated)");
    }
    // End of archive: a zero block (two by the standard; one is what some writers leave).
    if (all_zero(block)) break;
    if (!tar_checksum_ok(block.data())) fail(at, "a header whose checksum is wrong");
    const auto size_field = tar_number(block.data(), 124, 12);
    if (!size_field) fail(at, "a header whose size field is not a number");
    const char type = static_cast<char>(block[156]);
    const int64_t data_at = at + kBlock;
    const int64_t size =
        (type == '0' || type == '\0' || type == '7') && long_size ? *long_size : *size_field;
    if (size > bytes_ - data_at) {
      fail(at, "the tar ends inside the data of member '" +
                   printable(tar_field(block.data(), 0, 100)) + "' (it is truncated)");
    }
    const int64_t next = data_at + (size + kBlock - 1) / kBlock * kBlock;

    if (type == 'L') {  // GNU long name for the next header
      std::string data = read_data(data_at, size, "GNU long-name record");
      data.resize(strnlen(data.c_str(), data.size()));
      long_name = std::move(data);
      at = next;
      continue;
    }
    if (type == 'x') {  // PAX extended header for the next header
      read_pax(read_data(data_at, size, "PAX extended header"), at, long_name, long_size);
      at = next;
      continue;
    }
    if (type == 'g' || type == 'K' || type == 'V') {  // global PAX, GNU long link, volume label
      at = next;
      continue;
    }

    std::string name;
    if (long_name) {
      name = std::move(*long_name);
    } else {
      name = tar_header_name(block.data());
    }
    long_name.reset();
    long_size.reset();
    while (name.size() > 2 && name.compare(0, 2, "./") == 0) name.erase(0, 2);
    last_ = name;
    if (type == '5' || (!name.empty() && name.back() == '/')) {  // a folder
      at = next;
      continue;
    }
    TarMember member{name, data_at, size, {}};
    if (type != '0' && type != '\0' && type != '7') member.refusal = type_refusal(type);
    if (member.refusal.empty()) member.refusal = name_refusal(name);
    index.members.push_back(std::move(member));
    at = next;
  }
  if (long_name || long_size) fail(at, "a long-name or PAX record with no member after it");
  return index;
}

}  // namespace

TarIndex index_tar(const std::filesystem::path& tar) { return TarReader(tar).read(); }

MemberKey member_key(const std::string& name) {
  const size_t slash = name.rfind('/');
  const size_t base = slash == std::string::npos ? 0 : slash + 1;
  const size_t dot = name.find('.', base);
  if (dot == std::string::npos) return {name, ""};
  return {name.substr(0, dot), name.substr(dot + 1)};
}

}  // namespace precompute
