#include "encoders/bert/model_folder.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <sstream>
#include <string_view>
#include <system_error>
#include <utility>

#include "encoders/bert/json_file.hpp"
#include "encoders/bert/unigram_folder.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Json = nlohmann::json;
using std::filesystem::path;

// Note [Where a folder's settings come from]
// precompute must embed a text as the Python libraries would with the same folder, so each
// setting is read from where they read it:
//  - config.json: transformers' BertConfig (XLMRobertaConfig); keys left out take its defaults.
//    BERT and XLM-RoBERTa run natively (model_type bert or xlm-roberta, Bert* or XLMRoberta*
//    architectures, absolute positions, an activation we implement, not a decoder): the same
//    encoder, but for RoBERTa's position numbering.
//  - The tokenizer follows tokenizer.json's model, not model_type: a Unigram model is
//    XLM-RoBERTa's tokenizer (paraphrase-multilingual-MiniLM is a BERT with it), read by
//    read_unigram_tokenizer; otherwise BERT's WordPiece, as below.
//  - modules.json (sentence-transformers): where the Transformer module lives (usually the folder
//    itself), the Pooling module's config.json, and whether a Normalize module follows. Any other
//    module (Dense, ...) changes the embedding, so such a folder is refused rather than embedded
//    differently.
//  - The vocabulary: vocab.txt (what BertTokenizer reads), else tokenizer.json's WordPiece vocab.
//  - Tokenizer options: BertTokenizerFast runs the normalizer of tokenizer.json when there is
//    one, so a BertNormalizer there decides; otherwise it builds one from tokenizer_config.json's
//    arguments (do_lower_case, strip_accents, tokenize_chinese_chars). sentence_bert_config.json's
//    do_lower_case makes sentence-transformers lower-case the text before the normalizer (it
//    prepends a Lowercase normalizer), which leaves accent stripping as the tokenizer had it.
//  - config_sentence_transformers.json: a default_prompt_name makes sentence-transformers put
//    that prompt before every text, so it is the folder's default text.prefix.
//  - max_length: sentence-transformers truncates at sentence_bert_config.json's max_seq_length;
//    transformers at tokenizer_config.json's model_max_length, unless that is its "no limit"
//    placeholder (1e30); without either, at the position table's size, which bounds every case.

// A JSON object's fields read with their types checked; errors name `where` (a file, or a file
// and the object inside it) and the key.
class JsonFields {
 public:
  JsonFields(const Json& object, std::string where) : object_(object), where_(std::move(where)) {
    PC_CHECK(object.is_object(), ModelError, where_, " must be a JSON object, not ",
             object.type_name());
  }

  const std::string& where() const { return where_; }
  // Present and not null.
  bool has(const char* key) const { return contains(key) && !object_.at(key).is_null(); }

  int64_t integer(const char* key, int64_t fallback) const {
    return contains(key) ? as_integer(key) : fallback;
  }
  // Absent: `fallback`; null: none.
  std::optional<int64_t> optional_integer(const char* key, std::optional<int64_t> fallback) const {
    if (!contains(key)) return fallback;
    return object_.at(key).is_null() ? std::nullopt : std::optional(as_integer(key));
  }
  double number(const char* key, double fallback) const {
    if (!contains(key)) return fallback;
    const Json& value = object_.at(key);
    if (!value.is_number()) wrong_type(key, "a number");
    return value.get<double>();
  }
  bool boolean(const char* key, bool fallback) const {
    if (!contains(key)) return fallback;
    const Json& value = object_.at(key);
    if (!value.is_boolean()) wrong_type(key, "true or false");
    return value.get<bool>();
  }
  // Absent or null: none.
  std::optional<bool> optional_boolean(const char* key) const {
    if (!has(key)) return std::nullopt;
    return boolean(key, /*fallback=*/false);  // present, so the fallback is never taken
  }
  std::string string(const char* key, const std::string& fallback) const {
    if (!contains(key)) return fallback;
    const Json& value = object_.at(key);
    if (!value.is_string()) wrong_type(key, "a string");
    return value.get<std::string>();
  }
  // A list of strings; one string counts as a list of one. Absent or null: empty.
  std::vector<std::string> strings(const char* key) const {
    std::vector<std::string> list;
    if (!has(key)) return list;
    const Json& value = object_.at(key);
    if (value.is_string()) return {value.get<std::string>()};
    if (!value.is_array()) wrong_type(key, "a list of strings");
    for (const Json& item : value) {
      if (!item.is_string()) wrong_type(key, "a list of strings");
      list.push_back(item.get<std::string>());
    }
    return list;
  }
  // The object under `key`; nullptr when absent or null.
  const Json* object(const char* key) const {
    if (!has(key)) return nullptr;
    const Json& value = object_.at(key);
    if (!value.is_object()) wrong_type(key, "an object");
    return &value;
  }

