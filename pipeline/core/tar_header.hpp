#pragma once
// One 512-byte tar header, read as the tar index reads it (Note [Tar members read in place] in
// pipeline/input/tar_index.cpp), and the check that a member's bytes are still where the index
// found them (Note [A member's header is read again before its bytes]).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace precompute {

inline constexpr int64_t kTarBlock = 512;

// A numeric field: octal digits (space or NUL padded), or GNU's base-256 form for values that
// octal cannot hold (first byte's high bit set); nullopt when it is neither, or negative.
std::optional<int64_t> tar_number(const unsigned char* block, size_t from, size_t length);

// Whether the checksum field matches the header's bytes (summed as unsigned or, as some old
// tools did, as signed chars).
bool tar_checksum_ok(const unsigned char* block);

// The text of a NUL-padded field.
std::string tar_field(const unsigned char* block, size_t from, size_t length);

// The name a header holds itself: its name field, behind POSIX ustar's prefix field when the
// header is POSIX ustar, with leading "./" removed. A PAX or GNU long name is in a record
// before the header, not here.
std::string tar_header_name(const unsigned char* block);

// Why `block` is not the header of the regular member `name` of `size` bytes; "" when it is.
// A name longer than the name field or not ASCII (which a PAX or GNU record may hold, the
// header a cut or replaced form) is not compared, nor a size beyond what the octal field holds
// (held by a PAX record).
std::string member_header_mismatch(const unsigned char* block, std::string_view name, int64_t size);

}  // namespace precompute
