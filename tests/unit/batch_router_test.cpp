#include "pipeline/stages/batch_router.hpp"

#include <gtest/gtest.h>

namespace precompute {
namespace {

PreparedSamplePtr text_sample(int64_t seq, size_t tokens) {
  auto s = std::make_shared<PreparedSample>();
  s->seq = seq;
  s->order = seq;
  s->id = std::to_string(seq);
  s->text.emplace();
  s->text->ids.assign(tokens, 5);
  return s;
}

PreparedSamplePtr video_sample(int64_t seq, int64_t frames) {
  auto s = std::make_shared<PreparedSample>();
  s->seq = seq;
  s->order = seq;
  s->id = std::to_string(seq);
  s->video.emplace();
  s->video->num_frames = frames;
  return s;
}

std::vector<size_t> sizes(const std::vector<ModalityBatch>& batches) {
  std::vector<size_t> out;
  for (const auto& b : batches) out.push_back(b.samples.size());
  return out;
}

TEST(ModalityBatcherTest, ClosesFullBatchesAtOnce) {
  ModalityBatcher b(Modality::kText, {3, 0, false});
  std::vector<ModalityBatch> ready;
  for (int i = 0; i < 7; ++i) b.add(text_sample(i, 4), ready);
  EXPECT_EQ(sizes(ready), (std::vector<size_t>{3, 3}));
  EXPECT_EQ(b.pending(), 1u);
  auto last = b.flush();
  ASSERT_TRUE(last);
  EXPECT_EQ(last->samples.front()->seq, 6);
  EXPECT_FALSE(b.flush());
}

TEST(ModalityBatcherTest, TextBudgetCountsPaddedTokens) {
  // Budget 40 padded tokens: 4 + 4 fit (8), a 20-token caption would pad the batch to 3 x 20.
  ModalityBatcher b(Modality::kText, {100, 40, false, /*padded=*/true});
  std::vector<ModalityBatch> ready;
  b.add(text_sample(0, 4), ready);
  b.add(text_sample(1, 4), ready);
  EXPECT_TRUE(ready.empty());
  b.add(text_sample(2, 20), ready);  // 3 * 20 = 60 > 40: the first two go out
  ASSERT_EQ(sizes(ready), (std::vector<size_t>{2}));
  b.add(text_sample(3, 20), ready);  // 2 * 20 = 40: fits and fills the budget
  EXPECT_EQ(sizes(ready), (std::vector<size_t>{2, 2}));
  b.add(text_sample(4, 500), ready);  // over budget alone: runs alone
  EXPECT_EQ(sizes(ready), (std::vector<size_t>{2, 2, 1}));
}

TEST(ModalityBatcherTest, PackedTextBudgetCountsRealTokens) {
  ModalityBatcher b(Modality::kText, {100, 40, false, /*padded=*/false});
  std::vector<ModalityBatch> ready;
  b.add(text_sample(0, 4), ready);
  b.add(text_sample(1, 20), ready);  // 24 tokens: padding would make it 40 already
  b.add(text_sample(2, 10), ready);  // 34
  EXPECT_TRUE(ready.empty());
  b.add(text_sample(3, 10), ready);  // 44 > 40: the first three go out
  EXPECT_EQ(sizes(ready), (std::vector<size_t>{3}));
}

TEST(ModalityBatcherTest, ClipsLayoutKeepsFrameCountsEqual) {
  ModalityBatcher b(Modality::kVideo, {8, 0, true});
  std::vector<ModalityBatch> ready;
  b.add(video_sample(0, 8), ready);
  b.add(video_sample(1, 8), ready);
  b.add(video_sample(2, 4), ready);
  EXPECT_EQ(sizes(ready), (std::vector<size_t>{2}));
}

TEST(BatchRouterTest, FlushesAtShardBoundariesAndOutlinesEverySample) {
  Config c;
  c.text.enabled = true;
  c.text.batch_size = 4;
  c.video.enabled = true;
  c.video.batch_size = 100;
  c.output.shard_size = 5;
  const auto plan = ShardPlan::cover(12, 5, {});
  BatchRouter router(batch_limits(c), plan);
  std::vector<ModalityBatch> batches;
  for (int64_t seq = 0; seq < 12; ++seq) {
    auto s = seq % 3 == 0 ? video_sample(seq, 2) : text_sample(seq, 3);
    auto routed = router.route(s);
    EXPECT_EQ(routed.outline.seq, seq);
    EXPECT_EQ(routed.outline.expected[modality_index(Modality::kVideo)], seq % 3 == 0);
    EXPECT_EQ(routed.outline.expected[modality_index(Modality::kText)], seq % 3 != 0);
    for (auto& b : routed.batches) {
      // No batch spans two shards.
      EXPECT_EQ(b.samples.front()->seq / 5, b.samples.back()->seq / 5);
      batches.push_back(std::move(b));
    }
  }
  size_t total = 0;
  for (const auto& b : batches) total += b.samples.size();
  EXPECT_EQ(total, 12u);  // everything flushed by the last shard's end
}

}  // namespace
}  // namespace precompute
