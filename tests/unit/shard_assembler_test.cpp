#include "pipeline/stages/shard_assembler.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/output_id.hpp"
#include "pipeline/run_stats.hpp"
#include "storage/shard_reader.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

OutputIndex make_index(int64_t total, int64_t shard_size) {
  OutputIndex index;
  index.total_samples = total;
  index.shard_size = shard_size;
  index.meta.tool_version = "test";
  index.meta.config_fingerprint = std::string(64, 'f');
  index.meta.output_id = output_id_for(index.meta.config_fingerprint);
  index.meta.dtype = StorageDtype::kFloat32;
  for (Modality m : {Modality::kVideo, Modality::kText}) {
    ModalitySchema schema;
    schema.modality = m;
    schema.dim = 2;
    schema.encoder = "probe.pt";
    schema.pooling = "mean";
    schema.preprocessing_json = "{}";
    index.meta.modalities[modality_index(m)] = schema;
  }
  return index;
}

SampleOutline outline(int64_t seq, bool video, bool text) {
  SampleOutline o;
  o.seq = seq;
  o.id = "id" + std::to_string(seq);
  o.expected[modality_index(Modality::kVideo)] = video;
  o.expected[modality_index(Modality::kText)] = text;
  return o;
}

SampleEmbedding embedding(int64_t seq, float value) {
  SampleEmbedding e;
  e.seq = seq;
  e.rows = 1;
  e.dim = 2;
  e.values = {value, -value};
  e.steps = 1;
  return e;
}

TEST(ShardAssemblerTest, WritesAShardOnlyWhenEverySampleOfItsRangeIsComplete) {
  testing::TempDir dir;
  RunStats stats;
  ShardCommitter committer(dir.path(), make_index(5, 3), stats);
  const auto plan = ShardPlan::cover(5, 3, {});
  ShardAssembler a(committer, plan, stats);

  // Parts arrive out of order: text batch before the outlines, shard 1 before shard 0.
  EncodedBatch text{Modality::kText, {embedding(0, 1), embedding(1, 2), embedding(4, 5)}, {}};
  EXPECT_EQ(a.add(WriterMessage(std::make_shared<EncodedBatch>(text))), 0);
  EXPECT_EQ(a.add(WriterMessage(outline(3, false, false))), 1);  // nothing expected: complete
  EXPECT_EQ(a.add(WriterMessage(outline(4, false, true))), 1);
  committer.finish();
  EXPECT_EQ(stats.shards_written.load(), 1);  // shard 1 = seqs 3, 4
  EXPECT_EQ(a.add(WriterMessage(outline(0, true, true))), 0);  // waits for its video
  EXPECT_EQ(a.add(WriterMessage(outline(1, false, true))), 1);
  auto failed = outline(2, true, false);
  failed.failures.push_back({2, "id2", Modality::kText, FailureCategory::kBadText, "empty"});
  EXPECT_EQ(a.add(WriterMessage(failed)), 0);
  EncodedBatch video{Modality::kVideo, {embedding(0, 9)}, {}};
  video.failures.push_back({2, "id2", Modality::kVideo, FailureCategory::kEncodeError, "boom"});
  EXPECT_EQ(a.add(WriterMessage(std::make_shared<EncodedBatch>(video))), 2);
  committer.finish();
  EXPECT_EQ(stats.shards_written.load(), 2);
  EXPECT_EQ(a.samples_held(), 0u);
  EXPECT_EQ(stats.failed_samples.load(), 1);

  const auto shard0 = read_shard(dir / committer.index().shards.front().file);
  ASSERT_EQ(shard0.contents.samples.size(), 2u);  // id2 failed everything: not in ids
  EXPECT_EQ(shard0.contents.samples[0].id, "id0");
  EXPECT_TRUE(shard0.contents.samples[0].embeddings[modality_index(Modality::kVideo)]);
  EXPECT_FLOAT_EQ(shard0.contents.samples[0].embeddings[modality_index(Modality::kVideo)]->values[0],
                  9.0f);
  EXPECT_FALSE(shard0.contents.samples[1].embeddings[modality_index(Modality::kVideo)]);
  ASSERT_EQ(shard0.contents.failures.size(), 2u);
  EXPECT_EQ(shard0.contents.failures[0].modality, Modality::kVideo);  // ordered by modality
  EXPECT_EQ(shard0.contents.failures[1].category, FailureCategory::kBadText);

  const auto index = read_index(dir.path());
  EXPECT_EQ(committer.index().shards.size(), 2u);
  ASSERT_TRUE(index);
  ASSERT_EQ(index->shards.size(), 2u);
  EXPECT_EQ(index->shards[0].num_samples, 2);
  EXPECT_EQ(index->shards[0].num_failures, 2);
  EXPECT_EQ(index->shards[1].seq_count, 2);
  EXPECT_EQ(index->shards[1].modality_counts[modality_index(Modality::kText)], 1);
}

