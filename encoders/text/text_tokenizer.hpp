#pragma once
// What the pipeline needs of a text tokenizer: ids for a caption, with the model's special tokens
// and its length limit applied. WordPieceTokenizer (BERT) and UnigramTokenizer (XLM-RoBERTa)
// implement it; implementations are immutable and safe to share across threads.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/core/sample.hpp"

namespace precompute {

class TextTokenizer {
 public:
  virtual ~TextTokenizer() = default;

  // The ids the model reads for `text`, cut to max_length() (truncated = true when ids were
  // dropped). Invalid UTF-8 becomes U+FFFD, one per maximal subpart; *invalid_utf8_bytes, when
  // given, is set to the bytes replaced. Never throws on any input (short of memory).
  virtual TokenizedText encode(std::string_view text,
                               int64_t* invalid_utf8_bytes = nullptr) const = 0;
  // The tokens of `text` without the special tokens around it and without truncation.
  virtual std::vector<std::string> tokenize(std::string_view text) const = 0;
  virtual const std::string& token(int32_t id) const = 0;
  virtual size_t vocab_size() const = 0;
  virtual int32_t pad_id() const = 0;
  virtual int32_t unk_id() const = 0;
  virtual int max_length() const = 0;
};

}  // namespace precompute
