#include "encoders/bert/text_settings.hpp"

#include "encoders/bert/model_folder.hpp"

namespace precompute {

void resolve_text_settings(TextSection& text) {
  if (text.encoder.type == EncoderType::kBert) {
    const ModelFolder folder = read_model_folder(text.encoder.path);
    if (!text.lower_case) text.lower_case = folder.tokenizer.lower_case;
    if (!text.strip_accents) text.strip_accents = folder.tokenizer.strip_accents;
    if (!text.tokenize_chinese_chars) {
      text.tokenize_chinese_chars = folder.tokenizer.tokenize_chinese_chars;
    }
    if (!text.max_length) text.max_length = folder.tokenizer.max_length;
    if (!text.pooling) text.pooling = folder.pooling.value_or(Pooling::kMean);
    if (!text.normalize) text.normalize = folder.normalize;
  }
  // BERT's defaults, as BertTokenizerFast has them.
  if (!text.lower_case) text.lower_case = true;
  if (!text.tokenize_chinese_chars) text.tokenize_chinese_chars = true;
  if (!text.max_length) text.max_length = 128;
  if (!text.pooling) text.pooling = Pooling::kMean;
  if (!text.normalize) text.normalize = false;
}

TokenizerOptions tokenizer_options(const TextSection& text) {
  TokenizerOptions options;
  options.lower_case = text.lower_case.value_or(true);
  options.strip_accents = text.strip_accents;
  options.tokenize_chinese_chars = text.tokenize_chinese_chars.value_or(true);
  options.max_length = text.max_length.value_or(128);
  return options;
}

WordPieceTokenizer make_text_tokenizer(const TextSection& text) {
  if (!text.vocab.empty()) {
    return WordPieceTokenizer::from_vocab_file(text.vocab, tokenizer_options(text));
  }
  ModelFolder folder = read_model_folder(text.encoder.path);
  TokenizerOptions options = tokenizer_options(text);
  options.max_chars_per_word = folder.tokenizer.max_chars_per_word;
  return WordPieceTokenizer(std::move(folder.vocab), options);
}

}  // namespace precompute