TEST(ShardCommitterTest, AFailedCommitIsReportedAndStopsLaterCommits) {
  testing::TempDir dir;
  RunStats stats;
  const auto out = dir / "out";
  std::filesystem::create_directory(out);
  ShardCommitter committer(out, make_index(4, 2), stats);
  std::filesystem::remove(out);  // the folder vanishes under the run: every write must fail
  ShardContents shard;
  shard.seq_count = 2;
  committer.submit(shard);
  EXPECT_THROW(committer.finish(), StorageError);
  shard.shard_index = 1;
  shard.first_seq = 2;
  EXPECT_THROW(committer.submit(shard), StorageError);
  EXPECT_EQ(stats.shards_written.load(), 0);
}

TEST(ShardPlanTest, ACleanRunCutsWholeSlotsAndTheLastShortOne) {
  const auto plan = ShardPlan::cover(10, 4, {});
  EXPECT_EQ(plan.ranges(), (std::vector<ShardRange>{{0, 0, 4}, {1, 4, 4}, {2, 8, 2}}));
  EXPECT_EQ(plan.range_of(5).shard_index, 1);
  EXPECT_TRUE(plan.closes_range(7));
  EXPECT_FALSE(plan.closes_range(6));
  EXPECT_THROW(plan.range_of(10), InternalError);
}

TEST(ShardPlanTest, AResumeCoversOnlyTheGapsWithTheShardsACleanRunWouldWrite) {
  // Shards 0 and 2 committed: the resume writes exactly shards 1 and 3.
  const auto plan = ShardPlan::cover(14, 4, {{2, 8, 4}, {0, 0, 4}});
  EXPECT_EQ(plan.ranges(), (std::vector<ShardRange>{{1, 4, 4}, {3, 12, 2}}));
  EXPECT_EQ(plan.samples(), 6);
}

TEST(ShardPlanTest, AGrownInputFillsTheOldLastSlotThenWholeOnes) {
  // 10 samples in shards of 4 were committed (the last one short); the input grew to 17.
  const auto plan = ShardPlan::cover(17, 4, {{0, 0, 4}, {1, 4, 4}, {2, 8, 2}});
  // [10, 12) completes slot 2 under a new number; 12.. are slots 3 and 4 as in a clean run.
  EXPECT_EQ(plan.ranges(), (std::vector<ShardRange>{{5, 10, 2}, {3, 12, 4}, {4, 16, 1}}));
  // The same input and history always give the same plan.
  EXPECT_EQ(plan.ranges(), ShardPlan::cover(17, 4, {{2, 8, 2}, {1, 4, 4}, {0, 0, 4}}).ranges());
}

TEST(ShardPlanTest, AChangedShardSizeStillCoversEveryGapOnce) {
  const auto plan = ShardPlan::cover(20, 8, {{0, 0, 5}, {1, 5, 5}});
  EXPECT_EQ(plan.ranges(), (std::vector<ShardRange>{{3, 10, 6}, {2, 16, 4}}));
}

TEST(ShardPlanTest, RedoneShardsCloseAtTheirLastProcessedPosition) {
  const ShardPlan plan({{0, 0, 4}, {1, 4, 4}}, {2, 7});
  EXPECT_TRUE(plan.closes_range(2));
  EXPECT_FALSE(plan.closes_range(3));
  EXPECT_TRUE(plan.closes_range(7));
}

