#include "encoders/bert/text_settings.hpp"

#include <nlohmann/json.hpp>

#include <optional>

#include "encoders/bert/model_folder.hpp"

namespace precompute {
namespace {

// Note [Where a text setting comes from]
// The tokenizer's vocabulary and options, max_length, pooling and normalisation are each the
// config's when it sets them, else the model folder's (encoder type bert, where the folder says),
// else BERT's defaults. A value the config sets silently beats the folder's, and the stored
// vectors then differ from what the model's authors publish (a copied config with normalize:
// false under a sentence-transformers folder), so every such setting is logged at start-up with
// its effective value and source, and index.json keeps them (model_settings, docs/format.md).
// configs/reference.yaml leaves these keys commented out for the same reason.
constexpr const char* kFromFolder = "model folder";
constexpr const char* kFromConfig = "config file";
constexpr const char* kFromDefault = "default";

const char* source(bool set_by_config, bool folder_decides) {
  return set_by_config ? kFromConfig : folder_decides ? kFromFolder : kFromDefault;
}

// A path is bytes and JSON text is UTF-8: bytes that are not become U+FFFD, as in index.json.
template <class T>
std::string json_text(const T& value) {
  return nlohmann::json(value).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

void resolve_text_settings(TextSection& text) {
  const TextSection given = text;
  std::optional<ModelFolder> folder;
  if (text.encoder.type == EncoderType::kBert) {
    folder = read_model_folder(text.encoder.path);
    if (!text.lower_case) text.lower_case = folder->tokenizer.lower_case;
    if (!text.strip_accents) text.strip_accents = folder->tokenizer.strip_accents;
    if (!text.tokenize_chinese_chars) {
      text.tokenize_chinese_chars = folder->tokenizer.tokenize_chinese_chars;
    }
    if (!text.max_length) text.max_length = folder->tokenizer.max_length;
    if (!text.pooling) text.pooling = folder->pooling.value_or(Pooling::kMean);
    if (!text.normalize) text.normalize = folder->normalize;
  }
  // BERT's defaults, as BertTokenizerFast has them.
  if (!text.lower_case) text.lower_case = true;
  if (!text.tokenize_chinese_chars) text.tokenize_chinese_chars = true;
  if (!text.max_length) text.max_length = 128;
  if (!text.pooling) text.pooling = Pooling::kMean;
  if (!text.normalize) text.normalize = false;

  const bool bert = folder.has_value();
  const TokenizerOptions effective = tokenizer_options(text);
  text.origins = {
      {"text.tokenizer.vocab",
       json_text(given.vocab.empty() ? text.encoder.path.string() : given.vocab.string()),
       source(!given.vocab.empty(), bert)},
      {"text.tokenizer.lower_case", json_text(effective.lower_case),
       source(given.lower_case.has_value(), bert)},
      // Unset everywhere, it follows lower_case (BERT's rule): shown as what it comes to.
      {"text.tokenizer.strip_accents",
       json_text(effective.strip_accents.value_or(effective.lower_case)),
       source(given.strip_accents.has_value(), bert && folder->tokenizer.strip_accents)},
      {"text.tokenizer.tokenize_chinese_chars", json_text(effective.tokenize_chinese_chars),
       source(given.tokenize_chinese_chars.has_value(), bert)},
      {"text.tokenizer.max_length", json_text(effective.max_length),
       source(given.max_length.has_value(), bert)},
      {"text.pooling", json_text(std::string(pooling_name(*text.pooling))),
       source(given.pooling.has_value(), bert && folder->pooling)},
      {"text.normalize", json_text(*text.normalize), source(given.normalize.has_value(), bert)},
  };
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
