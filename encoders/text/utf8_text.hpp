#pragma once
// UTF-8 as the tokenizers read it: decoding with Python's replacement of ill-formed bytes, and
// the White_Space test both Hugging Face pre-tokenizers split at. Shared by the WordPiece and
// Unigram tokenizers; free functions without state, safe from any thread.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace precompute {

inline constexpr char32_t kReplacementCharacter = 0xFFFD;

inline bool is_utf8_continuation(char byte) {
  return (static_cast<unsigned char>(byte) & 0xC0) == 0x80;
}

// Appends the UTF-8 bytes of the code point c.
void append_utf8(std::string& out, char32_t c);

// Decodes the code point at p[0], p < end, into *c and returns the bytes it takes; an ill-formed
// sequence is one U+FFFD per maximal subpart, *invalid the bytes it replaced (Note [Invalid
// UTF-8], utf8_text.cpp).
size_t decode_utf8(const unsigned char* p, const unsigned char* end, char32_t* c, size_t* invalid);

// The bytes of `text` that are not well-formed UTF-8.
int64_t count_invalid_utf8(std::string_view text);

// `text` with each ill-formed part replaced by U+FFFD, as Python's
// bytes.decode("utf-8", "replace"); *invalid_bytes (when given) is set to the bytes replaced.
std::string valid_utf8(std::string_view text, int64_t* invalid_bytes);

// The White_Space property (Rust's char::is_whitespace), TAB, LF, VT, FF and CR included.
bool is_white_space(char32_t c);

}  // namespace precompute
