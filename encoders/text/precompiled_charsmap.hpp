#pragma once
// SentencePiece's normalisation rules ("precompiled_charsmap": a double-array trie of source
// strings and a pool of their replacements), applied as the `tokenizers` library's Precompiled
// normalizer applies them, grapheme by grapheme (Note [How Precompiled normalises], .cpp).
// Immutable after construction; normalize() may run on many threads at once.

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace precompute {

class PrecompiledCharsmap {
 public:
  // `blob` is the charsmap's bytes (base64-decoded from tokenizer.json). Throws ModelError
  // naming `source` when its layout is not a charsmap's.
  PrecompiledCharsmap(std::string_view blob, const std::string& source);

  // `text` (valid UTF-8) normalised.
  std::string normalize(std::string_view text) const;

  // The replacement of the shortest source string that starts `chunk`, if any.
  std::optional<std::string_view> transform(std::string_view chunk) const;

 private:
  std::vector<uint32_t> units_;  // the double array
  std::string replacements_;     // NUL-terminated replacement strings
};

// Decodes standard base64 (with or without padding); nullopt when `text` is not base64.
std::optional<std::string> decode_base64(std::string_view text);

}  // namespace precompute