 private:
  bool contains(const char* key) const { return object_.contains(key); }
  int64_t as_integer(const char* key) const {
    const Json& value = object_.at(key);
    const bool fits =
        value.is_number_integer() &&
        (!value.is_number_unsigned() ||
         value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int64_t>::max()));
    if (!fits) wrong_type(key, "an integer");
    return value.get<int64_t>();
  }
  [[noreturn]] void wrong_type(const char* key, const char* expected) const {
    PC_THROW(ModelError, where_, ": '", key, "' must be ", expected, ", not ",
             object_.at(key).dump());
  }

  const Json& object_;
  std::string where_;
};

std::string quoted(const path& file) {
  std::ostringstream out;
  out << file;
  return out.str();
}

// The end of every message about a model that is not plain BERT.
constexpr const char* kOnlyBert =
    " is not supported; precompute's native encoder runs BERT-family models (BERT, MiniLM, "
    "BGE/E5/GTE variants with model_type bert) and XLM-RoBERTa ones (multilingual-e5, bge-m3, "
    "model_type xlm-roberta); export other models to TorchScript and use encoder type "
    "torchscript";

// What modules.json says (sentence-transformers); a folder without it is one Transformer module.
struct Modules {
  path transformer_dir;
  std::optional<path> pooling_dir;
  bool normalize = false;
};

Modules read_modules(const path& root) {
  Modules modules{root, std::nullopt, false};
  const path file = root / "modules.json";
  const std::optional<Json> list = read_json_file_if_present(file);
  if (!list) return modules;
  PC_CHECK(list->is_array(), ModelError, file, " must be a list of modules, not ",
           list->type_name());
  bool has_transformer = false;
  for (const Json& entry : *list) {
    const JsonFields module(entry, quoted(file) + " module");
    const std::string type = module.string("type", "");
    const std::string module_path = module.string("path", "");
    const path module_dir = module_path.empty() ? root : root / module_path;
    // sentence-transformers 6 names classes by their new modules (for example
    // sentence_transformers.base.modules.transformer.Transformer), older versions as
    // sentence_transformers.models.Transformer: the class name decides.
    const std::string_view name = std::string_view(type).substr(type.rfind('.') + 1);
    const bool ours = type.starts_with("sentence_transformers.");
    if (ours && name == "Transformer") {
      PC_CHECK(!has_transformer, ModelError, file, " lists two Transformer modules");
      has_transformer = true;
      modules.transformer_dir = module_dir;
    } else if (ours && name == "Pooling") {
      PC_CHECK(!modules.pooling_dir, ModelError, file, " lists two Pooling modules");
      modules.pooling_dir = module_dir;
    } else if (ours && name == "Normalize") {
      modules.normalize = true;
    } else {
      PC_THROW(ModelError, file, ": module '", type,
               "' is not supported; precompute's native encoder runs sentence-transformers "
               "models made of a Transformer, a Pooling and optionally a Normalize module. "
               "Export the whole model to TorchScript and use encoder type torchscript");
    }
  }
  PC_CHECK(has_transformer, ModelError, file, " lists no Transformer module");
  return modules;
}

