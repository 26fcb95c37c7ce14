#include "encoders/text/wordpiece_tokenizer.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <span>

#include "encoders/text/utf8_text.hpp"
#include "pipeline/core/error.hpp"

// Note [What BertTokenizerFast does]
// The reference is the `tokenizers` library (0.23) behind transformers' BertTokenizerFast, as
// configured by BERT's tokenizer.json. Every step below was checked against it by experiment,
// code point by code point (tests/python/test_tokenizer_parity.py keeps checking it):
//  0. Special tokens ([CLS], [SEP], [PAD], [UNK], [MASK]) written in the raw text are matched
//     first, case-sensitively, anywhere (even inside a word: "a[SEP]b" is a, [SEP], b). The text
//     between them is normalised and split on its own.
//  1. clean_text: drop U+0000, U+FFFD and "control" characters (general category Cc, Cf or Co,
//     except TAB, LF and CR; Cn is kept); map White_Space characters and TAB/LF/CR to a space.
//     VT, FF and NEL are Cc, so they are dropped, not turned into spaces.
//  2. handle_chinese_chars: put spaces around the ideographs of kCjkIdeographs (the library's own
//     list, which differs from Python BERT's: it skips U+2B820..U+2B91F and Extension G).
//  3. strip_accents (when asked, or unset and lower-casing): canonical decomposition (NFD, with
//     canonical reordering of combining marks), then drop nonspacing marks (Mn).
//  4. lowercase: each character's full lower-case mapping, without context (so U+0130 becomes
//     "i" + U+0307, and a final capital sigma becomes U+03C3, not U+03C2).
//  5. Pre-tokenize: split at White_Space, and make every punctuation character (ASCII
//     punctuation, which includes $+<=>^`|~, or general category P*) a word of its own.
//  6. WordPiece per word: a word of more than max_chars_per_word code points is [UNK]; otherwise
//     greedy longest match from the left, "##" before pieces that do not start the word; a word
//     with a position where nothing matches is one [UNK].
//  7. [CLS] + ids + [SEP], ids cut so that the total is at most max_length.
//
// Note [Matching tokenizers' Unicode versions]
// utf8proc 2.8 carries Unicode 15.0. The library does not use one Unicode version:
//  - its categories (control, punctuation, nonspacing mark) come from the `unicode_categories`
//    crate, Unicode 8.0;
//  - its NFD (`unicode-normalization-alignments`) is Unicode 9.0: it neither decomposes U+11938
//    (new in 13.0) nor knows the combining class of marks added after 9.0 (it treats them as
//    starters, so they block reordering);
//  - lower-casing and White_Space come from Rust's standard library, Unicode 17.0 for the build
//    we compared against.
// So we take utf8proc's data and correct it with the tables below, found by comparing the two on
// every code point: characters that are Cf, P* or Mn in Unicode 15.0 but were added (or moved
// into that category) after Unicode 8.0, the marks whose combining class the Unicode 9.0 tables
// lack, three characters whose category changed (U+166D Po -> So, U+111C9 Po -> Mn, U+1734
// Mn -> Mc), and the case pairs of Unicode 16.0 and 17.0. Characters that Unicode 15.0 does not
// assign at all are Cn to both sides (kept, no case, no decomposition), except for those case
// pairs. A library upgrade that changes any of this shows up in the code point test.