TEST(ShardAssemblerTest, APreloadedShardCompletesWithTheRedoneSamplesOnly) {
  testing::TempDir dir;
  RunStats stats;
  ShardCommitter committer(dir.path(), make_index(3, 3), stats);
  const ShardPlan plan({{0, 0, 3}}, {1});
  ShardAssembler a(committer, plan, stats);
  ShardContents kept;
  kept.shard_index = 0;
  kept.first_seq = 0;
  kept.seq_count = 3;
  for (int64_t seq : {0, 2}) {
    ShardSample s{seq, "id" + std::to_string(seq), {}, {}};
    s.embeddings[modality_index(Modality::kText)] = embedding(seq, 1.0f + static_cast<float>(seq));
    kept.samples.push_back(std::move(s));
  }
  a.preload(std::move(kept));
  EXPECT_EQ(a.add(WriterMessage(outline(1, false, true))), 0);
  EncodedBatch text{Modality::kText, {embedding(1, 9)}, {}};
  EXPECT_EQ(a.add(WriterMessage(std::make_shared<EncodedBatch>(text))), 1);
  committer.finish();
  const auto shard = read_shard(dir / committer.index().shards.front().file);
  ASSERT_EQ(shard.contents.samples.size(), 3u);
  EXPECT_EQ(shard.contents.samples[1].id, "id1");  // in seq order
  EXPECT_FLOAT_EQ(
      shard.contents.samples[1].embeddings[modality_index(Modality::kText)]->values[0], 9.0f);
}

// The strings of a one-dimensional string dataset of a shard.
std::vector<std::string> read_strings(const std::filesystem::path& file, const char* name) {
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  const hid_t d = H5Dopen2(f, name, H5P_DEFAULT);
  const hid_t type = H5Dget_type(d);
  const hid_t space = H5Dget_space(d);
  std::vector<char*> pointers(static_cast<size_t>(H5Sget_simple_extent_npoints(space)));
  std::vector<std::string> out;
  if (!pointers.empty() && H5Dread(d, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()) >= 0) {
    for (char* p : pointers) out.emplace_back(p ? p : "");
    H5Dvlen_reclaim(type, space, H5P_DEFAULT, pointers.data());
  }
  H5Sclose(space);
  H5Tclose(type);
  H5Dclose(d);
  H5Fclose(f);
  return out;
}

// output.keep_columns: every sample of a shard gets its kept values from the input by seq, the
// samples kept from an earlier version of the shard (--retry-failed) too.
TEST(ShardAssemblerTest, EverySampleGetsItsKeptColumnsPreloadedOnesToo) {
  testing::TempDir dir;
  RunStats stats;
  OutputIndex index = make_index(3, 3);
  index.meta.kept_columns = {"label", "split"};
  ShardCommitter committer(dir.path(), index, stats);
  const ShardPlan plan({{0, 0, 3}}, {1});
  ShardAssembler a(committer, plan, stats, {}, [](int64_t seq) {
    return std::vector<std::string>{"label-" + std::to_string(seq), seq == 1 ? "" : "train"};
  });
  ShardContents kept;
  kept.shard_index = 0;
  kept.first_seq = 0;
  kept.seq_count = 3;
  for (int64_t seq : {0, 2}) {
    ShardSample s{seq, "id" + std::to_string(seq), {}, {}};  // as read_shard gives them: none
    s.embeddings[modality_index(Modality::kText)] = embedding(seq, 1.0f);
    kept.samples.push_back(std::move(s));
  }
  a.preload(std::move(kept));
  EXPECT_EQ(a.add(WriterMessage(outline(1, false, true))), 0);
  EncodedBatch text{Modality::kText, {embedding(1, 9)}, {}};
  EXPECT_EQ(a.add(WriterMessage(std::make_shared<EncodedBatch>(text))), 1);
  committer.finish();
  const auto file = dir / committer.index().shards.front().file;
  EXPECT_EQ(read_strings(file, "/ids"), (std::vector<std::string>{"id0", "id1", "id2"}));
  EXPECT_EQ(read_strings(file, "/columns/label"),
            (std::vector<std::string>{"label-0", "label-1", "label-2"}));
  EXPECT_EQ(read_strings(file, "/columns/split"), (std::vector<std::string>{"train", "", "train"}));
}

}  // namespace
}  // namespace precompute