BertConfig read_bert_config(const path& dir) {
  const path file = dir / "config.json";
  const std::optional<Json> json = read_json_file_if_present(file);
  PC_CHECK(json.has_value(), ModelError, dir,
           " has no config.json; a model folder must hold config.json, vocab.txt or "
           "tokenizer.json, and model.safetensors (or model.safetensors.index.json and its "
           "shards), as save_pretrained writes them");
  const JsonFields fields(*json, quoted(file));
  BertConfig c;
  c.vocab_size = fields.integer("vocab_size", c.vocab_size);
  c.hidden_size = fields.integer("hidden_size", c.hidden_size);
  c.num_hidden_layers = fields.integer("num_hidden_layers", c.num_hidden_layers);
  c.num_attention_heads = fields.integer("num_attention_heads", c.num_attention_heads);
  c.intermediate_size = fields.integer("intermediate_size", c.intermediate_size);
  c.max_position_embeddings = fields.integer("max_position_embeddings", c.max_position_embeddings);
  c.type_vocab_size = fields.integer("type_vocab_size", c.type_vocab_size);
  c.layer_norm_eps = fields.number("layer_norm_eps", c.layer_norm_eps);
  c.hidden_act = fields.string("hidden_act", c.hidden_act);
  c.position_embedding_type = fields.string("position_embedding_type", c.position_embedding_type);
  c.pad_token_id = fields.optional_integer("pad_token_id", c.pad_token_id);
  c.architectures = fields.strings("architectures");
  c.model_type = fields.string("model_type", "");

  // XLMRobertaConfig's defaults differ from BertConfig's only in the padding token.
  if (c.model_type == "xlm-roberta") c.pad_token_id = fields.optional_integer("pad_token_id", 1);
  const auto is_bert_architecture = [](const std::string& a) { return a.starts_with("Bert"); };
  const auto is_xlmr_architecture = [](const std::string& a) {
    return a.starts_with("XLMRoberta");
  };
  if (c.model_type.empty()) {
    // Configs written before transformers recorded model_type; transformers then guesses.
    PC_CHECK(!c.architectures.empty() &&
                 std::all_of(c.architectures.begin(), c.architectures.end(), is_bert_architecture),
             ModelError, file,
             " has no model_type; if it is a BERT model, add \"model_type\": \"bert\"");
    c.model_type = "bert";
  }
  PC_CHECK(c.model_type == "bert" || c.model_type == "xlm-roberta", ModelError, dir,
           ": model_type '", c.model_type, "'", kOnlyBert);
  for (const std::string& architecture : c.architectures) {
    const bool known = c.model_type == "bert" ? is_bert_architecture(architecture)
                                              : is_xlmr_architecture(architecture);
    PC_CHECK(known, ModelError, dir, ": architecture '", architecture, "' with model_type '",
             c.model_type, "'", kOnlyBert);
  }
  if (c.roberta_positions()) {
    PC_CHECK(c.pad_token_id.has_value() && *c.pad_token_id >= 0 &&
                 *c.pad_token_id + 1 < c.max_position_embeddings,
             ModelError, file, ": XLM-RoBERTa needs a pad_token_id from 0 to ",
             c.max_position_embeddings - 2, " (its positions start after it)");
  }
  PC_CHECK(c.position_embedding_type == "absolute", ModelError, dir, ": position_embedding_type '",
           c.position_embedding_type, "' (only absolute is)", kOnlyBert);
  const bool known_activation = c.hidden_act == "gelu" || c.hidden_act == "gelu_new" ||
                                c.hidden_act == "gelu_pytorch_tanh" || c.hidden_act == "relu";
  PC_CHECK(known_activation, ModelError, dir, ": hidden_act '", c.hidden_act,
           "' (gelu, gelu_new, gelu_pytorch_tanh and relu are)", kOnlyBert);
  PC_CHECK(!fields.boolean("is_decoder", false), ModelError, dir,
           ": is_decoder true (causal attention)", kOnlyBert);

  for (const auto& [key, value] : {std::pair{"vocab_size", c.vocab_size},
                                   {"hidden_size", c.hidden_size},
                                   {"num_hidden_layers", c.num_hidden_layers},
                                   {"num_attention_heads", c.num_attention_heads},
                                   {"intermediate_size", c.intermediate_size},
                                   {"max_position_embeddings", c.max_position_embeddings},
                                   {"type_vocab_size", c.type_vocab_size}}) {
    PC_CHECK(value > 0, ModelError, file, ": ", key, " must be positive, not ", value);
  }
  PC_CHECK(c.hidden_size % c.num_attention_heads == 0, ModelError, file, ": hidden_size ",
           c.hidden_size, " is not a multiple of num_attention_heads ", c.num_attention_heads);
  PC_CHECK(c.layer_norm_eps > 0, ModelError, file, ": layer_norm_eps must be positive, not ",
           c.layer_norm_eps);
  return c;
}

// vocab.txt as WordPieceTokenizer::from_vocab_file reads it: one token per line, the id is the
// line number, a trailing CR is dropped.
std::vector<std::string> read_vocab_txt(const path& file) {
  std::ifstream in(file, std::ios::binary);
  PC_CHECK(in.is_open(), ModelError, "cannot read ", file);
  std::vector<std::string> vocab;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    vocab.push_back(line);
  }
  PC_CHECK(!in.bad(), ModelError, "error while reading ", file);
  return vocab;
}

