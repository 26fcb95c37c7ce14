#pragma once
// The XLM-RoBERTa tokenizer of a Hugging Face model folder (tokenizer.json with a Unigram model,
// tokenizer_config.json), read the way transformers' XLMRobertaTokenizer reads it (Note [What
// XLMRobertaTokenizer does] in encoders/text/unigram_tokenizer.cpp). Free functions, thread-safe.

#include <filesystem>
#include <nlohmann/json.hpp>

#include "encoders/text/unigram_tokenizer.hpp"

namespace precompute {

// Whether a tokenizer.json holds a Unigram model (an XLM-R-style tokenizer) rather than BERT's
// WordPiece.
bool is_unigram_tokenizer(const nlohmann::json& tokenizer_json);

// The tokenizer of `dir`, cut at max_length ids; `tokenizer_json` is dir/tokenizer.json already
// parsed, when the caller has it. Throws ModelError naming the file and the fix when the folder
// holds a tokenizer precompute cannot reproduce exactly.
UnigramTokenizer read_unigram_tokenizer(const std::filesystem::path& dir, int max_length,
                                        const nlohmann::json* tokenizer_json = nullptr);

}  // namespace precompute
