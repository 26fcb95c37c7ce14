#include "pipeline/stages/shard_assembler.hpp"

#include <algorithm>
#include <utility>

#include "pipeline/core/error.hpp"
#include "pipeline/run_stats.hpp"

namespace precompute {

// Note [Nothing is lost]
// Every sample of the input ends in exactly one of two places in the shard of its seq range: in
// /ids with the embeddings it got, or in /failures with a category and a message for each
// modality that failed (both, when only some modalities failed). A shard is written only when
// every seq of its range has been accounted for, so a committed shard is complete by
// construction; `precompute inspect` and the tests count ids + failed-only samples against the
// input.

ShardAssembler::ShardAssembler(ShardCommitter& committer, const ShardPlan& plan,
                               RunStats& stats, RangeIdentity range_identity,
                               SampleColumns columns)
    : committer_(&committer),
      plan_(&plan),
      stats_(&stats),
      range_identity_(std::move(range_identity)),
      columns_(std::move(columns)) {}

int64_t ShardAssembler::add(const WriterMessage& message) {
  if (const auto* outline = std::get_if<SampleOutline>(&message)) return add_outline(*outline);
  return add_batch(std::move(*std::get<std::shared_ptr<EncodedBatch>>(message)));
}

ShardAssembler::PendingSample& ShardAssembler::pending(int64_t seq) {
  plan_->range_of(seq);  // asserts that the position belongs to this run
  return pending_[seq];
}

int64_t ShardAssembler::add_outline(SampleOutline outline) {
  auto& p = pending(outline.seq);
  PC_ASSERT(!p.outlined, "sample ", outline.id, " outlined twice");
  p.outlined = true;
  p.id = std::move(outline.id);
  p.expected = outline.expected;
  for (auto& f : outline.failures) p.failures.push_back(std::move(f));
  return complete_if_ready(outline.seq);
}

int64_t ShardAssembler::add_batch(EncodedBatch batch) {
  const int m = modality_index(batch.modality);
  std::vector<int64_t> touched;
  for (auto& e : batch.embeddings) {
    auto& p = pending(e.seq);
    PC_ASSERT(!p.received[m], "seq ", e.seq, " got ", modality_name(batch.modality), " twice");
    p.received[m] = true;
    touched.push_back(e.seq);
    p.embeddings[m] = std::move(e);
  }
  for (auto& f : batch.failures) {
    auto& p = pending(f.seq);
    PC_ASSERT(!p.received[m], "seq ", f.seq, " got ", modality_name(batch.modality), " twice");
    p.received[m] = true;
    touched.push_back(f.seq);
    p.failures.push_back(std::move(f));
  }
  int64_t completed = 0;
  for (auto seq : touched) completed += complete_if_ready(seq);
  return completed;
}

int64_t ShardAssembler::complete_if_ready(int64_t seq) {
  auto it = pending_.find(seq);
  PC_ASSERT(it != pending_.end(), "no pending sample for seq ", seq);
  auto& p = it->second;
  if (!p.outlined || p.expected != p.received) return 0;

  const ShardRange& range = plan_->range_of(seq);
  const int64_t shard_index = range.shard_index;
  auto& shard = open_shards_[shard_index];
  if (shard.completed == 0) {
    shard.contents.shard_index = shard_index;
    shard.contents.first_seq = range.first_seq;
    shard.contents.seq_count = range.seq_count;
  }
  const bool any_embedding = std::any_of(p.embeddings.begin(), p.embeddings.end(),
                                         [](const auto& e) { return e.has_value(); });
  if (any_embedding) {
    shard.contents.samples.push_back(ShardSample{seq, p.id, std::move(p.embeddings), {}});
  }
  if (!p.failures.empty()) stats_->failed_samples.fetch_add(1, std::memory_order_relaxed);
  stats_->failure_records.fetch_add(static_cast<int64_t>(p.failures.size()),
                                    std::memory_order_relaxed);
  for (auto& f : p.failures) {
    stats_->failures_by_category[static_cast<size_t>(f.category)].fetch_add(
        1, std::memory_order_relaxed);
    stats_->failures_by_modality[modality_index(f.modality)][static_cast<size_t>(f.category)]
        .fetch_add(1, std::memory_order_relaxed);
    shard.contents.failures.push_back(std::move(f));
  }
  pending_.erase(it);
  ++shard.completed;
  stats_->completed.fetch_add(1, std::memory_order_relaxed);
  if (shard.completed == shard.contents.seq_count) submit_shard(shard_index);
  return 1;
}

void ShardAssembler::submit_shard(int64_t shard_index) {
  auto node = open_shards_.extract(shard_index);
  auto& contents = node.mapped().contents;
  if (range_identity_) {
    contents.input_sha256 = range_identity_(contents.first_seq, contents.seq_count);
  }
  std::sort(contents.samples.begin(), contents.samples.end(),
            [](const ShardSample& a, const ShardSample& b) { return a.seq < b.seq; });
  if (columns_) {
    for (auto& sample : contents.samples) sample.columns = columns_(sample.seq);
  }
  std::stable_sort(contents.failures.begin(), contents.failures.end(),
                   [](const FailureRecord& a, const FailureRecord& b) {
                     return a.seq != b.seq ? a.seq < b.seq : a.modality < b.modality;
                   });
  committer_->submit(std::move(contents));
}

void ShardAssembler::preload(ShardContents kept) {
  const int64_t index = kept.shard_index;
  PC_ASSERT(open_shards_.count(index) == 0, "shard ", index, " preloaded twice");
  PC_ASSERT(kept.failures.empty(), "kept samples of shard ", index, " have failure records");
  auto& shard = open_shards_[index];
  shard.completed = static_cast<int64_t>(kept.samples.size());
  shard.contents = std::move(kept);
}

size_t ShardAssembler::samples_held() const {
  size_t held = pending_.size();
  for (const auto& [index, shard] : open_shards_) held += static_cast<size_t>(shard.completed);
  return held;
}

}  // namespace precompute
