#include "storage/output_index.hpp"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <vector>
#include <fstream>
#include <iterator>
#include <string>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/output_id.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;

OutputIndex make_index() {
  OutputIndex index;
  ShardMeta& meta = index.meta;
  meta.tool_version = "0.1.0";
  meta.config_fingerprint = std::string(64, 'e');
  meta.output_id = output_id_for(meta.config_fingerprint);
  // As full_config_json() writes it: compact, keys sorted.
  meta.config_json = R"({"output":{"dtype":"float16","shard_size":2},"video":{"fps":2.0}})";
  meta.dtype = StorageDtype::kFloat16;
  meta.chunk_rows = 128;

  ModalitySchema video;
  video.modality = Modality::kVideo;
  video.per_step = true;
  video.dim = 512;
  video.encoder = "clip_visual.pt";
  video.encoder_sha256 = std::string(64, 'a');
  video.pooling = "none";
  video.preprocessing_json = R"({"fps":2.0,"height":224,"width":224})";
  meta.modalities[modality_index(Modality::kVideo)] = video;

  ModalitySchema text;
  text.modality = Modality::kText;
  text.dim = 384;
  text.encoder = "minilm.pt";
  text.encoder_sha256 = std::string(64, 'b');
  text.pooling = "mean";
  text.preprocessing_json = R"({"lower_case":true,"max_length":128})";
  meta.modalities[modality_index(Modality::kText)] = text;

  index.total_samples = 3;
  index.shard_size = 2;
  index.input = "/data/manifest é.jsonl";
  index.input_samples = 3;
  index.input_sha256 = std::string(64, 'c');
  IndexEntry first{"shard-000000-11111111.h5", 0, 0, 2, 2, 1, 1, {2, 0, 1}, 123456,
                   std::string(64, '1')};
  IndexEntry second{"shard-000001-22222222.h5", 1, 2, 1, 1, 0, 0, {1, 0, 1}, 7890,
                    std::string(64, '2')};
  index.shards = {first, second};
  index.model_settings = {{"text.normalize", "true", "model folder"},
                          {"text.tokenizer.max_length", "77", "config file"},
                          {"text.pooling", "\"mean\"", "default"}};
  return index;
}

void expect_same_index(const OutputIndex& expected, const OutputIndex& actual) {
  EXPECT_EQ(actual.meta.tool_version, expected.meta.tool_version);
  EXPECT_EQ(actual.meta.output_id, expected.meta.output_id);
  EXPECT_EQ(actual.meta.config_fingerprint, expected.meta.config_fingerprint);
  EXPECT_EQ(actual.meta.config_json, expected.meta.config_json);
  EXPECT_EQ(actual.meta.dtype, expected.meta.dtype);
  EXPECT_EQ(actual.meta.chunk_rows, expected.meta.chunk_rows);
  for (Modality m : kAllModalities) {
    const auto& want = expected.meta.modalities[modality_index(m)];
    const auto& got = actual.meta.modalities[modality_index(m)];
    ASSERT_EQ(got.has_value(), want.has_value()) << modality_name(m);
    if (!want) continue;
    EXPECT_EQ(got->modality, want->modality);
    EXPECT_EQ(got->per_step, want->per_step);
    EXPECT_EQ(got->dim, want->dim);
    EXPECT_EQ(got->encoder, want->encoder);
    EXPECT_EQ(got->encoder_sha256, want->encoder_sha256);
    EXPECT_EQ(got->pooling, want->pooling);
    EXPECT_EQ(got->preprocessing_json, want->preprocessing_json);
  }
  EXPECT_EQ(actual.total_samples, expected.total_samples);
  EXPECT_EQ(actual.shard_size, expected.shard_size);
  EXPECT_EQ(actual.input, expected.input);
  EXPECT_EQ(actual.model_settings, expected.model_settings);
  ASSERT_EQ(actual.shards.size(), expected.shards.size());
  for (size_t i = 0; i < expected.shards.size(); ++i) {
    EXPECT_EQ(actual.shards[i].file, expected.shards[i].file);
    EXPECT_EQ(actual.shards[i].shard_index, expected.shards[i].shard_index);
    EXPECT_EQ(actual.shards[i].first_seq, expected.shards[i].first_seq);
    EXPECT_EQ(actual.shards[i].seq_count, expected.shards[i].seq_count);
    EXPECT_EQ(actual.shards[i].num_samples, expected.shards[i].num_samples);
    EXPECT_EQ(actual.shards[i].num_failures, expected.shards[i].num_failures);
    EXPECT_EQ(actual.shards[i].failed_samples, expected.shards[i].failed_samples);
    EXPECT_EQ(actual.shards[i].modality_counts, expected.shards[i].modality_counts);
    EXPECT_EQ(actual.shards[i].bytes, expected.shards[i].bytes);
    EXPECT_EQ(actual.shards[i].sha256, expected.shards[i].sha256);
  }
}