// tokenizer.json's "model", checked to be BERT's WordPiece.
JsonFields wordpiece_model(const Json& tokenizer, const std::string& where) {
  const Json* model = JsonFields(tokenizer, where).object("model");
  PC_CHECK(model != nullptr, ModelError, where, " has no model");
  JsonFields wordpiece(*model, where + " model");
  const std::string type = wordpiece.string("type", "");
  PC_CHECK(type == "WordPiece", ModelError, where, ": model type '", type,
           "' is not WordPiece; precompute tokenizes as BERT does");
  PC_CHECK(wordpiece.string("continuing_subword_prefix", "##") == "##", ModelError, where,
           ": continuing_subword_prefix must be ##, as BERT's");
  return wordpiece;
}

// The WordPiece model's vocab {token: id}, as a list by id. An id no token has (a token that
// appeared twice in the vocab.txt it was made from) stays an empty token, which never matches:
// neither library can produce that id either.
std::vector<std::string> vocab_from_tokenizer_json(const JsonFields& model,
                                                   const BertConfig& config) {
  const Json* tokens = model.object("vocab");
  PC_CHECK(tokens != nullptr && !tokens->empty(), ModelError, model.where(),
           " has no vocab (token -> id)");
  std::vector<std::string> vocab;
  for (const auto& [token, id] : tokens->items()) {
    PC_CHECK(
        id.is_number_unsigned() && id.get<uint64_t>() < static_cast<uint64_t>(config.vocab_size),
        ModelError, model.where(), ": token '", token, "' has id ", id.dump(),
        ", outside config.json's vocab_size ", config.vocab_size);
    const auto index = id.get<size_t>();
    if (index >= vocab.size()) vocab.resize(index + 1);
    PC_CHECK(vocab[index].empty(), ModelError, model.where(), ": tokens '", vocab[index], "' and '",
             token, "' have the same id ", index);
    vocab[index] = token;
  }
  return vocab;
}

void check_vocab(const std::vector<std::string>& vocab, const std::string& source,
                 const BertConfig& config) {
  PC_CHECK(!vocab.empty(), ModelError, source, " is empty");
  for (const char* special : {"[CLS]", "[SEP]", "[PAD]", "[UNK]"}) {
    PC_CHECK(std::find(vocab.begin(), vocab.end(), special) != vocab.end(), ModelError, source,
             " has no ", special, " token; it is not a BERT WordPiece vocabulary");
  }
  PC_CHECK(static_cast<int64_t>(vocab.size()) <= config.vocab_size, ModelError, source, " has ",
           vocab.size(), " tokens but config.json's vocab_size is ", config.vocab_size,
           ": the vocabulary and the model do not belong together");
}

// Pooling of a sentence-transformers Pooling module's config.json: sentence-transformers 6 writes
// "pooling_mode" (a name or a list), older versions one pooling_mode_* flag per mode.
Pooling read_pooling(const path& pooling_dir, const BertConfig& config) {
  const path file = pooling_dir / "config.json";
  const std::optional<Json> json = read_json_file_if_present(file);
  PC_CHECK(json.has_value(), ModelError, "modules.json lists a Pooling module in ", pooling_dir,
           ", which has no config.json");
  const JsonFields fields(*json, quoted(file));
  std::vector<std::string> modes;
  if (fields.has("pooling_mode")) {
    modes = fields.strings("pooling_mode");
  } else {
    // In the order sentence-transformers concatenates them.
    for (const auto& [key, mode] : {std::pair{"pooling_mode_cls_token", "cls"},
                                    {"pooling_mode_max_tokens", "max"},
                                    {"pooling_mode_mean_tokens", "mean"},
                                    {"pooling_mode_mean_sqrt_len_tokens", "mean_sqrt_len_tokens"},
                                    {"pooling_mode_weightedmean_tokens", "weightedmean"},
                                    {"pooling_mode_lasttoken", "lasttoken"}}) {
      if (fields.boolean(key, false)) modes.emplace_back(mode);
    }
    if (modes.empty()) modes.emplace_back("mean");  // sentence-transformers' default
  }
  PC_CHECK(modes.size() == 1, ModelError, file, ": ", modes.size(),
           " pooling modes combined (their vectors concatenated) is not supported; precompute "
           "pools with one of mean, cls or max");
  for (const char* key : {"embedding_dimension", "word_embedding_dimension"}) {
    const int64_t dim = fields.integer(key, config.hidden_size);
    PC_CHECK(dim == config.hidden_size, ModelError, file, ": ", key, " ", dim,
             " differs from config.json's hidden_size ", config.hidden_size);
  }
  const std::string& mode = modes.front();
  if (mode == "mean") return Pooling::kMean;
  if (mode == "cls") return Pooling::kCls;
  if (mode == "max") return Pooling::kMax;
  PC_THROW(ModelError, file, ": pooling mode '", mode,
           "' is not supported; precompute pools with mean, cls or max");
}

