#include "encoders/text/precompiled_charsmap.hpp"

#include <utf8proc.h>


#include "encoders/text/utf8_text.hpp"
#include "pipeline/core/error.hpp"

// Note [How Precompiled normalises]
// The reference is what transformers' XLM-R tokenizer does, which is the `tokenizers` library's
// Precompiled normalizer (checked string by string in tests/python/test_unigram_parity.py):
//  - the text is cut into extended grapheme clusters;
//  - a cluster of fewer than 6 bytes is looked up whole: when some source string of the charsmap
//    is a prefix of it, the SHORTEST such string's replacement stands for the whole cluster
//    (whatever follows that prefix in the cluster is dropped);
//  - otherwise (no match, or 6 bytes and more) each character is looked up alone, the same way,
//    and kept as it is when nothing matches.
// SentencePiece's own normaliser differs (longest match over the byte stream, no clusters), so
// the sentencepiece library tokenizes some strings otherwise; transformers is what users run.
// A lookup stops at a NUL byte, and a replacement that is not valid UTF-8 counts as no match.

namespace precompute {
namespace {

// darts-clone's unit layout.
bool has_leaf(uint32_t unit) { return ((unit >> 8) & 1) != 0; }
uint32_t value(uint32_t unit) { return unit & ((1U << 31) - 1); }
uint32_t label(uint32_t unit) { return unit & ((1U << 31) | 0xFF); }
uint32_t offset(uint32_t unit) { return (unit >> 10) << ((unit & (1U << 9)) >> 6); }

}  // namespace

PrecompiledCharsmap::PrecompiledCharsmap(std::string_view blob, const std::string& source) {
  PC_CHECK(blob.size() >= 4, ModelError, source,
           ": precompiled_charsmap is too short to be a SentencePiece charsmap (", blob.size(),
           " bytes)");
  uint32_t trie_bytes = 0;
  for (int i = 3; i >= 0; --i) trie_bytes = (trie_bytes << 8) | static_cast<unsigned char>(blob[i]);
  PC_CHECK(trie_bytes % 4 == 0 && trie_bytes >= 4 && trie_bytes <= blob.size() - 4, ModelError,
           source, ": precompiled_charsmap is damaged (its trie of ", trie_bytes,
           " bytes does not fit its ", blob.size(), " bytes)");
  units_.resize(trie_bytes / 4);
  for (size_t i = 0; i < units_.size(); ++i) {
    const auto* p = reinterpret_cast<const unsigned char*>(blob.data()) + 4 + 4 * i;
    units_[i] = static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
                (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
  }
  replacements_.assign(blob.substr(4 + trie_bytes));
}

std::optional<std::string_view> PrecompiledCharsmap::transform(std::string_view chunk) const {
  size_t node = offset(units_[0]);
  for (const char byte : chunk) {
    const auto c = static_cast<unsigned char>(byte);
    if (c == 0) break;
    node ^= c;
    if (node >= units_.size()) return std::nullopt;  // only in a damaged charsmap
    const uint32_t unit = units_[node];
    if (label(unit) != c) return std::nullopt;
    node ^= offset(unit);
    if (node >= units_.size()) return std::nullopt;
    if (!has_leaf(unit)) continue;
    const size_t at = value(units_[node]);
    if (at >= replacements_.size()) return std::nullopt;
    const size_t stop = replacements_.find('\0', at);
    const std::string_view replacement = std::string_view(replacements_).substr(
        at, stop == std::string::npos ? std::string::npos : stop - at);
    if (count_invalid_utf8(replacement) != 0) return std::nullopt;
    return replacement;
  }
  return std::nullopt;
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  const auto* data = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = data + text.size();
  const auto flush = [&](size_t begin, size_t stop) {
    const std::string_view cluster = text.substr(begin, stop - begin);
    if (cluster.size() < 6) {
      if (auto replacement = transform(cluster)) {
        out.append(*replacement);
        return;
      }
    }
    size_t i = begin;
    while (i < stop) {
      size_t next = i + 1;
      while (next < stop && is_utf8_continuation(text[next])) ++next;
      const std::string_view character = text.substr(i, next - i);
      if (auto replacement = transform(character)) {
        out.append(*replacement);
      } else {
        out.append(character);
      }
      i = next;
    }
  };
  size_t cluster_start = 0;
  utf8proc_int32_t state = 0;
  utf8proc_int32_t previous = -1;
  const auto* p = data;
  while (p < end) {
    char32_t c;
    size_t invalid;
    const size_t at = static_cast<size_t>(p - data);
    p += decode_utf8(p, end, &c, &invalid);
    if (previous >= 0 &&
        utf8proc_grapheme_break_stateful(previous, static_cast<utf8proc_int32_t>(c), &state)) {
      flush(cluster_start, at);
      cluster_start = at;
    }
    previous = static_cast<utf8proc_int32_t>(c);
  }
  if (!text.empty()) flush(cluster_start, text.size());
  return out;
}

std::optional<std::string> decode_base64(std::string_view text) {
  const auto sextet = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
  };
  while (!text.empty() && text.back() == '=') text.remove_suffix(1);
  if (text.size() % 4 == 1) return std::nullopt;
  std::string out;
  out.reserve(text.size() / 4 * 3 + 2);
  uint32_t bits = 0;
  int count = 0;
  for (const char c : text) {
    const int v = sextet(c);
    if (v < 0) return std::nullopt;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out.push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return out;
}

}  // namespace precompute