class OutputIndexTest : public ::testing::Test {
 protected:

  fs::path index_file() const { return dir_ / kIndexFileName; }

  // In the file's order, so that an edit changes only what it edits.
  nlohmann::ordered_json written_json() const {
    std::ifstream in(index_file());
    return nlohmann::ordered_json::parse(in);
  }

  void write_text(const std::string& text) const {
    std::ofstream(index_file(), std::ios::trunc) << text;
  }

  // Expects read_index() to fail with a message naming index.json and `fragment`.
  void expect_damaged(const std::string& fragment) const {
    try {
      read_index(dir_);
      ADD_FAILURE() << "expected the index to be rejected";
    } catch (const StorageError& error) {
      const std::string message = error.what();
      EXPECT_NE(message.find(index_file().string()), std::string::npos) << message;
      EXPECT_NE(message.find(fragment), std::string::npos) << message;
    }
  }

  testing::TempDir temp_;
  const fs::path dir_ = temp_.path();
};

TEST_F(OutputIndexTest, NoIndexReadsAsNothing) { EXPECT_FALSE(read_index(dir_).has_value()); }

TEST_F(OutputIndexTest, RoundTripKeepsEveryField) {
  const OutputIndex index = make_index();
  write_index(dir_, index);
  const auto read = read_index(dir_);
  ASSERT_TRUE(read.has_value());
  expect_same_index(index, *read);
}

TEST_F(OutputIndexTest, AnEmptyRunRoundTrips) {
  OutputIndex index;
  index.meta.modalities = {};
  index.meta.output_id = output_id_for(std::string(64, '0'));
  write_index(dir_, index);
  const auto read = read_index(dir_);
  ASSERT_TRUE(read.has_value());
  expect_same_index(index, *read);
}

TEST_F(OutputIndexTest, WritesTheDocumentedFields) {
  write_index(dir_, make_index());
  const nlohmann::ordered_json json = written_json();
  EXPECT_EQ(json["format"], "precompute-index");
  EXPECT_EQ(json["format_version"], 1);
  EXPECT_EQ(json["storage_dtype"], "float16");
  EXPECT_EQ(json["chunk_rows"], 128);
  EXPECT_EQ(json["config"]["video"]["fps"], 2.0);  // an object, not a string
  EXPECT_EQ(json["modalities"]["video"]["layout"], "per_step");
  EXPECT_EQ(json["modalities"]["video"]["dim"], 512);
  EXPECT_EQ(json["modalities"]["text"]["layout"], "pooled");
  EXPECT_EQ(json["modalities"]["text"]["preprocessing"]["max_length"], 128);
  EXPECT_FALSE(json["modalities"].contains("audio"));
  EXPECT_EQ(json["shards"][0]["modality_counts"]["video"], 2);
  EXPECT_EQ(json["shards"][0]["modality_counts"]["text"], 1);
  EXPECT_EQ(json["shards"][1]["bytes"], 7890);
  EXPECT_EQ(json["totals"]["samples"], 3);
  EXPECT_EQ(json["totals"]["failures"], 1);
  EXPECT_EQ(json["model_settings"]["text.normalize"],
            nlohmann::ordered_json({{"value", true}, {"source", "model folder"}}));
  EXPECT_EQ(json["model_settings"]["text.tokenizer.max_length"]["value"], 77);
  EXPECT_EQ(json["model_settings"]["text.pooling"]["value"], "mean");
}

