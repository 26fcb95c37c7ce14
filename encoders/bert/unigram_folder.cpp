#include "encoders/bert/unigram_folder.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "encoders/bert/json_file.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Json = nlohmann::json;
using std::filesystem::path;

std::string quoted(const path& file) {
  std::ostringstream out;
  out << file;
  return out.str();
}

// A special token in tokenizer_config.json: a string, or an AddedToken object with "content".
std::string token_text(const Json& config, const char* key, const char* fallback,
                       const std::string& where) {
  if (!config.contains(key) || config.at(key).is_null()) return fallback;
  const Json& value = config.at(key);
  if (value.is_string()) return value.get<std::string>();
  PC_CHECK(value.is_object() && value.contains("content") && value.at("content").is_string(),
           ModelError, where, ": '", key, "' must be a token string, not ", value.dump());
  return value.at("content").get<std::string>();
}

bool flag(const Json& object, const char* key, bool fallback, const std::string& where) {
  if (!object.contains(key) || object.at(key).is_null()) return fallback;
  PC_CHECK(object.at(key).is_boolean(), ModelError, where, ": '", key,
           "' must be true or false, not ", object.at(key).dump());
  return object.at(key).get<bool>();
}

// The Precompiled normalizer's charsmap, alone or inside a Sequence, as transformers takes it:
// the first one found; other normalizers are not used.
std::optional<PrecompiledCharsmap> read_charsmap(const Json& tokenizer, const std::string& where) {
  if (!tokenizer.contains("normalizer") || !tokenizer.at("normalizer").is_object()) {
    return std::nullopt;
  }
  const Json& normalizer = tokenizer.at("normalizer");
  std::vector<const Json*> candidates;
  if (normalizer.value("type", "") == "Sequence" && normalizer.contains("normalizers") &&
      normalizer.at("normalizers").is_array()) {
    for (const Json& item : normalizer.at("normalizers")) candidates.push_back(&item);
  } else {
    candidates.push_back(&normalizer);
  }
  for (const Json* item : candidates) {
    if (!item->is_object() || item->value("type", "") != "Precompiled" ||
        !item->contains("precompiled_charsmap")) {
      continue;
    }
    const Json& encoded = item->at("precompiled_charsmap");
    PC_CHECK(encoded.is_string(), ModelError, where,
             ": the Precompiled normalizer's precompiled_charsmap must be a base64 string");
    const std::optional<std::string> blob = decode_base64(encoded.get<std::string>());
    PC_CHECK(blob.has_value(), ModelError, where,
             ": the Precompiled normalizer's precompiled_charsmap is not valid base64");
    return PrecompiledCharsmap(*blob, where);
  }
  return std::nullopt;
}

}  // namespace

bool is_unigram_tokenizer(const Json& tokenizer) {
  return tokenizer.is_object() && tokenizer.contains("model") &&
         tokenizer.at("model").is_object() && tokenizer.at("model").value("type", "") == "Unigram";
}

