#include "encoders/bert/text_settings.hpp"

#include <nlohmann/json.hpp>

#include <optional>

#include "encoders/bert/model_folder.hpp"
#include "encoders/bert/unigram_folder.hpp"
#include "encoders/text/utf8_text.hpp"
#include "pipeline/core/error.hpp"

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
  }
  const bool unigram = folder && folder->tokenizer_kind == TokenizerKind::kUnigram;
  if (unigram) {
    // Note [Settings an XLM-R tokenizer does not have]
    // Its charsmap decides normalisation and it has no vocab.txt, so the WordPiece keys would
    // change nothing or break the model: a config that sets them is refused rather than ignored.
    for (const auto& [key, set] :
         {std::pair{"text.tokenizer.vocab", !text.vocab.empty()},
          {"text.tokenizer.lower_case", text.lower_case.has_value()},
          {"text.tokenizer.strip_accents", text.strip_accents.has_value()},
          {"text.tokenizer.tokenize_chinese_chars", text.tokenize_chinese_chars.has_value()}}) {
      PC_CHECK(!set, ConfigError, key, " is set, but the model folder ", text.encoder.path,
               " has an XLM-RoBERTa (SentencePiece Unigram) tokenizer, which normalises text as "
               "its tokenizer.json says; remove ", key, " from the config");
    }
  }
  // Note [Caption prefixes]
  // e5-style models were trained with "query: " or "passage: " before every text, and
  // sentence-transformers puts a folder's default prompt before every text by itself: text.prefix
  // reproduces either, and is part of what the stored vectors mean (fingerprinted). It is text,
  // so it must be UTF-8 without NUL, and short: it is repeated in every caption.
  constexpr size_t kMaxPrefixBytes = 4096;
  PC_CHECK(text.prefix.size() <= kMaxPrefixBytes, ConfigError, "config key 'text.prefix' is ",
           text.prefix.size(), " bytes; it goes before every caption, so it must be at most ",
           kMaxPrefixBytes, " bytes");
  PC_CHECK(text.prefix.find('\0') == std::string::npos && count_invalid_utf8(text.prefix) == 0,
           ConfigError, "config key 'text.prefix' must be UTF-8 text without NUL characters");
  if (folder && text.prefix.empty()) text.prefix = folder->default_prefix;
  PC_CHECK(text.prefix.empty() || !folder || !folder->pooling_excludes_prompt, ConfigError,
           "config key 'text.prefix' is set, but the Pooling module of ", text.encoder.path,
           " leaves the prompt's tokens out of the mean (include_prompt false), which precompute "
           "does not do; remove text.prefix or use a folder that pools every token");
  if (folder) {
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
  if (unigram) {
    text.origins = {
        {"text.tokenizer.vocab", json_text(text.encoder.path.string() + " (tokenizer.json)"),
         kFromFolder},
        {"text.tokenizer.max_length", json_text(effective.max_length),
         source(given.max_length.has_value(), true)},
        {"text.pooling", json_text(std::string(pooling_name(*text.pooling))),
         source(given.pooling.has_value(), folder->pooling.has_value())},
        {"text.normalize", json_text(*text.normalize), source(given.normalize.has_value(), true)},
    };
  } else {
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
  if (!text.prefix.empty()) {
    text.origins.push_back({"text.prefix", json_text(text.prefix),
                            source(!given.prefix.empty(), bert && !folder->default_prefix.empty())});
  }
}

TokenizerOptions tokenizer_options(const TextSection& text) {
  TokenizerOptions options;
  options.lower_case = text.lower_case.value_or(true);
  options.strip_accents = text.strip_accents;
  options.tokenize_chinese_chars = text.tokenize_chinese_chars.value_or(true);
  options.max_length = text.max_length.value_or(128);
  return options;
}

std::shared_ptr<const TextTokenizer> make_text_tokenizer(const TextSection& text) {
  if (!text.vocab.empty()) {
    return std::make_shared<const WordPieceTokenizer>(
        WordPieceTokenizer::from_vocab_file(text.vocab, tokenizer_options(text)));
  }
  ModelFolder folder = read_model_folder(text.encoder.path);
  TokenizerOptions options = tokenizer_options(text);
  if (folder.tokenizer_kind == TokenizerKind::kUnigram) {
    return std::make_shared<const UnigramTokenizer>(
        folder.unigram->with_max_length(options.max_length));
  }
  options.max_chars_per_word = folder.tokenizer.max_chars_per_word;
  return std::make_shared<const WordPieceTokenizer>(std::move(folder.vocab), options);
}

}  // namespace precompute
