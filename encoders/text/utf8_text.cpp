#include "encoders/text/utf8_text.hpp"

#include <utf8proc.h>

namespace precompute {

void append_utf8(std::string& out, char32_t c) {
  char buffer[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(c),
                                      reinterpret_cast<utf8proc_uint8_t*>(buffer));
  out.append(buffer, static_cast<size_t>(n));
}

// Note [Invalid UTF-8]
// Decodes the code point at p[0], p < end, into *c, and returns the number of bytes it takes.
// An ill-formed sequence becomes one U+FFFD per maximal subpart (Unicode 15.0 section 3.9,
// "U+FFFD Substitution of Maximal Subparts", which the WHATWG Encoding Standard and Python's
// bytes.decode("utf-8", "replace") follow): a lead byte followed by as many continuation bytes as
// are valid at that point, or else a single byte. *invalid is set to the bytes replaced.
size_t decode_utf8(const unsigned char* p, const unsigned char* end, char32_t* c, size_t* invalid) {
  const unsigned char lead = p[0];
  *invalid = 0;
  if (lead < 0x80) {
    *c = lead;
    return 1;
  }
  size_t needed;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  char32_t value;
  if (lead >= 0xC2 && lead <= 0xDF) {
    needed = 1;
    value = lead & 0x1F;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    needed = 2;
    value = lead & 0x0F;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    needed = 3;
    value = lead & 0x07;
    if (lead == 0xF0) low = 0x90;   // no overlong forms
    if (lead == 0xF4) high = 0x8F;  // nothing above U+10FFFF
  } else {
    *c = kReplacementCharacter;
    *invalid = 1;
    return 1;
  }
  const auto available = static_cast<size_t>(end - p);
  for (size_t i = 1; i <= needed; ++i) {
    if (i >= available || p[i] < low || p[i] > high) {
      *c = kReplacementCharacter;
      *invalid = i;
      return i;
    }
    value = (value << 6) | (p[i] & 0x3F);
    low = 0x80;
    high = 0xBF;
  }
  *c = value;
  return needed + 1;
}

int64_t count_invalid_utf8(std::string_view text) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  int64_t invalid_bytes = 0;
  while (p < end) {
    if (*p < 0x80) {
      ++p;
      continue;
    }
    char32_t c;
    size_t invalid;
    p += decode_utf8(p, end, &c, &invalid);
    invalid_bytes += static_cast<int64_t>(invalid);
  }
  return invalid_bytes;
}

std::string valid_utf8(std::string_view text, int64_t* invalid_bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  int64_t replaced = 0;
  std::string out;
  out.reserve(text.size());
  while (p < end) {
    if (*p < 0x80) {
      out.push_back(static_cast<char>(*p++));
      continue;
    }
    const auto* start = p;
    char32_t c;
    size_t invalid;
    p += decode_utf8(p, end, &c, &invalid);
    if (invalid == 0) {
      out.append(reinterpret_cast<const char*>(start), static_cast<size_t>(p - start));
    } else {
      append_utf8(out, c);
      replaced += static_cast<int64_t>(invalid);
    }
  }
  if (invalid_bytes != nullptr) *invalid_bytes = replaced;
  return out;
}

bool is_white_space(char32_t c) {
  if (c < 0x80) return c == ' ' || (c >= 0x09 && c <= 0x0D);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

}  // namespace precompute
