#pragma once
// BERT's tokenizer: the basic tokenizer (text clean-up, CJK splitting, accent stripping,
// lower-casing, punctuation splitting) followed by greedy longest-match WordPiece, producing
// [CLS] ... [SEP] ids as Hugging Face's BertTokenizerFast (the `tokenizers` library) does, id for
// id, including its Unicode-version quirks and its matching of special tokens such as "[SEP]"
// written in the text (Notes in wordpiece_tokenizer.cpp; tests/python/test_tokenizer_parity.py
// checks it against the library). Unicode data comes from utf8proc.
//
// Thread-safety: immutable after construction; encode() and tokenize() may be called from many
// threads at once (each thread keeps its own scratch buffers). Copies are independent.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "encoders/text/text_tokenizer.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

struct TokenizerOptions {
  bool lower_case = true;
  std::optional<bool> strip_accents;  // unset: same as lower_case
  bool tokenize_chinese_chars = true;
  int max_length = 128;          // ids per text, [CLS] and [SEP] included
  int max_chars_per_word = 100;  // longer words become [UNK]
};

class WordPieceTokenizer final : public TextTokenizer {
 public:
  // Reads vocab.txt (one token per line, id = line number, a trailing CR ignored; a token that
  // appears twice keeps the later id). Throws ConfigError naming the file when it is missing,
  // empty, or lacks [CLS], [SEP], [PAD] or [UNK], and when options.max_length < 2 or
  // options.max_chars_per_word < 1.
  static WordPieceTokenizer from_vocab_file(const std::filesystem::path& vocab,
                                            const TokenizerOptions& options);
  WordPieceTokenizer(std::vector<std::string> vocab, const TokenizerOptions& options);

  // [CLS] tokens... [SEP], cut to max_length (truncated = true when tokens were dropped).
  // Invalid UTF-8 is replaced by U+FFFD, one per maximal subpart as Python's
  // bytes.decode("utf-8", "replace") does (the clean-up then drops it); *invalid_utf8_bytes, when
  // given, is set to the number of bytes replaced in the whole text. Never throws on any input
  // (short of running out of memory).
  TokenizedText encode(std::string_view text, int64_t* invalid_utf8_bytes = nullptr) const override;

  // The WordPiece tokens of `text`, without [CLS]/[SEP] and without truncation (for debugging).
  std::vector<std::string> tokenize(std::string_view text) const override;

  const std::string& token(int32_t id) const override {
    return vocab_.at(static_cast<size_t>(id));
  }
  std::optional<int32_t> id_of(std::string_view token) const;
  size_t vocab_size() const override { return vocab_.size(); }
  int32_t cls_id() const { return cls_id_; }
  int32_t sep_id() const { return sep_id_; }
  int32_t pad_id() const override { return pad_id_; }
  int32_t unk_id() const override { return unk_id_; }
  int max_length() const override { return options_.max_length; }
  const TokenizerOptions& options() const { return options_; }

 private:
  // Token bytes -> id, open addressing over one byte arena: lookups take a string_view without
  // allocating, and the table copies and moves safely (it holds offsets, not pointers).
  class TokenTable {
   public:
    void build(const std::vector<std::pair<std::string_view, int32_t>>& entries);
    int32_t find(std::string_view key) const;  // -1 when absent
    size_t max_key_bytes() const { return max_key_bytes_; }

   private:
    struct Slot {
      uint32_t hash = 0;
      uint32_t offset = 0;
      uint32_t length = 0;
      int32_t id = -1;  // -1: empty slot
    };
    std::string bytes_;
    std::vector<Slot> slots_;
    size_t mask_ = 0;
    size_t max_key_bytes_ = 0;
  };

  // One special token that is matched in the raw text before normalisation, as
  // BertTokenizerFast matches its added tokens (Note [Special tokens in the text], .cpp).
  struct SpecialToken {
    std::string text;
    int32_t id = 0;
  };

  class Pass;  // the state of one append_ids() call (wordpiece_tokenizer.cpp)

  WordPieceTokenizer(std::vector<std::string> vocab, const TokenizerOptions& options,
                     const std::string& source);

  // Appends the WordPiece ids of `text` to `out`, stopping once out has `limit` ids.
  // Returns false if ids were dropped because of the limit. Sets *invalid_utf8_bytes.
  bool append_ids(std::string_view text, std::vector<int32_t>& out, size_t limit,
                  int64_t* invalid_utf8_bytes) const;

  std::vector<std::string> vocab_;
  TokenTable whole_;         // every token, as written in the vocabulary
  TokenTable continuation_;  // "##x" tokens, keyed by "x"
  std::vector<SpecialToken> specials_;
  TokenizerOptions options_;
  bool strip_accents_ = true;  // options_.strip_accents, resolved
  int32_t cls_id_ = 0, sep_id_ = 0, pad_id_ = 0, unk_id_ = 0;
};

}  // namespace precompute
