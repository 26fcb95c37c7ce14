// WordPieceTokenizer on a small vocabulary written here, with expectations worked out by hand
// from the rules in Note [What BertTokenizerFast does] (encoders/text/wordpiece_tokenizer.cpp).
// Agreement with Hugging Face itself, on a real vocabulary and many thousands of texts, is
// tests/python/test_tokenizer_parity.py.

#include "encoders/text/wordpiece_tokenizer.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Tokens = std::vector<std::string>;

const std::vector<std::string>& test_vocab() {
  // clang-format off
  static const std::vector<std::string> vocab = {
      "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",     // 0-4
      "un", "##aff", "##able", "hello", "world",        // 5-9
      "##s", "a", "##a", "b", "##b",                    // 10-14
      "c", ",", ".", "!", "$",                          // 15-19
      "[", "]", "sep", "i", "##\u0307",                 // 20-24: ##U+0307 COMBINING DOT ABOVE
      "cafe", "caf\u00e9", "Cafe", "Caf\u00e9", "\u00bf",  // 25-29: café, Café, ¿
      "\u03c3\u03b1\u03c3", "\u4e2d", "\u56fd", "\u4e2d\u56fd", "\u0264",  // 30-34: σασ 中 国 中国 ɤ
      "Hello", "#", "##c", "ab", "\u00e9",              // 35-39
      "##\u00e9",                                       // 40
  };
  // clang-format on
  return vocab;
}

WordPieceTokenizer make(TokenizerOptions options = {}) {
  return WordPieceTokenizer(test_vocab(), options);
}

TokenizerOptions cased(std::optional<bool> strip_accents = false) {
  TokenizerOptions options;
  options.lower_case = false;
  options.strip_accents = strip_accents;
  return options;
}

TEST(WordPieceTokenizer, FindsTheSpecialTokens) {
  const auto t = make();
  EXPECT_EQ(t.pad_id(), 0);
  EXPECT_EQ(t.unk_id(), 1);
  EXPECT_EQ(t.cls_id(), 2);
  EXPECT_EQ(t.sep_id(), 3);
  EXPECT_EQ(t.vocab_size(), test_vocab().size());
  EXPECT_EQ(t.id_of("##aff"), 6);
  EXPECT_EQ(t.id_of("aff"), std::nullopt);
  EXPECT_EQ(t.token(8), "hello");
}

TEST(WordPieceTokenizer, EncodesWithClsAndSep) {
  const auto t = make();
  const auto text = t.encode("Hello, world!");
  EXPECT_EQ(text.ids, (std::vector<int32_t>{2, 8, 16, 9, 18, 3}));
  EXPECT_FALSE(text.truncated);
}

TEST(WordPieceTokenizer, EmptyAndBlankTextsAreClsSep) {
  const auto t = make();
  for (const char* text : {"", " ", " \t\r\n ", "\u3000\u00a0", "\x01\x7f"}) {
    EXPECT_EQ(t.encode(text).ids, (std::vector<int32_t>{2, 3})) << text;
  }
}

TEST(WordPieceTokenizer, GreedyLongestMatchWithContinuations) {
  const auto t = make();
  EXPECT_EQ(t.tokenize("unaffable"), (Tokens{"un", "##aff", "##able"}));
  EXPECT_EQ(t.tokenize("worlds"), (Tokens{"world", "##s"}));
  EXPECT_EQ(t.tokenize("ab"), (Tokens{"ab"}));  // the longer match wins over a ##b
  EXPECT_EQ(t.tokenize("abc"), (Tokens{"ab", "##c"}));
  EXPECT_EQ(t.tokenize("aab"), (Tokens{"a", "##a", "##b"}));
}

TEST(WordPieceTokenizer, AWordWithAnUnmatchedPieceIsOneUnk) {
  const auto t = make();
  EXPECT_EQ(t.tokenize("unaffablez"), (Tokens{"[UNK]"}));
  EXPECT_EQ(t.tokenize("zhello hello"), (Tokens{"[UNK]", "hello"}));
  EXPECT_EQ(t.encode("unaffablez").ids, (std::vector<int32_t>{2, 1, 3}));
}