struct TokenizerFiles {
  std::optional<Json> tokenizer;             // tokenizer.json
  std::optional<Json> tokenizer_config;      // tokenizer_config.json
  std::optional<Json> sentence_bert_config;  // sentence_bert_config.json
};

// Tokenizer options but max_length (Note [Where a folder's settings come from]).
TokenizerOptions read_tokenizer_options(const path& dir, const TokenizerFiles& files) {
  TokenizerOptions options;  // BertTokenizerFast's defaults
  bool from_normalizer = false;
  if (files.tokenizer) {
    const std::string where = quoted(dir / "tokenizer.json");
    const int64_t max_chars = wordpiece_model(*files.tokenizer, where)
                                  .integer("max_input_chars_per_word", options.max_chars_per_word);
    PC_CHECK(max_chars >= 1 && max_chars <= std::numeric_limits<int>::max(), ModelError, where,
             ": max_input_chars_per_word must be a positive int, not ", max_chars);
    options.max_chars_per_word = static_cast<int>(max_chars);
    const Json* normalizer = JsonFields(*files.tokenizer, where).object("normalizer");
    if (normalizer != nullptr) {
      const JsonFields bert(*normalizer, where + " normalizer");
      if (bert.string("type", "") == "BertNormalizer") {
        PC_CHECK(bert.boolean("clean_text", true), ModelError, where,
                 ": BertNormalizer clean_text false is not supported; precompute always removes "
                 "control characters and normalises whitespace, as BERT does by default");
        options.tokenize_chinese_chars = bert.boolean("handle_chinese_chars", true);
        options.strip_accents = bert.optional_boolean("strip_accents");
        options.lower_case = bert.boolean("lowercase", true);
        from_normalizer = true;
      }
    }
  }
  if (!from_normalizer && files.tokenizer_config) {
    const JsonFields config(*files.tokenizer_config, quoted(dir / "tokenizer_config.json"));
    options.lower_case = config.boolean("do_lower_case", true);
    options.strip_accents = config.optional_boolean("strip_accents");
    options.tokenize_chinese_chars = config.boolean("tokenize_chinese_chars", true);
  }
  if (files.sentence_bert_config) {
    const JsonFields config(*files.sentence_bert_config, quoted(dir / "sentence_bert_config.json"));
    if (config.boolean("do_lower_case", false)) {
      options.strip_accents = options.strip_accents.value_or(options.lower_case);
      options.lower_case = true;
    }
  }
  return options;
}

// Sets options.max_length and says where it came from (Note [Where a folder's settings come
// from]).
std::string resolve_max_length(const path& dir, const TokenizerFiles& files,
                               const BertConfig& config, TokenizerOptions& options) {
  // transformers' "no limit" is 1e30; anything this large is not a real limit.
  constexpr double kUnlimited = 1e6;
  int64_t length = config.max_sequence_length();
  std::string source = config.roberta_positions()
                           ? "config.json max_position_embeddings - pad_token_id - 1"
                           : "config.json max_position_embeddings";
  std::optional<JsonFields> sentence_bert;
  if (files.sentence_bert_config) {
    sentence_bert.emplace(*files.sentence_bert_config, quoted(dir / "sentence_bert_config.json"));
  }
  if (sentence_bert && sentence_bert->has("max_seq_length")) {
    length = sentence_bert->integer("max_seq_length", length);
    source = "sentence_bert_config.json max_seq_length";
  } else if (files.tokenizer_config) {
    const JsonFields tokenizer_config(*files.tokenizer_config,
                                      quoted(dir / "tokenizer_config.json"));
    const double model_max_length = tokenizer_config.number("model_max_length", kUnlimited);
    if (model_max_length < kUnlimited) {
      length = static_cast<int64_t>(model_max_length);
      source = "tokenizer_config.json model_max_length";
    }
  }
  if (length > config.max_sequence_length()) {
    source += " " + std::to_string(length) + ", capped at config.json " +
              (config.roberta_positions()
                   ? "max_position_embeddings - pad_token_id - 1 (" +
                         std::to_string(config.max_sequence_length()) + ")"
                   : std::string("max_position_embeddings"));
    length = config.max_sequence_length();
  }
  PC_CHECK(length >= 2, ModelError, dir, ": the maximum sequence length from ", source, " is ",
           length, "; it must leave room for the tokens around the text ([CLS] and [SEP], or <s> "
           "and </s>)");
  options.max_length = static_cast<int>(length);
  return source;
}

