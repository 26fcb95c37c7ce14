// UnigramTokenizer on small vocabularies written here, with expectations worked out by hand from
// Note [What XLMRobertaTokenizer does] (encoders/text/unigram_tokenizer.cpp). Agreement with
// transformers itself, on a trained model and a 2,000-string multi-script corpus, is
// tests/python/test_unigram_parity.py.

#include "encoders/text/unigram_tokenizer.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Ids = std::vector<int32_t>;
using Tokens = std::vector<std::string>;

constexpr int32_t kBos = 0, kPad = 1, kEos = 2, kUnk = 3;

// The first four as XLM-RoBERTa has them, then pieces with scores.
std::vector<UnigramPiece> pieces(std::vector<UnigramPiece> rest) {
  std::vector<UnigramPiece> all = {{"<s>", 0}, {"<pad>", 0}, {"</s>", 0}, {"<unk>", 0}};
  all.insert(all.end(), rest.begin(), rest.end());
  return all;
}

UnigramTokenizer make(std::vector<UnigramPiece> rest, std::vector<SpecialTextToken> specials = {},
                      UnigramOptions options = {}) {
  return UnigramTokenizer(pieces(std::move(rest)), std::nullopt, std::move(specials), options,
                          "test vocabulary");
}

UnigramOptions without_prefix_space() {
  UnigramOptions options;
  options.add_prefix_space = false;
  return options;
}

// The Viterbi path: the best total score, unknown characters fused.
TEST(UnigramTokenizer, TakesTheBestScoringPathAndFusesUnknownCharacters) {
  const auto t = make({{"a", -1}, {"b", -1}, {"c", -1}, {"d", -1}, {"cd", -1.5}, {"ab", -1.2},
                       {"abc", -1.1}, {"abcd", -0.5}},
                      {}, without_prefix_space());
  // a=4 b=5 c=6 d=7 cd=8 ab=9 abc=10 abcd=11
  EXPECT_EQ(t.encode("abcdacdxx").ids, (Ids{kBos, 11, 4, 8, kUnk, kEos}));
  EXPECT_EQ(t.tokenize("abcdacdxx"), (Tokens{"abcd", "a", "cd", "<unk>"}));
}

// Equal scores: the candidate found first stays (ends are reached first by shorter pieces from
// earlier starts).
TEST(UnigramTokenizer, KeepsTheFirstOfEqualScoringPaths) {
  const auto t = make({{"a", -1}, {"b", -1}, {"ab", -2}}, {}, without_prefix_space());
  EXPECT_EQ(t.tokenize("ab"), (Tokens{"ab"}));
  const auto u = make({{"a", -1}, {"b", -1}, {"ab", -2.0000001}}, {}, without_prefix_space());
  EXPECT_EQ(u.tokenize("ab"), (Tokens{"a", "b"}));
}

// A character with no piece of its own length is an unknown node even when longer pieces
// start with it, scored min(score) - 10.
TEST(UnigramTokenizer, UnknownCharactersScoreTenBelowTheLowestPiece) {
  // The lowest piece, q, scores -40: an unknown x scores -50, and x then a (+20) -30.
  const auto t = make({{"a", 20}, {"q", -40}, {"xa", -29}}, {}, without_prefix_space());
  EXPECT_EQ(t.tokenize("xa"), (Tokens{"xa"}));
  const auto u = make({{"a", 20}, {"q", -40}, {"xa", -31}}, {}, without_prefix_space());
  EXPECT_EQ(u.tokenize("xa"), (Tokens{"<unk>", "a"}));
}

// Metaspace: a U+2581 before every word, the text cut at white space and before every U+2581.
TEST(UnigramTokenizer, PrefixesEveryWordWithTheWordStartMark) {
  const auto t = make({{"\u2581", -2}, {"\u2581a", -1}, {"b", -1}, {"\u2581b", -1}});
  EXPECT_EQ(t.tokenize("a b"), (Tokens{"\u2581a", "\u2581b"}));
  EXPECT_EQ(t.tokenize(" \t a\u3000\u3000b \n"), (Tokens{"\u2581a", "\u2581b"}));
  EXPECT_EQ(t.tokenize("ab"), (Tokens{"\u2581a", "b"}));
  EXPECT_EQ(t.tokenize("a\u2581b"), (Tokens{"\u2581a", "\u2581b"}));
  EXPECT_EQ(t.tokenize("\u2581\u2581a"), (Tokens{"\u2581", "\u2581a"}));
  EXPECT_EQ(t.tokenize("   "), Tokens{});
  EXPECT_EQ(t.encode("").ids, (Ids{kBos, kEos}));
  const auto never = make({{"\u2581", -2}, {"\u2581a", -1}, {"a", -1}, {"b", -1}}, {},
                          without_prefix_space());
  EXPECT_EQ(never.tokenize("a ba"), (Tokens{"a", "b", "a"}));
}