TEST(WordPieceTokenizer, LongWordsBecomeUnk) {
  const auto t = make();
  const Tokens hundred = t.tokenize(std::string(100, 'a'));
  ASSERT_EQ(hundred.size(), 100u);
  EXPECT_EQ(hundred.front(), "a");
  EXPECT_EQ(hundred.back(), "##a");
  EXPECT_EQ(t.tokenize(std::string(101, 'a')), (Tokens{"[UNK]"}));
  TokenizerOptions short_words = cased();
  short_words.max_chars_per_word = 3;
  EXPECT_EQ(make(short_words).tokenize("aaa aaaa"), (Tokens{"a", "##a", "##a", "[UNK]"}));
  // Characters are counted, not bytes: three two-byte characters are still three.
  EXPECT_EQ(make(short_words).tokenize("\u00e9\u00e9\u00e9 \u00e9\u00e9\u00e9\u00e9"),
            (Tokens{"\u00e9", "##\u00e9", "##\u00e9", "[UNK]"}));
}

TEST(WordPieceTokenizer, SplitsPunctuationAndWhitespace) {
  const auto t = make();
  // ASCII punctuation includes symbols such as $ (category Sc).
  EXPECT_EQ(t.tokenize("a$b"), (Tokens{"a", "$", "b"}));
  EXPECT_EQ(t.tokenize("\u00bfa?"), (Tokens{"\u00bf", "a", "[UNK]"}));  // ¿ is Po
  // Every White_Space character splits (after clean-up maps it to a space).
  EXPECT_EQ(t.tokenize("a\tb\nc\u00a0a\u2003b\u3000c\u2029a"),
            (Tokens{"a", "b", "c", "a", "b", "c", "a"}));
  // '#' is punctuation, so text never reaches the ## entries directly.
  EXPECT_EQ(t.tokenize("##c"), (Tokens{"#", "#", "c"}));
  // A non-ASCII symbol that is not punctuation (¢, Sc) stays in its word.
  EXPECT_EQ(t.tokenize("a\u00a2b"), (Tokens{"[UNK]"}));
}

TEST(WordPieceTokenizer, CleanUpDropsControlAndFormatCharacters) {
  const auto t = make();
  // NUL, U+FFFD, zero-width space and joiner (Cf), a private-use character (Co) vanish, joining
  // the letters around them into one word.
  EXPECT_EQ(t.tokenize(std::string("a\0b", 3)), (Tokens{"ab"}));
  EXPECT_EQ(t.tokenize("a\ufffdb a\u200bb a\u200db a\ue000b a\u00adb"),
            (Tokens{"ab", "ab", "ab", "ab", "ab"}));
  // VT, FF and NEL are White_Space but also Cc: the library drops them rather than splitting.
  EXPECT_EQ(t.tokenize("a\x0b"
                       "b a\x0c"
                       "b a\u0085b"),
            (Tokens{"ab", "ab", "ab"}));
}

TEST(WordPieceTokenizer, LowerCasesAndStripsAccentsWhenUncased) {
  const auto t = make();
  EXPECT_EQ(t.tokenize("CAF\u00c9 Caf\u00e9 Cafe\u0301"), (Tokens{"cafe", "cafe", "cafe"}));
  EXPECT_EQ(t.tokenize("HELLO"), (Tokens{"hello"}));
  // Lower-casing is per character: a final capital sigma becomes σ, not ς.
  EXPECT_EQ(t.tokenize("\u03a3\u0391\u03a3"), (Tokens{"\u03c3\u03b1\u03c3"}));
}

TEST(WordPieceTokenizer, CasedKeepsCaseAndAccents) {
  const auto t = make(cased());
  EXPECT_EQ(t.tokenize("Caf\u00e9 Hello hello"), (Tokens{"Caf\u00e9", "Hello", "hello"}));
  // Without stripping there is no decomposition either: e + U+0301 is not é.
  EXPECT_EQ(t.tokenize("Cafe\u0301"), (Tokens{"[UNK]"}));
}

TEST(WordPieceTokenizer, CasedWithStripAccents) {
  const auto t = make(cased(true));
  EXPECT_EQ(t.tokenize("Caf\u00e9 caf\u00e9 Cafe\u0301"), (Tokens{"Cafe", "cafe", "Cafe"}));
}

TEST(WordPieceTokenizer, StripAccentsFollowsLowerCaseWhenUnset) {
  TokenizerOptions options;
  options.lower_case = false;
  options.strip_accents.reset();
  EXPECT_EQ(make(options).tokenize("Caf\u00e9"), (Tokens{"Caf\u00e9"}));
  options.lower_case = true;
  EXPECT_EQ(make(options).tokenize("Caf\u00e9"), (Tokens{"cafe"}));
}

TEST(WordPieceTokenizer, CapitalIWithDotLowerCasesToTwoCharacters) {
  TokenizerOptions lower_only;
  lower_only.strip_accents = false;
  // U+0130 lower-cases to "i" + U+0307 (its full mapping), as Rust's char::to_lowercase does.
  EXPECT_EQ(make(lower_only).tokenize("\u0130"), (Tokens{"i", "##\u0307"}));
  // With stripping, NFD comes first: I + U+0307, the mark is dropped, then "i".
  EXPECT_EQ(make().tokenize("\u0130"), (Tokens{"i"}));
}