// The prompt sentence-transformers puts before every text by default (Note [Where a folder's
// settings come from]); empty when there is none.
std::string read_default_prefix(const path& root) {
  const path file = root / "config_sentence_transformers.json";
  const std::optional<Json> json = read_json_file_if_present(file);
  if (!json) return "";
  const JsonFields fields(*json, quoted(file));
  const std::string name = fields.has("default_prompt_name")
                               ? fields.string("default_prompt_name", "")
                               : std::string();
  if (name.empty()) return "";
  const Json* prompts = fields.object("prompts");
  PC_CHECK(prompts != nullptr && prompts->contains(name) && prompts->at(name).is_string(),
           ModelError, file, ": default_prompt_name '", name, "' names no prompt in 'prompts'");
  return prompts->at(name).get<std::string>();
}

bool pooling_excludes_prompt(const path& pooling_dir) {
  const std::optional<Json> json = read_json_file_if_present(pooling_dir / "config.json");
  if (!json) return false;
  return !JsonFields(*json, quoted(pooling_dir / "config.json")).boolean("include_prompt", true);
}

// Note [Reading a folder once]
// A run reads its text model folder several times at start-up (settings, tokenizer, encoder,
// memory probe), and an XLM-R tokenizer.json is 17 MB of JSON with 250,002 pieces to index:
// parsing it each time cost seconds. So a folder read is kept for the process, keyed by its path,
// and used again while every file it was read from has the same size and modification time (a
// folder rewritten in place is read again). Only folders read without error are kept.
struct FileStamp {
  path file;
  std::uintmax_t size = 0;
  std::filesystem::file_time_type modified{};
  bool exists = false;

  static FileStamp of(const path& file) {
    FileStamp stamp{file};
    std::error_code error;
    stamp.exists = std::filesystem::is_regular_file(file, error);
    if (stamp.exists) {
      stamp.size = std::filesystem::file_size(file, error);
      stamp.modified = std::filesystem::last_write_time(file, error);
    }
    return stamp;
  }
  bool unchanged() const {
    const FileStamp now = of(file);
    return now.exists == exists && now.size == size && now.modified == modified;
  }
};

std::vector<FileStamp> stamps_of(const path& root, const ModelFolder& folder,
                                 const std::optional<path>& pooling_dir) {
  std::vector<path> files = {root / "modules.json", root / "config_sentence_transformers.json"};
  for (const char* name : {"config.json", "tokenizer.json", "tokenizer_config.json",
                           "sentence_bert_config.json", "vocab.txt"}) {
    files.push_back(folder.dir / name);
  }
  if (pooling_dir) files.push_back(*pooling_dir / "config.json");
  std::vector<FileStamp> stamps;
  for (const path& file : files) stamps.push_back(FileStamp::of(file));
  return stamps;
}

ModelFolder read_model_folder_files(const path& root, std::optional<path>& pooling_dir);

}  // namespace

ModelFolder read_model_folder(const path& root) {
  struct Entry {
    std::vector<FileStamp> stamps;
    ModelFolder folder;
  };
  static std::mutex mutex;
  static std::map<std::string, Entry> cache;
  {
    const std::lock_guard lock(mutex);
    const auto it = cache.find(root.string());
    if (it != cache.end() &&
        std::all_of(it->second.stamps.begin(), it->second.stamps.end(),
                    [](const FileStamp& s) { return s.unchanged(); })) {
      return it->second.folder;
    }
  }
  // Stamped after reading (the files to stamp are known then): a file rewritten during the read
  // would be kept with its new stamp, which a model folder under a starting job never is.
  std::optional<path> pooling_dir;
  ModelFolder folder = read_model_folder_files(root, pooling_dir);
  std::vector<FileStamp> stamps = stamps_of(root, folder, pooling_dir);
  const std::lock_guard lock(mutex);
  cache[root.string()] = Entry{std::move(stamps), folder};
  return folder;
}