namespace precompute {
namespace {

struct CodeRange {
  char32_t first;
  char32_t last;
};

bool in_ranges(std::span<const CodeRange> ranges, char32_t c) {
  auto it = std::upper_bound(ranges.begin(), ranges.end(), c,
                             [](char32_t v, const CodeRange& r) { return v < r.first; });
  return it != ranges.begin() && c <= std::prev(it)->last;
}

// Step 2: the ideograph blocks that tokenizers' BertNormalizer surrounds with spaces.
constexpr CodeRange kCjkIdeographs[] = {
    {0x3400, 0x4DBF},   {0x4E00, 0x9FFF},   {0xF900, 0xFAFF},   {0x20000, 0x2A6DF},
    {0x2A700, 0x2B73F}, {0x2B740, 0x2B81F}, {0x2B920, 0x2CEAF}, {0x2F800, 0x2FA1F},
};

// Cf characters of Unicode 15.0 that Unicode 8.0 did not have: not control for tokenizers.
constexpr CodeRange kFormatAfterUnicode8[] = {
    {0x0890, 0x0891},
    {0x08E2, 0x08E2},
    {0x110CD, 0x110CD},
    {0x13430, 0x1343F},
};

// P* characters of Unicode 15.0 that Unicode 8.0 did not have (or had in another category).
constexpr CodeRange kPunctuationAfterUnicode8[] = {
    {0x061D, 0x061D},   {0x09FD, 0x09FD},   {0x0A76, 0x0A76},   {0x0C77, 0x0C77},
    {0x0C84, 0x0C84},   {0x1B7D, 0x1B7E},   {0x2E43, 0x2E4F},   {0x2E52, 0x2E5D},
    {0x10EAD, 0x10EAD}, {0x10F55, 0x10F59}, {0x10F86, 0x10F89}, {0x1144B, 0x1144F},
    {0x1145A, 0x1145B}, {0x1145D, 0x1145D}, {0x11660, 0x1166C}, {0x116B9, 0x116B9},
    {0x1183B, 0x1183B}, {0x11944, 0x11946}, {0x119E2, 0x119E2}, {0x11A3F, 0x11A46},
    {0x11A9A, 0x11A9C}, {0x11A9E, 0x11AA2}, {0x11B00, 0x11B09}, {0x11C41, 0x11C45},
    {0x11C70, 0x11C71}, {0x11EF7, 0x11EF8}, {0x11F43, 0x11F4F}, {0x11FFF, 0x11FFF},
    {0x12FF1, 0x12FF2}, {0x16E97, 0x16E9A}, {0x16FE2, 0x16FE2}, {0x1E95E, 0x1E95F},
};

// Mn characters of Unicode 15.0 that Unicode 8.0 did not have (or had in another category):
// strip_accents keeps them.
constexpr CodeRange kNonspacingAfterUnicode8[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08E1},   {0x09FE, 0x09FE},
    {0x0AFA, 0x0AFF},   {0x0B55, 0x0B55},   {0x0C04, 0x0C04},   {0x0C3C, 0x0C3C},
    {0x0D00, 0x0D00},   {0x0D3B, 0x0D3C},   {0x0D81, 0x0D81},   {0x0EBA, 0x0EBA},
    {0x0ECE, 0x0ECE},   {0x180F, 0x180F},   {0x1885, 0x1886},   {0x1ABF, 0x1ACE},
    {0x1DF6, 0x1DFB},   {0xA82C, 0xA82C},   {0xA8C5, 0xA8C5},   {0xA8FF, 0xA8FF},
    {0xA9BD, 0xA9BD},   {0x10D24, 0x10D27}, {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF},
    {0x10F46, 0x10F50}, {0x10F82, 0x10F85}, {0x11070, 0x11070}, {0x11073, 0x11074},
    {0x110C2, 0x110C2}, {0x111C9, 0x111C9}, {0x111CF, 0x111CF}, {0x1123E, 0x1123E},
    {0x11241, 0x11241}, {0x1133B, 0x1133B}, {0x11438, 0x1143F}, {0x11442, 0x11444},
    {0x11446, 0x11446}, {0x1145E, 0x1145E}, {0x1182F, 0x11837}, {0x11839, 0x1183A},
    {0x1193B, 0x1193C}, {0x1193E, 0x1193E}, {0x11943, 0x11943}, {0x119D4, 0x119D7},
    {0x119DA, 0x119DB}, {0x119E0, 0x119E0}, {0x11A01, 0x11A0A}, {0x11A33, 0x11A38},
    {0x11A3B, 0x11A3E}, {0x11A47, 0x11A47}, {0x11A51, 0x11A56}, {0x11A59, 0x11A5B},
    {0x11A8A, 0x11A96}, {0x11A98, 0x11A99}, {0x11C30, 0x11C36}, {0x11C38, 0x11C3D},
    {0x11C3F, 0x11C3F}, {0x11C92, 0x11CA7}, {0x11CAA, 0x11CB0}, {0x11CB2, 0x11CB3},
    {0x11CB5, 0x11CB6}, {0x11D31, 0x11D36}, {0x11D3A, 0x11D3A}, {0x11D3C, 0x11D3D},
    {0x11D3F, 0x11D45}, {0x11D47, 0x11D47}, {0x11D90, 0x11D91}, {0x11D95, 0x11D95},
    {0x11D97, 0x11D97}, {0x11EF3, 0x11EF4}, {0x11F00, 0x11F01}, {0x11F36, 0x11F3A},
    {0x11F40, 0x11F40}, {0x11F42, 0x11F42}, {0x13440, 0x13440}, {0x13447, 0x13455},
    {0x16F4F, 0x16F4F}, {0x16FE4, 0x16FE4}, {0x1CF00, 0x1CF2D}, {0x1CF30, 0x1CF46},
    {0x1E000, 0x1E006}, {0x1E008, 0x1E018}, {0x1E01B, 0x1E021}, {0x1E023, 0x1E024},
    {0x1E026, 0x1E02A}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
    {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF}, {0x1E944, 0x1E94A},
};

// Characters with a non-zero canonical combining class in Unicode 15.0 that the library's
// Unicode 9.0 NFD treats as starters (class 0). Only those that strip_accents keeps matter.
constexpr CodeRange kCombiningClassAfterUnicode9[] = {
    {0x07FD, 0x07FD},   {0x0898, 0x089F},   {0x08CA, 0x08D3},   {0x09FE, 0x09FE},
    {0x0C3C, 0x0C3C},   {0x0D3B, 0x0D3C},   {0x0EBA, 0x0EBA},   {0x1715, 0x1715},
    {0x1ABF, 0x1ACE},   {0x1DF6, 0x1DFA},   {0xA82C, 0xA82C},   {0x10D24, 0x10D27},
    {0x10EAB, 0x10EAC}, {0x10EFD, 0x10EFF}, {0x10F46, 0x10F50}, {0x10F82, 0x10F85},
    {0x11070, 0x11070}, {0x1133B, 0x1133B}, {0x1145E, 0x1145E}, {0x11839, 0x1183A},
    {0x1193D, 0x11943}, {0x119E0, 0x119E0}, {0x11A34, 0x11A34}, {0x11A47, 0x11A47},
    {0x11A99, 0x11A99}, {0x11D42, 0x11D45}, {0x11D97, 0x11D97}, {0x11F41, 0x11F42},
    {0x16FF0, 0x16FF1}, {0x1E08F, 0x1E08F}, {0x1E130, 0x1E136}, {0x1E2AE, 0x1E2AE},
    {0x1E2EC, 0x1E2EF}, {0x1E4EC, 0x1E4EF},
};

// Simple lower-case mappings added in Unicode 16.0 and 17.0 (utf8proc 2.8 has none of them).
struct CaseRange {
  char32_t first;
  char32_t last;
  char32_t lower_of_first;  // the mapping of `first`; the others follow in step
};
constexpr CaseRange kLowerAfterUnicode15[] = {
    {0x1C89, 0x1C89, 0x1C8A},    {0xA7CB, 0xA7CB, 0x0264}, {0xA7CC, 0xA7CC, 0xA7CD},
    {0xA7CE, 0xA7CE, 0xA7CF},    {0xA7D2, 0xA7D2, 0xA7D3}, {0xA7D4, 0xA7D4, 0xA7D5},
    {0xA7DA, 0xA7DA, 0xA7DB},    {0xA7DC, 0xA7DC, 0x019B}, {0x10D50, 0x10D65, 0x10D70},
    {0x16EA0, 0x16EB8, 0x16EBB},
};

constexpr char32_t kReplacement = 0xFFFD;
constexpr char32_t kCapitalIWithDot = 0x0130;  // lower-cases to "i" + U+0307
constexpr char32_t kCombiningDotAbove = 0x0307;
constexpr char32_t kNotDecomposedByUnicode9 = 0x11938;  // DIVES AKURU VOWEL SIGN O (13.0)

// What the pipeline does with an ASCII character after clean-up.
enum class Ascii : uint8_t { kDrop, kSpace, kPunctuation, kOther };

constexpr std::array<Ascii, 128> make_ascii_classes() {
  std::array<Ascii, 128> classes{};
  for (int c = 0; c < 128; ++c) {
    if (c == '\t' || c == '\n' || c == '\r' || c == ' ') {
      classes[c] = Ascii::kSpace;
    } else if (c < 0x20 || c == 0x7F) {
      classes[c] = Ascii::kDrop;  // NUL, VT, FF and the other C0 controls, DEL
    } else if ((c >= '!' && c <= '/') || (c >= ':' && c <= '@') || (c >= '[' && c <= '`') ||
               (c >= '{' && c <= '~')) {
      classes[c] = Ascii::kPunctuation;
    } else {
      classes[c] = Ascii::kOther;
    }
  }
  return classes;
}
constexpr std::array<Ascii, 128> kAsciiClasses = make_ascii_classes();

char ascii_lower(char c) { return (c >= 'A' && c <= 'Z') ? static_cast<char>(c + 32) : c; }

utf8proc_category_t category(char32_t c) {
  return static_cast<utf8proc_category_t>(utf8proc_category(static_cast<utf8proc_int32_t>(c)));
}

// Rust's char::is_whitespace (the White_Space property), which includes TAB, LF and CR.
bool is_whitespace(char32_t c) {
  if (c < 0x80) return kAsciiClasses[c] == Ascii::kSpace || c == 0x0B || c == 0x0C;
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Step 1's "control": Cc, Cf or Co of Unicode 8.0, TAB, LF and CR excepted.
bool is_control(char32_t c) {
  if (c < 0x80) return kAsciiClasses[c] == Ascii::kDrop;
  switch (category(c)) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CO:
      return true;
    case UTF8PROC_CATEGORY_CF:
      return !in_ranges(kFormatAfterUnicode8, c);
    default:
      return false;
  }
}

bool is_cjk_ideograph(char32_t c) { return c >= 0x3400 && in_ranges(kCjkIdeographs, c); }

// Step 5's punctuation, for non-ASCII characters: P* of Unicode 8.0.
bool is_punctuation(char32_t c) {
  switch (category(c)) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return !in_ranges(kPunctuationAfterUnicode8, c);
    default:
      return c == 0x166D || c == 0x111C9;  // Po in Unicode 8.0
  }
}

