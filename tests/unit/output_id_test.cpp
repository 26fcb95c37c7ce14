// The output id (storage/output_id.hpp): made from the config fingerprint, and found in a file's
// bytes without parsing it, near the start of the files the tool writes (Note [Proving a file is
// ours]).

#include "storage/output_id.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "storage/output_index.hpp"
#include "storage/shard_writer.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;
using testing::TempDir;

TEST(OutputIdTest, IsThePrefixAndTheFingerprintsFirst32Digits) {
  const std::string fingerprint = "0123456789abcdef0123456789abcdef" + std::string(32, 'e');
  EXPECT_EQ(output_id_for(fingerprint), "precompute-output-0123456789abcdef0123456789abcdef");
  EXPECT_TRUE(is_output_id(output_id_for(fingerprint)));
  for (const char* text : {"", "precompute-output-", "precompute-output-0123456789abcdef",
                           "precompute-output-0123456789ABCDEF0123456789abcdef",
                           "precompute-outpt-0123456789abcdef0123456789abcdef",
                           "precompute-output-0123456789abcdef0123456789abcdef0"}) {
    EXPECT_FALSE(is_output_id(text)) << text;
  }
}

TEST(OutputIdTest, IsFoundWhereverItIsAndNotWhereItIsBroken) {
  TempDir tmp;
  const std::string id = output_id_for(std::string(64, '5'));
  const fs::path file = tmp.path() / "f";
  // Cut by the 64 KiB blocks of the scan, at every offset around the boundary.
  for (size_t before = 65536 - 60; before <= 65536 + 2; ++before) {
    std::ofstream(file, std::ios::trunc) << std::string(before, 'x') << id << "tail";
    ASSERT_EQ(find_output_id(file), id) << before;
  }
  // A prefix alone, then the real id later: the first whole one.
  std::ofstream(file, std::ios::trunc) << "precompute-output-zz" << std::string(70000, ' ') << id;
  EXPECT_EQ(find_output_id(file), id);
  // A digit lost to damage, or the id cut by the end of the file.
  std::string broken = id;
  broken[25] = 'z';
  std::ofstream(file, std::ios::trunc) << broken;
  EXPECT_EQ(find_output_id(file), std::nullopt);
  std::ofstream(file, std::ios::trunc) << id.substr(0, id.size() - 1);
  EXPECT_EQ(find_output_id(file), std::nullopt);
  std::ofstream(file, std::ios::trunc);
  EXPECT_EQ(find_output_id(file), std::nullopt);
  EXPECT_THROW(find_output_id(tmp.path() / "missing"), StorageError);
}

// The scan stops at the first block that holds the id: the writers put it first.
TEST(OutputIdTest, TheIdOfAShardAndOfAnIndexIsInTheirFirstBlock) {
  TempDir tmp;
  ShardMeta meta;
  meta.tool_version = "test";
  meta.config_fingerprint = std::string(64, '3');
  meta.output_id = output_id_for(meta.config_fingerprint);
  meta.config_json = "{}";
  meta.chunk_rows = 64;
  ModalitySchema text;
  text.modality = Modality::kText;
  text.dim = 384;
  text.encoder = "bert";
  text.encoder_sha256 = std::string(64, 'a');
  text.pooling = "mean";
  text.preprocessing_json = "{}";
  meta.modalities[modality_index(Modality::kText)] = text;
  ShardContents contents;
  contents.seq_count = 2000;
  for (int64_t i = 0; i < contents.seq_count; ++i) {
    ShardSample sample;
    sample.seq = i;
    sample.id = "sample-" + std::to_string(i);
    SampleEmbedding embedding;
    embedding.seq = i;
    embedding.rows = 1;
    embedding.dim = 384;
    embedding.values.assign(384, 0.5f);
    embedding.steps = 7;
    sample.embeddings[modality_index(Modality::kText)] = std::move(embedding);
    contents.samples.push_back(std::move(sample));
  }
  const auto committed = ShardWriter(tmp.path(), meta).write(contents);
  const fs::path shard = tmp.path() / committed.file;
  ASSERT_GT(fs::file_size(shard), 1000000u);
  std::ifstream in(shard, std::ios::binary);
  const std::string bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
  const size_t at = bytes.find(meta.output_id);
  ASSERT_NE(at, std::string::npos);
  EXPECT_LT(at, 65536u - meta.output_id.size());
  EXPECT_EQ(find_output_id(shard), meta.output_id);

  OutputIndex index;
  index.meta = meta;
  write_index(tmp.path(), index);
  std::ifstream json(tmp.path() / "index.json");
  const std::string text_bytes{std::istreambuf_iterator<char>(json),
                               std::istreambuf_iterator<char>()};
  EXPECT_LT(text_bytes.find(meta.output_id), 200u);
}

}  // namespace
}  // namespace precompute
