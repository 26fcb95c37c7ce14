// RankLifecycle, rank.json's one writer: a refused start-up writes nothing, a rerun over the same
// span continues the earlier attempts, a rerun of a finished rank that processes nothing leaves
// the record as it was, and a stop is told apart from a failure.

#include "storage/rank_lifecycle.hpp"

#include <gtest/gtest.h>

#include <filesystem>

#include "test_media.hpp"

namespace precompute {
namespace {

using testing::TempDir;

RankRecord attempt(double started) {
  RankRecord r;
  r.rank = 1;
  r.world_size = 2;
  r.total_samples = 10;
  r.shard_size = 5;
  r.span = {1, 2, 5, 10};
  r.started = started;
  r.attempts = 1;
  return r;
}

TEST(RankLifecycle, WritesNothingBeforeTheStartUpPasses) {
  TempDir tmp;
  RankLifecycle rank(tmp.path(), attempt(100));
  EXPECT_FALSE(read_rank_record(tmp.path()));
  rank.running("id", /*overwriting=*/false, /*overwrite_done=*/false);
  const auto record = read_rank_record(tmp.path());
  ASSERT_TRUE(record);
  EXPECT_EQ(record->state, "running");
  EXPECT_EQ(record->output_id, "id");
  EXPECT_EQ(record->attempts, 1);
}

TEST(RankLifecycle, ARerunContinuesTheEarlierAttemptsUnlessItStartsOver) {
  TempDir tmp;
  RankLifecycle first(tmp.path(), attempt(100));
  first.running("id", false, false);
  first.done(5, 2.5);
  RankLifecycle second(tmp.path(), attempt(200));
  second.running("id", false, false);
  auto record = read_rank_record(tmp.path());
  EXPECT_EQ(record->attempts, 2);
  EXPECT_EQ(record->started, 100);
  RankLifecycle over(tmp.path(), attempt(300));
  over.running("id", /*overwriting=*/true, false);
  record = read_rank_record(tmp.path());
  EXPECT_EQ(record->attempts, 1);
  EXPECT_EQ(record->started, 300);
}

TEST(RankLifecycle, ARerunOfAFinishedRankThatDoesNothingKeepsItsRecord) {
  TempDir tmp;
  RankLifecycle first(tmp.path(), attempt(100));
  first.running("id", false, false);
  first.done(5, 2.5);
  const auto finished = read_rank_record(tmp.path());
  RankLifecycle again(tmp.path(), attempt(200));
  again.running("id", false, false);
  again.done(0, 0.1);
  const auto record = read_rank_record(tmp.path());
  EXPECT_EQ(record->state, "done");
  EXPECT_EQ(record->attempts, finished->attempts);
  EXPECT_EQ(record->finished, finished->finished);
  EXPECT_EQ(record->processed, 5);
}

TEST(RankLifecycle, AStopIsNotAFailure) {
  TempDir tmp;
  RankLifecycle rank(tmp.path(), attempt(100));
  rank.running("id", false, false);
  rank.ended_by(StoppedError(15, "stopped by SIGTERM", __FILE__, __LINE__));
  EXPECT_EQ(read_rank_record(tmp.path())->state, "stopped");
  rank.ended_by(StorageError("disk full", __FILE__, __LINE__));
  const auto record = read_rank_record(tmp.path());
  EXPECT_EQ(record->state, "failed");
  EXPECT_EQ(record->message, "disk full");
}

TEST(RankLifecycle, RecordsTheOverwriteOnce) {
  TempDir tmp;
  RankLifecycle rank(tmp.path(), attempt(100));
  rank.running("id", /*overwriting=*/true, /*overwrite_done=*/false);
  EXPECT_FALSE(read_rank_record(tmp.path())->overwrite_done);
  rank.overwrite_carried_out();
  EXPECT_TRUE(read_rank_record(tmp.path())->overwrite_done);
}

}  // namespace
}  // namespace precompute