// Step 3's nonspacing marks: Mn of Unicode 8.0.
bool is_stripped_mark(char32_t c) {
  if (category(c) == UTF8PROC_CATEGORY_MN) return !in_ranges(kNonspacingAfterUnicode8, c);
  return c == 0x1734;  // Mn in Unicode 8.0, Mc since 14.0
}

// The canonical combining class as a Unicode 9.0 NFD sees it.
uint8_t combining_class(char32_t c) {
  const auto cc = utf8proc_get_property(static_cast<utf8proc_int32_t>(c))->combining_class;
  if (cc == 0 || in_ranges(kCombiningClassAfterUnicode9, c)) return 0;
  return static_cast<uint8_t>(cc);
}

// Simple lower-case mapping of Unicode 17.0 (U+0130, the one full mapping of more than one
// character, is handled by the caller).
char32_t to_lower(char32_t c) {
  const auto lower = static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c)));
  if (lower != c || c < 0x1C89) return lower;
  auto it = std::upper_bound(std::begin(kLowerAfterUnicode15), std::end(kLowerAfterUnicode15), c,
                             [](char32_t v, const CaseRange& r) { return v < r.first; });
  if (it == std::begin(kLowerAfterUnicode15)) return c;
  --it;
  return c <= it->last ? it->lower_of_first + (c - it->first) : c;
}