// An index written before model_settings existed still reads (its outputs resume); one whose
// settings are not what the writer writes is damaged.
TEST_F(OutputIndexTest, ModelSettingsAreOptionalButCheckedWhenThere) {
  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json.erase("model_settings");
  json.erase("checksum");
  json["checksum"] = sha256_hex(json.dump(-1, ' ', false));
  write_text(json.dump(2));
  const auto read = read_index(dir_);
  ASSERT_TRUE(read.has_value());
  EXPECT_TRUE(read->model_settings.empty());

  json = written_json();
  json["model_settings"]["text.normalize"] = true;
  json.erase("checksum");
  json["checksum"] = sha256_hex(json.dump(-1, ' ', false));
  write_text(json.dump(2));
  expect_damaged("'model_settings.text.normalize' is not an object with a value");
}

TEST_F(OutputIndexTest, ReplacesThePreviousIndex) {
  OutputIndex index = make_index();
  write_index(dir_, index);
  index.shards.pop_back();
  write_index(dir_, index);
  const auto read = read_index(dir_);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->shards.size(), 1u);
  EXPECT_EQ(std::distance(fs::directory_iterator(dir_), fs::directory_iterator()), 1);
}

TEST_F(OutputIndexTest, DetectsATornFile) {
  write_index(dir_, make_index());
  std::ifstream in(index_file());
  const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  write_text(text.substr(0, text.size() / 2));
  expect_damaged("not valid JSON");
}

TEST_F(OutputIndexTest, DetectsAMissingField) {
  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json["shards"][1].erase("sha256");
  write_text(json.dump());
  expect_damaged("'shards[1].sha256' is missing");
}

TEST_F(OutputIndexTest, DetectsAFieldOfTheWrongType) {
  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json["modalities"]["video"]["dim"] = "512";
  write_text(json.dump());
  expect_damaged("'modalities.video.dim' is not an integer");
}

TEST_F(OutputIndexTest, DetectsTotalsThatDoNotMatchTheShards) {
  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json["shards"][0]["num_failures"] = 5;
  write_text(json.dump());
  expect_damaged("'totals' do not match");
}

TEST_F(OutputIndexTest, ACheckedRecordChangedWhereTheJsonStillParsesIsCaughtByTheChecksum) {
  write_index(dir_, make_index());
  const auto read = read_index(dir_);
  ASSERT_TRUE(read.has_value());
  EXPECT_EQ(read->input_samples, 3);
  EXPECT_EQ(read->input_sha256, std::string(64, 'c'));
  for (const char* field : {"sha256", "bytes", "first_seq", "failed_samples"}) {
    write_index(dir_, make_index());
    nlohmann::ordered_json json = written_json();
    auto& value = json["shards"][1][field];
    if (value.is_string()) {
      value = std::string(64, '3');
    } else {
      value = value.get<int64_t>() + 1;
    }
    write_text(json.dump());
    expect_damaged("checksum does not match");
  }
  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json["input_sha256"] = std::string(64, 'd');
  write_text(json.dump());
  expect_damaged("checksum does not match");
}

