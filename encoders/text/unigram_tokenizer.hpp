#pragma once
// The tokenizer of XLM-RoBERTa-family models (multilingual-e5, bge-m3, paraphrase-multilingual):
// SentencePiece's Unigram model, read from tokenizer.json, run as transformers'
// XLMRobertaTokenizer runs it, id for id (Note [What XLMRobertaTokenizer does], .cpp;
// tests/python/test_unigram_parity.py checks it against transformers on a multi-script corpus).
//
// Thread-safety: immutable after construction; encode() and tokenize() may be called from many
// threads at once. Copies share the (immutable) pieces, so they are cheap.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "encoders/text/precompiled_charsmap.hpp"
#include "encoders/text/text_tokenizer.hpp"

namespace precompute {

struct UnigramPiece {
  std::string text;
  double score = 0;  // a log-probability
};

// A token matched in the raw text before anything else (tokenizer.json's added tokens).
struct SpecialTextToken {
  std::string text;
  int32_t id = 0;
  bool lstrip = false;  // the match takes the white space before it
  bool rstrip = false;  // and after it
};

struct UnigramOptions {
  int max_length = 512;          // ids per text, <s> and </s> included
  bool add_prefix_space = true;  // every word starts with U+2581 (Metaspace "always")
  int32_t unk_id = 3;
  int32_t bos_id = 0;  // put before the text
  int32_t eos_id = 2;  // and after it
  int32_t pad_id = 1;
};

class UnigramTokenizer final : public TextTokenizer {
 public:
  // Throws ModelError naming `source` when the pieces are empty, an id is out of range, or
  // max_length < 2.
  UnigramTokenizer(std::vector<UnigramPiece> pieces, std::optional<PrecompiledCharsmap> normalizer,
                   std::vector<SpecialTextToken> specials, const UnigramOptions& options,
                   const std::string& source);

  // The same tokenizer cutting at another length (>= 2).
  UnigramTokenizer with_max_length(int max_length) const;

  TokenizedText encode(std::string_view text, int64_t* invalid_utf8_bytes = nullptr) const override;
  std::vector<std::string> tokenize(std::string_view text) const override;
  const std::string& token(int32_t id) const override {
    return model_->pieces.at(static_cast<size_t>(id)).text;
  }
  size_t vocab_size() const override { return model_->pieces.size(); }
  int32_t pad_id() const override { return options_.pad_id; }
  int32_t unk_id() const override { return options_.unk_id; }
  int max_length() const override { return options_.max_length; }

 private:
  // The pieces' bytes as a trie with sorted edges: the Viterbi pass asks, at each character,
  // for every piece that starts there.
  class PieceTrie {
   public:
    void build(const std::vector<UnigramPiece>& pieces);
    // Calls found(length, id) for each piece that is a prefix of `text`, shortest first.
    template <class Found>
    void prefixes(std::string_view text, Found&& found) const;
    int32_t find(std::string_view key) const;  // -1 when absent

   private:
    struct Node {
      uint32_t first_edge = 0;
      uint16_t edge_count = 0;
      int32_t id = -1;
    };
    int32_t child(uint32_t node, unsigned char byte) const;  // -1 when absent
    std::vector<Node> nodes_;
    std::vector<unsigned char> edge_bytes_;
    std::vector<uint32_t> edge_targets_;
  };

  // Appends the ids of `text` (valid UTF-8, no special token in it) to out, stopping once out
  // holds more than `limit`; returns false then.
  bool append_segment(std::string_view text, std::vector<int32_t>& out, size_t limit) const;
  bool append_word(std::string_view word, std::vector<int32_t>& out, size_t limit) const;
  // Appends the ids of the whole text, special tokens included; false when cut at `limit`.
  bool append_ids(std::string_view text, std::vector<int32_t>& out, size_t limit) const;

  // What does not depend on the options but the ids: shared by copies.
  struct Model {
    std::vector<UnigramPiece> pieces;
    PieceTrie trie;
    std::optional<PrecompiledCharsmap> normalizer;
    std::vector<SpecialTextToken> specials;
    double unk_score = 0;
  };

  std::shared_ptr<const Model> model_;
  UnigramOptions options_;
};

}  // namespace precompute