// splitmix64's finaliser: a good spread of bits for an open-addressing table.
uint64_t mix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

uint64_t hash_bytes(std::string_view key) {
  uint64_t h = 0x9E3779B97F4A7C15ULL ^ key.size();
  const char* p = key.data();
  size_t n = key.size();
  while (n >= 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    h = mix(h ^ word);
    p += 8;
    n -= 8;
  }
  uint64_t tail = 0;
  if (n > 0) std::memcpy(&tail, p, n);
  return mix(h ^ tail ^ 0xA5A5A5A5ULL);
}

// Per-thread buffers, so that encode() allocates nothing but its result once warm.
struct Scratch {
  std::string word;                                 // the current word, normalised, UTF-8
  std::vector<std::pair<uint8_t, char32_t>> marks;  // combining marks awaiting reordering
};

}  // namespace

// ---------------------------------------------------------------------------------------------
// TokenTable

void WordPieceTokenizer::TokenTable::build(
    const std::vector<std::pair<std::string_view, int32_t>>& entries) {
  bytes_.clear();
  max_key_bytes_ = 0;
  size_t capacity = 16;
  while (capacity < entries.size() * 2) capacity *= 2;
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  for (const auto& [key, id] : entries) {
    PC_ASSERT(!key.empty() && id >= 0);
    PC_ASSERT(bytes_.size() + key.size() <= std::numeric_limits<uint32_t>::max(),
              "vocabulary over 4 GiB");
    const uint64_t h = hash_bytes(key);
    const auto h32 = static_cast<uint32_t>(h >> 32);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      Slot& slot = slots_[i];
      if (slot.id < 0) {
        slot =
            Slot{h32, static_cast<uint32_t>(bytes_.size()), static_cast<uint32_t>(key.size()), id};
        bytes_.append(key);
        break;
      }
      if (slot.hash == h32 && std::string_view(bytes_).substr(slot.offset, slot.length) == key) {
        slot.id = id;  // a repeated token: the later line wins, as in tokenizers
        break;
      }
    }
    max_key_bytes_ = std::max(max_key_bytes_, key.size());
  }
}