TEST(WordPieceTokenizer, UnicodeVersionDifferencesFollowTheLibrary) {
  const auto t = make();
  // U+08E2 is Cf in Unicode 15.0 but not in the library's Unicode 8.0 tables: kept, so the
  // word "a<U+08E2>b" stays one (unknown) word instead of becoming "ab".
  EXPECT_EQ(t.tokenize("a\u08e2b"), (Tokens{"[UNK]"}));
  // U+2E43 is Po only since Unicode 9.0: not a split point for the library.
  EXPECT_EQ(t.tokenize("a\u2e43b"), (Tokens{"[UNK]"}));
  // U+166D was Po in Unicode 8.0 (So since 12.0): still split off.
  EXPECT_EQ(t.tokenize("a\u166db"), (Tokens{"a", "[UNK]", "b"}));
  // U+1AC1 is Mn since Unicode 14.0: strip_accents keeps it.
  EXPECT_EQ(t.tokenize("a\u1ac1"), (Tokens{"[UNK]"}));
  // U+A7CB lower-cases to U+0264 since Unicode 16.0 (utf8proc 2.8 does not know it).
  EXPECT_EQ(t.tokenize("\ua7cb"), (Tokens{"\u0264"}));
}

TEST(WordPieceTokenizer, ChineseCharactersAreWordsOfTheirOwn) {
  const auto t = make();
  EXPECT_EQ(t.tokenize("\u4e2d\u56fd"), (Tokens{"\u4e2d", "\u56fd"}));
  EXPECT_EQ(t.tokenize("a\u4e2db"), (Tokens{"a", "\u4e2d", "b"}));
  TokenizerOptions off;
  off.tokenize_chinese_chars = false;
  EXPECT_EQ(make(off).tokenize("\u4e2d\u56fd"), (Tokens{"\u4e2d\u56fd"}));
}

TEST(WordPieceTokenizer, SpecialTokensInTheTextAreMatchedVerbatim) {
  const auto t = make();
  EXPECT_EQ(t.encode("a[SEP]b").ids, (std::vector<int32_t>{2, 11, 3, 13, 3}));
  EXPECT_EQ(t.tokenize("[[MASK]]"), (Tokens{"[", "[MASK]", "]"}));
  // Case matters, because the match happens before lower-casing.
  EXPECT_EQ(t.tokenize("[sep] [SEP"), (Tokens{"[", "sep", "]", "[", "sep"}));
}

TEST(WordPieceTokenizer, TruncatesToMaxLength) {
  TokenizerOptions options;
  options.max_length = 4;
  const auto t = make(options);
  const auto cut = t.encode("a b c");
  EXPECT_EQ(cut.ids, (std::vector<int32_t>{2, 11, 13, 3}));
  EXPECT_TRUE(cut.truncated);
  const auto exact = t.encode("a b");
  EXPECT_EQ(exact.ids, (std::vector<int32_t>{2, 11, 13, 3}));
  EXPECT_FALSE(exact.truncated);
  // Trailing text that yields no token does not count as dropped.
  EXPECT_FALSE(t.encode("a b \u200b ").truncated);
  // The cut may fall inside a word's pieces.
  EXPECT_EQ(t.encode("a unaffable").ids, (std::vector<int32_t>{2, 11, 5, 3}));
  options.max_length = 2;
  const auto none = make(options).encode("hello");
  EXPECT_EQ(none.ids, (std::vector<int32_t>{2, 3}));
  EXPECT_TRUE(none.truncated);
}

TEST(WordPieceTokenizer, ReplacesAndCountsInvalidUtf8) {
  const auto t = make();
  struct Case {
    std::string text;
    int64_t invalid;
  };
  const std::vector<Case> cases = {
      {"a\xff"
       "b",
       1},  // a byte that never starts a sequence
      {"a\xe2\x82"
       "b",
       2},  // a truncated sequence is one maximal subpart
      {"a\xed\xa0\x80"
       "b",
       3},  // an encoded surrogate: three single bytes
      {"a\xc0\xaf"
       "b",
       2},  // an overlong form: C0 and AF each
      {"a\xf0\x9f\x98"
       "b",
       3},  // a truncated 4-byte sequence
      {"a\xf4\x90\x80\x80"
       "b",
       4},  // above U+10FFFF
      {"a\x80\x80"
       "b",
       2},                            // stray continuation bytes
      {std::string("ab\xe2", 3), 1},  // cut at the end of the text
  };
  for (const auto& c : cases) {
    int64_t invalid = -1;
    const auto text = t.encode(c.text, &invalid);
    // U+FFFD is then dropped by the clean-up, which joins a and b.
    EXPECT_EQ(text.ids, (std::vector<int32_t>{2, 38, 3})) << testing::PrintToString(c.text);
    EXPECT_EQ(invalid, c.invalid) << testing::PrintToString(c.text);
  }
  int64_t invalid = -1;
  t.encode("valid \u00e9\u4e2d\U0001F600", &invalid);
  EXPECT_EQ(invalid, 0);
}