namespace {

ModelFolder read_model_folder_files(const path& root, std::optional<path>& pooling_dir) {
  std::error_code ignored;
  PC_CHECK(std::filesystem::is_directory(root, ignored), ModelError, "the model folder ", root,
           " does not exist or is not a folder; give the folder save_pretrained wrote (with "
           "config.json, the tokenizer files and model.safetensors)");
  const Modules modules = read_modules(root);

  ModelFolder folder;
  folder.dir = modules.transformer_dir;
  folder.config = read_bert_config(folder.dir);

  const TokenizerFiles files{read_json_file_if_present(folder.dir / "tokenizer.json"),
                             read_json_file_if_present(folder.dir / "tokenizer_config.json"),
                             read_json_file_if_present(folder.dir / "sentence_bert_config.json")};
  const path vocab_txt = folder.dir / "vocab.txt";
  if (files.tokenizer && is_unigram_tokenizer(*files.tokenizer)) {
    folder.tokenizer_kind = TokenizerKind::kUnigram;
    // sentence-transformers would lower-case the text with Python's str.lower() first, which
    // the Unigram path does not reproduce: refused rather than embedded otherwise.
    if (files.sentence_bert_config) {
      const JsonFields config(*files.sentence_bert_config,
                              quoted(folder.dir / "sentence_bert_config.json"));
      PC_CHECK(!config.boolean("do_lower_case", false), ModelError, config.where(),
               ": do_lower_case true with an XLM-RoBERTa (Unigram) tokenizer is not supported; "
               "precompute would not lower-case the captions as sentence-transformers does. "
               "Lower-case the captions yourself and set do_lower_case to false");
    }
    folder.max_length_source =
        resolve_max_length(folder.dir, files, folder.config, folder.tokenizer);
    // Read here, so that a tokenizer precompute cannot reproduce fails at start-up.
    folder.unigram = std::make_shared<const UnigramTokenizer>(
        read_unigram_tokenizer(folder.dir, folder.tokenizer.max_length, &*files.tokenizer));
    const UnigramTokenizer& tokenizer = *folder.unigram;
    PC_CHECK(static_cast<int64_t>(tokenizer.vocab_size()) <= folder.config.vocab_size, ModelError,
             folder.dir / "tokenizer.json", " has ", tokenizer.vocab_size(),
             " pieces but config.json's vocab_size is ", folder.config.vocab_size,
             ": the tokenizer and the model do not belong together");
  } else if (is_regular_file_quietly(vocab_txt)) {
    folder.vocab = read_vocab_txt(vocab_txt);
    check_vocab(folder.vocab, quoted(vocab_txt), folder.config);
  } else {
    // Older XLM-R folders ship only SentencePiece's file, which transformers converts on load.
    PC_CHECK(files.tokenizer.has_value() ||
                 !is_regular_file_quietly(folder.dir / "sentencepiece.bpe.model"),
             ModelError, folder.dir,
             " has sentencepiece.bpe.model but no tokenizer.json; write it once with Python: "
             "transformers.AutoTokenizer.from_pretrained(FOLDER).save_pretrained(FOLDER)");
    PC_CHECK(files.tokenizer.has_value(), ModelError, folder.dir,
             " has neither vocab.txt nor tokenizer.json; one of them holds the vocabulary");
    const std::string where = quoted(folder.dir / "tokenizer.json");
    folder.vocab =
        vocab_from_tokenizer_json(wordpiece_model(*files.tokenizer, where), folder.config);
    check_vocab(folder.vocab, where, folder.config);
  }
  if (folder.tokenizer_kind == TokenizerKind::kWordPiece) {
    folder.tokenizer = read_tokenizer_options(folder.dir, files);
    folder.max_length_source =
        resolve_max_length(folder.dir, files, folder.config, folder.tokenizer);
  }

  pooling_dir = modules.pooling_dir;
  if (modules.pooling_dir) {
    folder.pooling = read_pooling(*modules.pooling_dir, folder.config);
    folder.pooling_excludes_prompt = pooling_excludes_prompt(*modules.pooling_dir);
  }
  folder.normalize = modules.normalize;
  folder.default_prefix = read_default_prefix(root);
  return folder;
}

}  // namespace
}  // namespace precompute