UnigramTokenizer read_unigram_tokenizer(const path& dir, int max_length,
                                        const Json* tokenizer_json) {
  const path file = dir / "tokenizer.json";
  const std::string where = quoted(file);
  std::optional<Json> read;
  if (tokenizer_json == nullptr) read = read_json_file(file);
  const Json& tokenizer = tokenizer_json != nullptr ? *tokenizer_json : *read;
  PC_CHECK(tokenizer.is_object() && tokenizer.contains("model") &&
               tokenizer.at("model").is_object(),
           ModelError, where, " has no model");
  const Json& model = tokenizer.at("model");
  PC_CHECK(model.value("type", "") == "Unigram", ModelError, where,
           ": model type is not Unigram, so it is not an XLM-RoBERTa tokenizer");
  PC_CHECK(!flag(model, "byte_fallback", false, where), ModelError, where,
           ": byte_fallback true is not supported; XLM-RoBERTa tokenizers have it false");

  const path config_file = dir / "tokenizer_config.json";
  const std::string config_where = quoted(config_file);
  const Json config = read_json_file_if_present(config_file).value_or(Json::object());
  PC_CHECK(config.is_object(), ModelError, config_where, " must be a JSON object");
  if (config.contains("tokenizer_class") && !config.at("tokenizer_class").is_null()) {
    const Json& name = config.at("tokenizer_class");
    const bool xlmr = name.is_string() && (name == "XLMRobertaTokenizer" ||
                                           name == "XLMRobertaTokenizerFast");
    PC_CHECK(xlmr, ModelError, config_where, ": tokenizer_class ", name.dump(),
             " is not supported with a Unigram tokenizer.json; precompute reproduces "
             "XLMRobertaTokenizer (multilingual-e5, bge-m3, paraphrase-multilingual models)");
  }

  PC_CHECK(model.contains("vocab") && model.at("vocab").is_array() && !model.at("vocab").empty(),
           ModelError, where, ": the Unigram model has no vocab ([piece, score] pairs)");
  std::vector<UnigramPiece> pieces;
  pieces.reserve(model.at("vocab").size());
  for (const Json& entry : model.at("vocab")) {
    const bool pair = entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
                      entry[1].is_number();
    PC_CHECK(pair, ModelError, where, ": vocab entry ", pieces.size(), " (", entry.dump(),
             ") is not a [piece, score] pair");
    UnigramPiece piece{entry[0].get<std::string>(), entry[1].get<double>()};
    PC_CHECK(std::isfinite(piece.score), ModelError, where, ": piece '", piece.text,
             "' has a score that is not a finite number");
    pieces.push_back(std::move(piece));
  }
  // A handful of lookups: a scan from the end finds the later id of a repeated piece, as the
  // library's table keeps it.
  const auto id_of = [&](const std::string& text, const char* role) {
    for (size_t i = pieces.size(); i-- > 0;) {
      if (pieces[i].text == text) return static_cast<int32_t>(i);
    }
    PC_THROW(ModelError, where, ": the ", role, " token '", text, "' (from ", config_where,
             ") is not in the vocabulary; the tokenizer files do not belong together");
  };

  UnigramOptions options;
  options.max_length = max_length;
  options.add_prefix_space = flag(config, "add_prefix_space", true, config_where);
  // XLMRobertaTokenizer builds its Unigram model with unk_id 3, whatever the file says.
  PC_CHECK(pieces.size() > 3, ModelError, where, ": the vocabulary has only ", pieces.size(),
           " pieces; XLM-RoBERTa's puts <unk> at id 3");
  options.unk_id = 3;
  options.bos_id = id_of(token_text(config, "bos_token", "<s>", config_where), "bos");
  options.eos_id = id_of(token_text(config, "eos_token", "</s>", config_where), "eos");
  options.pad_id = id_of(token_text(config, "pad_token", "<pad>", config_where), "pad");

  // The special tokens: tokenizer_config.json's added_tokens_decoder when it has one, else the
  // named special tokens with no stripping, as transformers registers them.
  std::vector<SpecialTextToken> specials;
  if (config.contains("added_tokens_decoder") && config.at("added_tokens_decoder").is_object()) {
    for (const auto& [key, added] : config.at("added_tokens_decoder").items()) {
      const std::string item_where = config_where + " added_tokens_decoder[" + key + "]";
      PC_CHECK(added.is_object() && added.contains("content") && added.at("content").is_string(),
               ModelError, item_where, " has no content");
      const std::string content = added.at("content").get<std::string>();
      PC_CHECK(!flag(added, "normalized", false, item_where) &&
                   !flag(added, "single_word", false, item_where),
               ModelError, item_where, ": added token '", content,
               "' with normalized or single_word true is not supported");
      specials.push_back(SpecialTextToken{content, id_of(content, "added"),
                                          flag(added, "lstrip", false, item_where),
                                          flag(added, "rstrip", false, item_where)});
    }
  } else {
    for (const auto& [key, fallback] :
         {std::pair{"bos_token", "<s>"}, {"eos_token", "</s>"}, {"unk_token", "<unk>"},
          {"sep_token", "</s>"}, {"pad_token", "<pad>"}, {"cls_token", "<s>"},
          {"mask_token", "<mask>"}}) {
      const std::string content = token_text(config, key, fallback, config_where);
      const bool seen = std::any_of(specials.begin(), specials.end(),
                                    [&](const auto& s) { return s.text == content; });
      if (!seen) specials.push_back(SpecialTextToken{content, id_of(content, key), false, false});
    }
  }
  return UnigramTokenizer(std::move(pieces), read_charsmap(tokenizer, where), std::move(specials),
                          options, where);
}

}  // namespace precompute