TEST_F(OutputIndexTest, AnyEditedFieldIsCaughtByTheChecksum) {
  // What verify, inspect and the reader trust: a modality's dim, layout, pooling and settings,
  // the dtype, the output id, the rank's span; not only the records a resume trusts.
  const auto edits = std::vector<std::function<void(nlohmann::ordered_json&)>>{
      [](auto& j) { j["modalities"]["video"]["dim"] = 256; },
      [](auto& j) { j["modalities"]["text"]["layout"] = "per_step"; },
      [](auto& j) { j["modalities"]["text"]["pooling"] = "cls"; },
      [](auto& j) { j["modalities"]["video"]["preprocessing"]["fps"] = 4.0; },
      [](auto& j) { j["storage_dtype"] = "float32"; },
      [](auto& j) { j["chunk_rows"] = 64; },
      [](auto& j) { j["shard_size"] = 3; },
      [](auto& j) { j["config"]["video"]["fps"] = 1.0; },
      [](auto& j) { j["output_id"] = output_id_for(std::string(64, '7')); },
      [](auto& j) { j["shards"][0]["shard_index"] = 5; },
      [](auto& j) { j["model_settings"]["text.normalize"]["source"] = "config file"; },
  };
  for (size_t i = 0; i < edits.size(); ++i) {
    write_index(dir_, make_index());
    nlohmann::ordered_json json = written_json();
    edits[i](json);
    write_text(json.dump(2));
    SCOPED_TRACE(i);
    expect_damaged("checksum does not match");
  }
  // Written again as the writer formats it, an unedited index reads back.
  write_index(dir_, make_index());
  write_text(written_json().dump(2) + "\n");
  EXPECT_NO_THROW(read_index(dir_));
}

TEST_F(OutputIndexTest, AShardFileThatIsNotAShardNameIsDamageNotAPathToFollow) {
  for (const char* name : {"../victim.h5", "/etc/passwd", "sub/shard-000000-11111111.h5",
                           "shard-000000.h5", "index.json", ".."}) {
    OutputIndex index = make_index();
    index.shards[0].file = name;
    write_index(dir_, index);
    SCOPED_TRACE(name);
    expect_damaged("which is not a shard file name");
  }
}

TEST_F(OutputIndexTest, ARankFoldersSpanRoundTripsAndSetsWhatItCovers) {
  OutputIndex index = make_index();
  EXPECT_EQ(index.covers_first(), 0);
  EXPECT_EQ(index.covers_end(), 3);
  index.rank = IndexRank{1, 2, 2, 3};
  write_index(dir_, index);
  const auto read = read_index(dir_);
  ASSERT_TRUE(read && read->rank);
  EXPECT_EQ(read->rank->rank, 1);
  EXPECT_EQ(read->rank->world_size, 2);
  EXPECT_EQ(read->covers_first(), 2);
  EXPECT_EQ(read->covers_end(), 3);
  EXPECT_EQ(written_json()["rank"]["end_seq"], 3);
  write_index(dir_, make_index());
  EXPECT_TRUE(written_json()["rank"].is_null());
}

TEST_F(OutputIndexTest, TheDigestIsTheWrittenFilesSha256) {
  const OutputIndex index = make_index();
  const std::string digest = write_index(dir_, index);
  EXPECT_EQ(digest, sha256_file(index_file()));
  EXPECT_EQ(digest, index_sha256(index));
  OutputIndex other = index;
  other.shards.pop_back();
  EXPECT_NE(index_sha256(other), digest);
}

TEST_F(OutputIndexTest, RejectsAnotherFormatOrVersion) {
  write_text(R"({"format": "something-else", "format_version": 1})");
  expect_damaged("is not a precompute index");

  write_index(dir_, make_index());
  nlohmann::ordered_json json = written_json();
  json["format_version"] = 2;
  write_text(json.dump());
  expect_damaged("has format version 2");
}

TEST_F(OutputIndexTest, RejectsAnArrayAtTheTop) {
  write_text("[1, 2, 3]");
  expect_damaged("not a JSON object");
}

}  // namespace
}  // namespace precompute
