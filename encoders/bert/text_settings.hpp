#pragma once
// The text section's settings that may come from a Hugging Face model folder (encoder type bert):
// tokenizer options, max_length, pooling and normalisation. Settings the config leaves unset take
// the folder's values (sentence-transformers' own choices included), or BERT's defaults for a
// TorchScript model. Free of LibTorch; thread-safe (no shared state).

#include <memory>

#include "encoders/text/text_tokenizer.hpp"
#include "encoders/text/wordpiece_tokenizer.hpp"
#include "pipeline/core/config.hpp"

namespace precompute {

// Fills every unset tokenizer, pooling and normalize setting of `text`, and `text.origins` with
// each of them and where its value came from (Note [Where a text setting comes from]). Throws
// ModelError when the bert folder cannot be used (not BERT, files missing), naming the folder and
// the fix.
void resolve_text_settings(TextSection& text);

// The tokenizer options of a resolved text section.
TokenizerOptions tokenizer_options(const TextSection& text);

// The tokenizer of a resolved text section: WordPiece from its vocab file if given, else the
// model folder's tokenizer (BERT's WordPiece from vocab.txt or tokenizer.json, or XLM-RoBERTa's
// Unigram from tokenizer.json).
std::shared_ptr<const TextTokenizer> make_text_tokenizer(const TextSection& text);

}  // namespace precompute
