// resolve_text_settings (encoders/bert/text_settings.cpp): each setting a model folder may
// decide takes the config's value, else the folder's, else BERT's default, and says which
// (Note [Where a text setting comes from]); a copy of configs/reference.yaml pointed at a
// sentence-transformers folder keeps every one of the folder's settings.

#include "encoders/bert/text_settings.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>

#include "pipeline/core/config.hpp"
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

// A sentence-transformers folder whose every setting differs from BERT's defaults: cased, no
// accent stripping, no splitting of CJK characters, 77 tokens, cls pooling, normalised.
void write_folder(const path& dir) {
  write_file(dir / "config.json",
             R"({"model_type": "bert", "vocab_size": 8, "max_position_embeddings": 512})");
  write_file(dir / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nhello\nworld\n##s\n");
  write_file(dir / "tokenizer_config.json",
             R"({"do_lower_case": false, "strip_accents": false,
                 "tokenize_chinese_chars": false})");
  write_file(dir / "sentence_bert_config.json", R"({"max_seq_length": 77})");
  write_file(dir / "modules.json", R"([
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {"idx": 2, "name": "2", "path": "2_Normalize",
     "type": "sentence_transformers.models.Normalize"}])");
  write_file(dir / "1_Pooling" / "config.json", R"({"pooling_mode_cls_token": true})");
}

// A path as the origins show it: a JSON string.
std::string quoted(const path& p) {
  std::string out = "\"";
  out += p.string();
  out += '"';
  return out;
}

// key -> (value, source)
std::map<std::string, std::pair<std::string, std::string>> origins(const TextSection& text) {
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (const auto& o : text.origins) out[o.key] = {o.value, o.source};
  return out;
}

TEST(TextSettings, ACopyOfTheReferenceConfigKeepsTheFoldersSettings) {
  testing::TempDir dir;
  write_folder(dir.path());
  Config config =
      load_config(std::filesystem::path(PRECOMPUTE_SOURCE_DIR) / "configs/reference.yaml");
  // What the README asks of a user with a Hugging Face folder: the encoder, nothing else.
  config.text.encoder.type = EncoderType::kBert;
  config.text.encoder.path = dir.path();
  resolve_text_settings(config.text);
  const auto got = origins(config.text);
  using Origin = std::pair<std::string, std::string>;
  EXPECT_EQ(got.at("text.tokenizer.vocab"), Origin(quoted(dir.path()), "model folder"));
  EXPECT_EQ(got.at("text.tokenizer.lower_case"), Origin("false", "model folder"));
  EXPECT_EQ(got.at("text.tokenizer.strip_accents"), Origin("false", "model folder"));
  EXPECT_EQ(got.at("text.tokenizer.tokenize_chinese_chars"), Origin("false", "model folder"));
  EXPECT_EQ(got.at("text.tokenizer.max_length"), Origin("77", "model folder"));
  EXPECT_EQ(got.at("text.pooling"), Origin("\"cls\"", "model folder"));
  EXPECT_EQ(got.at("text.normalize"), Origin("true", "model folder"));
  EXPECT_EQ(got.size(), 7u);
  EXPECT_TRUE(config.text.vocab.empty());
  EXPECT_EQ(config.text.max_length, 77);
  EXPECT_EQ(config.text.normalize, true);
}

TEST(TextSettings, WhatTheConfigSetsBeatsTheFolderAndSaysSo) {
  testing::TempDir dir;
  write_folder(dir.path());
  TextSection text;
  text.enabled = true;
  text.encoder = {EncoderType::kBert, dir.path()};
  text.max_length = 32;
  text.normalize = false;
  text.pooling = Pooling::kMean;
  resolve_text_settings(text);
  const auto got = origins(text);
  using Origin = std::pair<std::string, std::string>;
  EXPECT_EQ(got.at("text.tokenizer.max_length"), Origin("32", "config file"));
  EXPECT_EQ(got.at("text.normalize"), Origin("false", "config file"));
  EXPECT_EQ(got.at("text.pooling"), Origin("\"mean\"", "config file"));
  EXPECT_EQ(got.at("text.tokenizer.lower_case"), Origin("false", "model folder"));
}

TEST(TextSettings, ATorchScriptModelTakesBertsDefaults) {
  testing::TempDir dir;
  write_file(dir / "vocab.txt", "[PAD]\n[UNK]\n[CLS]\n[SEP]\n");
  TextSection text;
  text.enabled = true;
  text.encoder = {EncoderType::kTorchScript, dir / "text.pt"};
  text.vocab = dir / "vocab.txt";
  resolve_text_settings(text);
  const auto got = origins(text);
  using Origin = std::pair<std::string, std::string>;
  EXPECT_EQ(got.at("text.tokenizer.vocab"),
            Origin(quoted(dir / "vocab.txt"), "config file"));
  EXPECT_EQ(got.at("text.tokenizer.lower_case"), Origin("true", "default"));
  // Unset, it follows lower_case.
  EXPECT_EQ(got.at("text.tokenizer.strip_accents"), Origin("true", "default"));
  EXPECT_EQ(got.at("text.tokenizer.max_length"), Origin("128", "default"));
  EXPECT_EQ(got.at("text.pooling"), Origin("\"mean\"", "default"));
  EXPECT_EQ(got.at("text.normalize"), Origin("false", "default"));
}

// A folder path is bytes; the origins are JSON text, which must stay valid (index.json embeds
// them): bytes that are not UTF-8 become U+FFFD.
TEST(TextSettings, AFolderPathThatIsNotUtf8IsShownWithReplacementCharacters) {
  testing::TempDir dir;
  const path folder = dir / "model-\xff";
  write_folder(folder);
  TextSection text;
  text.enabled = true;
  text.encoder = {EncoderType::kBert, folder};
  resolve_text_settings(text);
  EXPECT_EQ(origins(text).at("text.tokenizer.vocab").first,
            quoted(dir / "model-\xef\xbf\xbd"));
}

}  // namespace
}  // namespace precompute