TEST(WordPieceTokenizer, CountsInvalidBytesAfterTheCutToo) {
  TokenizerOptions options;
  options.max_length = 3;
  int64_t invalid = -1;
  const auto text = make(options).encode("a b \xff c \xfe", &invalid);
  EXPECT_TRUE(text.truncated);
  EXPECT_EQ(invalid, 2);
}

TEST(WordPieceTokenizer, IsSafeToShareAcrossThreads) {
  const auto t = make();
  const std::string text = "Hello, WORLD! unaffable caf\u00e9 \u4e2d\u56fd a[SEP]b \xff";
  const auto expected = t.encode(text).ids;
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&, i] {
      for (int n = 0; n < 2000; ++n) mismatches[i] += t.encode(text).ids != expected;
    });
  }
  for (auto& thread : threads) thread.join();
  for (int m : mismatches) EXPECT_EQ(m, 0);
}

TEST(WordPieceTokenizer, CopiesAreIndependent) {
  auto original = std::make_unique<WordPieceTokenizer>(make());
  const WordPieceTokenizer copy = *original;
  original.reset();
  EXPECT_EQ(copy.tokenize("unaffable"), (Tokens{"un", "##aff", "##able"}));
}

TEST(WordPieceTokenizer, LaterDuplicateTokensWin) {
  auto vocab = test_vocab();
  vocab.push_back("hello");
  const WordPieceTokenizer t(vocab, {});
  EXPECT_EQ(t.id_of("hello"), static_cast<int32_t>(vocab.size() - 1));
}

class VocabFileTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("wordpiece_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
            "_" + testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::filesystem::path write(const std::string& name, const std::string& content) {
    const auto path = dir_ / name;
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }

  std::filesystem::path dir_;
};

TEST_F(VocabFileTest, ReadsOneTokenPerLineWithCrlfOrLf) {
  const auto path = write("vocab.txt", "[PAD]\r\n[UNK]\r\n[CLS]\n[SEP]\nhello\n\nworld\n");
  const auto t = WordPieceTokenizer::from_vocab_file(path, {});
  EXPECT_EQ(t.vocab_size(), 7u);  // the empty line keeps its id
  EXPECT_EQ(t.unk_id(), 1);
  EXPECT_EQ(t.id_of("world"), 6);
  EXPECT_EQ(t.encode("Hello world").ids, (std::vector<int32_t>{2, 4, 6, 3}));
  // Without [MASK] in the vocabulary, "[MASK]" is plain text.
  EXPECT_EQ(t.tokenize("[MASK]"), (Tokens{"[UNK]", "[UNK]", "[UNK]"}));
}

TEST_F(VocabFileTest, MissingFileIsAConfigErrorNamingIt) {
  const auto path = dir_ / "nope.txt";
  try {
    WordPieceTokenizer::from_vocab_file(path, {});
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("nope.txt"), std::string::npos) << e.what();
  }
}

TEST_F(VocabFileTest, EmptyFileIsAConfigError) {
  const auto path = write("empty.txt", "");
  try {
    WordPieceTokenizer::from_vocab_file(path, {});
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("empty.txt"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("empty"), std::string::npos) << e.what();
  }
}

TEST_F(VocabFileTest, MissingSpecialTokensAreNamed) {
  const auto path = write("partial.txt", "[PAD]\n[CLS]\nhello\n");
  try {
    WordPieceTokenizer::from_vocab_file(path, {});
    FAIL() << "no exception";
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("partial.txt"), std::string::npos) << message;
    EXPECT_NE(message.find("[SEP]"), std::string::npos) << message;
    EXPECT_NE(message.find("[UNK]"), std::string::npos) << message;
    EXPECT_EQ(message.find("[CLS]"), std::string::npos) << message;
  }
}

TEST(WordPieceTokenizer, RejectsAMaxLengthWithoutRoomForClsAndSep) {
  TokenizerOptions options;
  options.max_length = 1;
  EXPECT_THROW(make(options), ConfigError);
}

}  // namespace
}  // namespace precompute