// Special tokens are found in the raw text, leftmost-longest, even inside a word; the text
// around them is tokenized on its own.
TEST(UnigramTokenizer, FindsSpecialTokensInTheRawText) {
  const std::vector<SpecialTextToken> specials = {
      {"<s>", kBos}, {"</s>", kEos}, {"<mask>", 6}, {"<mask>x", 7}};
  const auto t = make({{"\u2581a", -1}, {"\u2581b", -1}, {"<mask>", 0}, {"<mask>x", 0}},
                      specials);
  // ▁a=4 ▁b=5 <mask>=6 <mask>x=7
  EXPECT_EQ(t.encode("a<mask>b").ids, (Ids{kBos, 4, 6, 5, kEos}));
  EXPECT_EQ(t.encode("a<mask>xb").ids, (Ids{kBos, 4, 7, 5, kEos}));
  EXPECT_EQ(t.encode("a</s>b<s>").ids, (Ids{kBos, 4, kEos, 5, kBos, kEos}));
  EXPECT_EQ(t.encode("<MASK>").ids, (Ids{kBos, kUnk, kEos}));  // case-sensitive
}

TEST(UnigramTokenizer, StrippingSpecialTokensTakeTheWhiteSpaceBesideThem) {
  // With the Metaspace rules the stripped spaces would be dropped anyway; a piece made of the
  // U+2581 mark shows where the words start.
  const std::vector<SpecialTextToken> specials = {{"<mask>", 5, /*lstrip=*/true, /*rstrip=*/true}};
  const auto t = make({{"\u2581a", -1}, {"<mask>", 0}}, specials);
  EXPECT_EQ(t.encode("a  <mask>  a").ids, (Ids{kBos, 4, 5, 4, kEos}));
  EXPECT_EQ(t.encode("<mask>").ids, (Ids{kBos, 5, kEos}));
}

TEST(UnigramTokenizer, TruncatesToMaxLength) {
  UnigramOptions options;
  options.max_length = 4;
  const auto t = make({{"\u2581a", -1}}, {}, options);
  const auto cut = t.encode("a a a a a");
  EXPECT_EQ(cut.ids, (Ids{kBos, 4, 4, kEos}));
  EXPECT_TRUE(cut.truncated);
  const auto fits = t.encode("a a");
  EXPECT_EQ(fits.ids, (Ids{kBos, 4, 4, kEos}));
  EXPECT_FALSE(fits.truncated);
}

// Invalid UTF-8 is U+FFFD per maximal subpart, counted; U+FFFD has no piece, so it is unknown.
TEST(UnigramTokenizer, ReplacesAndCountsInvalidUtf8) {
  const auto t = make({{"\u2581a", -1}, {"\u2581", -2}});
  int64_t invalid = -1;
  EXPECT_EQ(t.encode("a \xff\xe2\x82", &invalid).ids, (Ids{kBos, 4, 5, kUnk, kEos}));
  EXPECT_EQ(invalid, 3);
  EXPECT_EQ(t.encode(std::string("a\0a", 3), &invalid).ids, (Ids{kBos, 4, kUnk, kEos}));
  EXPECT_EQ(invalid, 0);
}

// A repeated piece: the later id (and its score) wins, as in the library.
TEST(UnigramTokenizer, LaterRepeatedPiecesWin) {
  const auto t = make({{"a", -1}, {"a", -3}}, {}, without_prefix_space());
  EXPECT_EQ(t.encode("a").ids, (Ids{kBos, 5, kEos}));
}

TEST(UnigramTokenizer, IsSafeToShareAcrossThreads) {
  const auto t = make({{"\u2581a", -1}, {"\u2581b", -1}, {"b", -1}});
  const std::string text = "a b ab ba x a b";
  const auto expected = t.encode(text).ids;
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 2000; ++k) wrong += t.encode(text).ids != expected;
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(UnigramTokenizer, RefusesWhatItCannotRun) {
  EXPECT_THROW(UnigramTokenizer({}, std::nullopt, {}, {}, "empty"), ModelError);
  UnigramOptions options;
  options.max_length = 1;
  EXPECT_THROW(make({}, {}, options), ModelError);
  options = {};
  options.unk_id = 99;
  EXPECT_THROW(make({}, {}, options), ModelError);
  EXPECT_THROW(make({}, {{"<x>", 42}}), ModelError);
}

TEST(PrecompiledCharsmap, RefusesDamagedBlobs) {
  EXPECT_THROW(PrecompiledCharsmap("ab", "test"), ModelError);
  // A trie said to be 64 bytes long in a blob of 8.
  EXPECT_THROW(PrecompiledCharsmap(std::string("\x40\0\0\0abcd", 8), "test"), ModelError);
}

TEST(Base64, DecodesWithAndWithoutPadding) {
  EXPECT_EQ(decode_base64("aGVsbG8="), "hello");
  EXPECT_EQ(decode_base64("aGVsbG8"), "hello");
  EXPECT_EQ(decode_base64(""), "");
  EXPECT_FALSE(decode_base64("a$==").has_value());
  EXPECT_FALSE(decode_base64("aGVsb").has_value());
}

}  // namespace
}  // namespace precompute