int32_t WordPieceTokenizer::TokenTable::find(std::string_view key) const {
  if (slots_.empty()) return -1;
  const uint64_t h = hash_bytes(key);
  const auto h32 = static_cast<uint32_t>(h >> 32);
  for (size_t i = h & mask_;; i = (i + 1) & mask_) {
    const Slot& slot = slots_[i];
    if (slot.id < 0) return -1;
    if (slot.hash == h32 && slot.length == key.size() &&
        std::memcmp(bytes_.data() + slot.offset, key.data(), key.size()) == 0) {
      return slot.id;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Pass: one text through steps 0-7 of Note [What BertTokenizerFast does]. Each step hands its
// characters to the next one by a call, so no intermediate string is built.

class WordPieceTokenizer::Pass {
 public:
  Pass(const WordPieceTokenizer& tokenizer, std::string_view text, std::vector<int32_t>& out,
       size_t limit, Scratch& scratch)
      : t_(tokenizer),
        text_(text),
        out_(out),
        limit_(limit),
        word_(scratch.word),
        marks_(scratch.marks),
        strip_(tokenizer.strip_accents_),
        lower_(tokenizer.options_.lower_case),
        chinese_(tokenizer.options_.tokenize_chinese_chars),
        max_word_chars_(static_cast<size_t>(tokenizer.options_.max_chars_per_word)) {
    word_.clear();
    marks_.clear();
  }

  // Returns false when the limit cut the ids short. Sets *invalid_utf8_bytes when given.
  bool run(int64_t* invalid_utf8_bytes) {
    size_t segment_start = 0;
    size_t search_from = 0;
    while (!stopped_ && !t_.specials_.empty()) {
      const size_t at = text_.find('[', search_from);
      if (at == std::string_view::npos) break;
      const SpecialToken* match = nullptr;
      for (const SpecialToken& special : t_.specials_) {
        if (text_.substr(at).starts_with(special.text) &&
            (match == nullptr || special.text.size() > match->text.size())) {
          match = &special;
        }
      }
      if (match == nullptr) {
        search_from = at + 1;
        continue;
      }
      normalize(segment_start, at);
      if (stopped_) break;
      out_.push_back(match->id);
      check_limit();
      segment_start = search_from = at + match->text.size();
      position_ = segment_start;
    }
    if (!stopped_) normalize(segment_start, text_.size());
    if (invalid_utf8_bytes != nullptr) {
      // Once the limit stops the pass, the rest of the text is only checked.
      *invalid_utf8_bytes = invalid_bytes_;
      if (stopped_) *invalid_utf8_bytes += count_invalid_utf8(text_.substr(position_));
    }
    return !stopped_;
  }

 private:
  // Steps 1-6 over text_[begin, end), which holds no special token.
  void normalize(size_t begin, size_t end) {
    const auto* data = reinterpret_cast<const unsigned char*>(text_.data());
    size_t i = begin;
    while (i < end && !stopped_) {
      if (data[i] < 0x80) {
        ascii(static_cast<char>(data[i]));
        ++i;
        continue;
      }
      char32_t c;
      size_t invalid;
      i += decode_utf8(data + i, data + end, &c, &invalid);
      invalid_bytes_ += static_cast<int64_t>(invalid);
      clean(c);
    }
    position_ = i;
    if (!stopped_) {
      flush_marks();
      end_word();
    }
  }

  // Steps 1-5 for an ASCII character, which every step maps to itself or drops.
  void ascii(char c) {
    switch (kAsciiClasses[static_cast<unsigned char>(c)]) {
      case Ascii::kDrop:
        return;
      case Ascii::kSpace:
        flush_marks();
        end_word();
        return;
      case Ascii::kPunctuation:
        flush_marks();
        end_word();
        word_.push_back(c);
        word_chars_ = 1;
        end_word();
        return;
      case Ascii::kOther:
        flush_marks();
        if (++word_chars_ <= max_word_chars_) word_.push_back(lower_ ? ascii_lower(c) : c);
        return;
    }
  }

  // Step 1, clean_text.
  void clean(char32_t c) {
    if (c < 0x80) {
      ascii(static_cast<char>(c));
      return;
    }
    if (c == kReplacement || is_control(c)) return;
    if (is_whitespace(c)) {
      ascii(' ');
      return;
    }
    // Step 2, handle_chinese_chars.
    if (chinese_ && is_cjk_ideograph(c)) {
      ascii(' ');
      strip(c);
      ascii(' ');
      return;
    }
    strip(c);
  }

  // Step 3, strip_accents: NFD, then drop the nonspacing marks.
  void strip(char32_t c) {
    if (!strip_) {
      lower(c);
      return;
    }
    utf8proc_int32_t decomposed[8];
    utf8proc_ssize_t n = 1;
    decomposed[0] = static_cast<utf8proc_int32_t>(c);
    if (c != kNotDecomposedByUnicode9) {
      n = utf8proc_decompose_char(static_cast<utf8proc_int32_t>(c), decomposed, 8,
                                  UTF8PROC_DECOMPOSE, nullptr);
      if (n < 1 || n > 8) {  // cannot happen for a valid code point (at most 4 in Unicode 15)
        n = 1;
        decomposed[0] = static_cast<utf8proc_int32_t>(c);
      }
    }
    for (utf8proc_ssize_t i = 0; i < n; ++i) {
      const auto d = static_cast<char32_t>(decomposed[i]);
      if (is_stripped_mark(d)) continue;
      const uint8_t cc = combining_class(d);
      if (cc != 0) {
        marks_.emplace_back(cc, d);  // reordered when the next starter comes
      } else {
        flush_marks();
        lower(d);
      }
    }
  }

  // The canonical reordering of NFD: a run of non-starters is sorted, stably, by class.
  void flush_marks() {
    if (marks_.empty()) return;
    if (marks_.size() > 1) {
      std::stable_sort(marks_.begin(), marks_.end(),
                       [](const auto& a, const auto& b) { return a.first < b.first; });
    }
    for (const auto& mark : marks_) lower(mark.second);
    marks_.clear();
  }

  // Step 4, lowercase.
  void lower(char32_t c) {
    if (!lower_) {
      pre_tokenize(c);
    } else if (c == kCapitalIWithDot) {
      pre_tokenize('i');
      pre_tokenize(kCombiningDotAbove);
    } else {
      pre_tokenize(to_lower(c));
    }
  }

  // Step 5, BertPreTokenizer.
  void pre_tokenize(char32_t c) {
    if (c < 0x80) {
      // Only what ascii() would do once the earlier steps are done: no lower-casing here.
      switch (kAsciiClasses[c]) {
        case Ascii::kDrop:
        case Ascii::kSpace:
          end_word();
          return;
        case Ascii::kPunctuation:
          end_word();
          word_.push_back(static_cast<char>(c));
          word_chars_ = 1;
          end_word();
          return;
        case Ascii::kOther:
          if (++word_chars_ <= max_word_chars_) word_.push_back(static_cast<char>(c));
          return;
      }
    }
    if (is_whitespace(c)) {
      end_word();
    } else if (is_punctuation(c)) {
      end_word();
      append_utf8(word_, c);
      word_chars_ = 1;
      end_word();
    } else if (++word_chars_ <= max_word_chars_) {
      append_utf8(word_, c);
    }
  }

  // A word longer than max_word_chars_ is counted but not stored: it can only be [UNK], and a
  // huge text without spaces must not grow the buffer.
  void end_word() {
    if (word_chars_ == 0) return;
    word_piece(word_, word_chars_);
    word_.clear();
    word_chars_ = 0;
  }

  // Step 6: greedy longest match, or one [UNK] for the word.
  void word_piece(std::string_view word, size_t chars) {
    if (stopped_) return;
    if (chars > max_word_chars_) {
      out_.push_back(t_.unk_id_);
      check_limit();
      return;
    }
    const size_t first_piece = out_.size();
    size_t start = 0;
    while (start < word.size()) {
      const TokenTable& table = start == 0 ? t_.whole_ : t_.continuation_;
      size_t end = std::min(word.size(), start + table.max_key_bytes());
      while (end > start && end < word.size() && is_utf8_continuation(word[end])) --end;
      int32_t id = -1;
      while (end > start) {
        id = table.find(word.substr(start, end - start));
        if (id >= 0) break;
        do {
          --end;
        } while (end > start && is_utf8_continuation(word[end]));
      }
      if (id < 0) {
        out_.resize(first_piece);
        out_.push_back(t_.unk_id_);
        break;
      }
      out_.push_back(id);
      start = end;
    }
    check_limit();
  }

  void check_limit() {
    if (out_.size() > limit_) {
      out_.resize(limit_);
      stopped_ = true;
    }
  }

  const WordPieceTokenizer& t_;
  const std::string_view text_;
  std::vector<int32_t>& out_;
  const size_t limit_;
  std::string& word_;
  std::vector<std::pair<uint8_t, char32_t>>& marks_;
  const bool strip_;
  const bool lower_;
  const bool chinese_;
  const size_t max_word_chars_;
  size_t word_chars_ = 0;  // characters of the current word, stored or not
  bool stopped_ = false;
  int64_t invalid_bytes_ = 0;
  size_t position_ = 0;  // bytes of text_ read so far
};

// ---------------------------------------------------------------------------------------------
// WordPieceTokenizer

WordPieceTokenizer WordPieceTokenizer::from_vocab_file(const std::filesystem::path& vocab,
                                                       const TokenizerOptions& options) {
  std::ifstream in(vocab, std::ios::binary);
  PC_CHECK(in.is_open(), ConfigError, "cannot read the tokenizer vocabulary ", vocab,
           ": check that the file exists and is readable (it is the model's vocab.txt)");
  std::vector<std::string> tokens;
  tokens.reserve(32768);
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();  // CRLF files
    tokens.push_back(line);
  }
  PC_CHECK(!in.bad(), ConfigError, "error while reading the tokenizer vocabulary ", vocab);
  return WordPieceTokenizer(std::move(tokens), options, "vocabulary " + vocab.string());
}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab,
                                       const TokenizerOptions& options)
    : WordPieceTokenizer(std::move(vocab), options, "the tokenizer vocabulary") {}

WordPieceTokenizer::WordPieceTokenizer(std::vector<std::string> vocab,
                                       const TokenizerOptions& options, const std::string& source)
    : vocab_(std::move(vocab)), options_(options) {
  PC_CHECK(!vocab_.empty(), ConfigError, source,
           " is empty: give the vocab.txt of a BERT model (one token per line)");
  PC_CHECK(vocab_.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()), ConfigError,
           source, " has too many tokens (", vocab_.size(), ")");
  PC_CHECK(options_.max_length >= 2, ConfigError, "tokenizer max_length must be at least 2 (for ",
           "[CLS] and [SEP]); got ", options_.max_length);
  PC_CHECK(options_.max_chars_per_word >= 1, ConfigError,
           "tokenizer max_chars_per_word must be at least 1; got ", options_.max_chars_per_word);
  strip_accents_ = options_.strip_accents.value_or(options_.lower_case);

  std::vector<std::pair<std::string_view, int32_t>> whole, continuation;
  whole.reserve(vocab_.size());
  for (size_t i = 0; i < vocab_.size(); ++i) {
    const std::string_view token = vocab_[i];
    const auto id = static_cast<int32_t>(i);
    if (token.empty()) continue;  // an empty line keeps its id but can never match
    whole.emplace_back(token, id);
    if (token.size() > 2 && token.starts_with("##")) continuation.emplace_back(token.substr(2), id);
  }
  whole_.build(whole);
  continuation_.build(continuation);

  std::string missing;
  const auto require = [&](std::string_view name, int32_t& id) {
    if (auto found = id_of(name)) {
      id = *found;
    } else {
      missing += missing.empty() ? "" : ", ";
      missing += name;
    }
  };
  require("[CLS]", cls_id_);
  require("[SEP]", sep_id_);
  require("[PAD]", pad_id_);
  require("[UNK]", unk_id_);
  PC_CHECK(missing.empty(), ConfigError, source, " lacks the special token(s) ", missing,
           ": it is not a BERT WordPiece vocabulary (give the model's vocab.txt)");

  // Note [Special tokens in the text]
  // BertTokenizerFast registers these five as added tokens (not normalised, not single-word), so
  // it finds them in the raw text before anything else, and so do we.
  for (const char* name : {"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"}) {
    if (auto id = id_of(name)) specials_.push_back(SpecialToken{name, *id});
  }
}

