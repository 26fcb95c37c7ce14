#include "pipeline/core/tar_header.hpp"

#include <algorithm>
#include <cstring>

namespace precompute {

// Note [A member's header is read again before its bytes]
// A member is read by its byte range, found when the input was read; a run may decode it hours
// later, and a tar rewritten in between (a dataset sync replacing shards, a shard made again)
// can still be long enough for the range while other bytes sit there. So opening a member reads
// the 512-byte header just before its data again and checks it: a valid checksum, a regular
// member, its size and, where the header holds the whole name, its name. Anything else fails the
// sample as unreadable, naming the tar, instead of decoding another member's bytes. The header
// sits next to the data the decoder reads at once, so the check costs no seek of its own.

std::optional<int64_t> tar_number(const unsigned char* block, size_t from, size_t length) {
  const unsigned char* p = block + from;
  if ((p[0] & 0x80) != 0) {
    if ((p[0] & 0x40) != 0) return std::nullopt;  // negative
    uint64_t value = p[0] & 0x3f;
    for (size_t i = 1; i < length; ++i) {
      if (value > (uint64_t{INT64_MAX} >> 8)) return std::nullopt;
      value = (value << 8) | p[i];
    }
    return static_cast<int64_t>(value);
  }
  size_t i = 0;
  while (i < length && p[i] == ' ') ++i;
  int64_t value = 0;
  bool digits = false;
  for (; i < length && p[i] >= '0' && p[i] <= '7'; ++i) {
    if (value > (INT64_MAX >> 3)) return std::nullopt;
    value = value * 8 + (p[i] - '0');
    digits = true;
  }
  for (; i < length; ++i) {
    if (p[i] != ' ' && p[i] != 0) return std::nullopt;
  }
  if (!digits) return std::nullopt;
  return value;
}

bool tar_checksum_ok(const unsigned char* block) {
  const auto stored = tar_number(block, 148, 8);
  if (!stored) return false;
  // The sum with the checksum field read as spaces.
  int64_t unsigned_sum = 0;
  int64_t signed_sum = 0;
  for (size_t i = 0; i < static_cast<size_t>(kTarBlock); ++i) {
    const unsigned char c = (i >= 148 && i < 156) ? ' ' : block[i];
    unsigned_sum += c;
    signed_sum += static_cast<signed char>(c);
  }
  return *stored == unsigned_sum || *stored == signed_sum;
}

std::string tar_field(const unsigned char* block, size_t from, size_t length) {
  const auto* begin = reinterpret_cast<const char*>(block) + from;
  return std::string(begin, strnlen(begin, length));
}

std::string tar_header_name(const unsigned char* block) {
  std::string name = tar_field(block, 0, 100);
  // POSIX ustar splits long names into a prefix and a name; GNU tar uses those bytes for other
  // things and marks its headers "ustar  ".
  if (std::memcmp(block + 257, "ustar\0", 6) == 0) {
    const std::string prefix = tar_field(block, 345, 155);
    if (!prefix.empty()) name = prefix + "/" + name;
  }
  while (name.size() > 2 && name.compare(0, 2, "./") == 0) name.erase(0, 2);
  return name;
}

std::string member_header_mismatch(const unsigned char* block, std::string_view name,
                                   int64_t size) {
  if (!tar_checksum_ok(block)) return "no valid tar header precedes its bytes";
  const char type = static_cast<char>(block[156]);
  if (type != '0' && type != '\0' && type != '7') {
    return "the header before its bytes is not a regular member's";
  }
  // The largest size the 11 octal digits of a ustar size field hold; a larger member's size is
  // in a PAX record.
  constexpr int64_t kLargestOctalSize = (int64_t{1} << 33) - 1;
  const auto stored = tar_number(block, 124, 12);
  if (size <= kLargestOctalSize && stored != size) {
    return "the header before its bytes gives another size";
  }
  // A name longer than the name field, or one that is not ASCII, may be held by a PAX or GNU
  // record, with whatever its writer cut or replaced in the header (Python's tarfile writes "?"
  // for each non-ASCII character there).
  const bool ascii = std::all_of(name.begin(), name.end(),
                                 [](char c) { return static_cast<unsigned char>(c) < 0x80; });
  if (ascii && name.size() <= 100 && tar_header_name(block) != name) {
    return "the header before its bytes names another member";
  }
  return {};
}

}  // namespace precompute