std::optional<int32_t> WordPieceTokenizer::id_of(std::string_view token) const {
  const int32_t id = whole_.find(token);
  if (id < 0) return std::nullopt;
  return id;
}

bool WordPieceTokenizer::append_ids(std::string_view text, std::vector<int32_t>& out, size_t limit,
                                    int64_t* invalid_utf8_bytes) const {
  thread_local Scratch scratch;
  Pass pass(*this, text, out, limit, scratch);
  return pass.run(invalid_utf8_bytes);
}

TokenizedText WordPieceTokenizer::encode(std::string_view text, int64_t* invalid_utf8_bytes) const {
  TokenizedText result;
  const auto max_length = static_cast<size_t>(options_.max_length);
  result.ids.reserve(std::min(max_length, text.size() + 2));
  result.ids.push_back(cls_id_);
  result.truncated = !append_ids(text, result.ids, max_length - 1, invalid_utf8_bytes);
  result.ids.push_back(sep_id_);
  return result;
}

std::vector<std::string> WordPieceTokenizer::tokenize(std::string_view text) const {
  std::vector<int32_t> ids;
  append_ids(text, ids, std::numeric_limits<size_t>::max(), nullptr);
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) tokens.push_back(vocab_[static_cast<size_t>(id)]);
  return tokens;
}

}  // namespace precompute
