#include "pipeline/stages/batch_router.hpp"

#include <algorithm>
#include <cmath>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Deterministic batches]
// A sample's embedding may differ in the last bits with the batch it ran in (padding, kernel
// choice by shape). So batches are a pure function of the input and the config: samples arrive
// in seq order, a batch closes when the next sample would pass a limit, and every batch closes at
// a shard boundary. Rerunning a shard therefore reruns exactly its batches, and a resumed run
// stores the same bits as an uninterrupted one. The shard flush also means no batch waits for
// samples that the in-flight limit holds back: a shard's samples never wait on the next shard.

ModalityBatcher::ModalityBatcher(Modality modality, BatchLimits limits,
                                 const BatchCostFeedback* feedback)
    : modality_(modality), limits_(limits), feedback_(feedback) {
  PC_ASSERT(limits.max_samples >= 1, "batch size must be positive");
  open_.modality = modality;
}

int64_t BatchLimits::cost_limit(int64_t learned) const {
  if (learned <= 0) return max_cost;
  return max_cost > 0 ? std::min(max_cost, learned) : learned;
}

int64_t ModalityBatcher::cost_limit() const {
  return limits_.cost_limit(feedback_ != nullptr ? feedback_->limit(modality_) : 0);
}

bool ModalityBatcher::fits(const PreparedSample& sample) const {
  if (open_.samples.empty()) return true;  // a sample over the cost limit still runs, alone
  if (static_cast<int>(open_.samples.size()) >= limits_.max_samples) return false;
  if (limits_.equal_steps &&
      sample_cost(modality_, sample) != sample_cost(modality_, *open_.samples.front())) {
    return false;
  }
  const int64_t max_cost = cost_limit();
  if (max_cost <= 0) return true;
  const int64_t cost = sample_cost(modality_, sample);
  if (limits_.padded) {
    // Captions are padded to the longest one in the batch.
    const auto n = static_cast<int64_t>(open_.samples.size()) + 1;
    return n * std::max(open_max_tokens_, cost) <= max_cost;
  }
  return open_cost_ + cost <= max_cost;
}

bool ModalityBatcher::full() const {
  if (static_cast<int>(open_.samples.size()) >= limits_.max_samples) return true;
  const int64_t max_cost = cost_limit();
  if (max_cost <= 0) return false;
  const auto n = static_cast<int64_t>(open_.samples.size());
  return (limits_.padded ? n * open_max_tokens_ : open_cost_) >= max_cost;
}

void ModalityBatcher::add(PreparedSamplePtr sample, std::vector<ModalityBatch>& ready) {
  PC_ASSERT(sample->has(modality_), "sample ", sample->id, " has no ", modality_name(modality_));
  if (!fits(*sample)) ready.push_back(*flush());
  const int64_t cost = sample_cost(modality_, *sample);
  open_cost_ += cost;
  open_max_tokens_ = std::max(open_max_tokens_, cost);
  open_.samples.push_back(std::move(sample));
  // Close a full batch now rather than when the next sample arrives: the next sample may be
  // held back by the in-flight limit until this batch completes.
  if (full()) ready.push_back(*flush());
}

std::optional<ModalityBatch> ModalityBatcher::flush() {
  if (open_.samples.empty()) return std::nullopt;
  ModalityBatch out = std::move(open_);
  open_ = ModalityBatch{};
  open_.modality = modality_;
  open_cost_ = 0;
  open_max_tokens_ = 0;
  return out;
}

BatchLimits batch_limits(const Config& config, Modality m) {
  BatchLimits limits;
  limits.max_samples = config.section(m).batch_size;
  switch (m) {
    case Modality::kVideo:
      limits.max_cost = config.video.max_batch_frames;
      limits.equal_steps = config.video.layout == VideoLayout::kClips;
      break;
    case Modality::kAudio:
      limits.max_cost = config.audio.max_batch_seconds * config.audio.sample_rate;
      break;
    case Modality::kText:
      limits.max_cost = config.text.max_batch_tokens;
      // A TorchScript text model sees padded [B, L] batches; the native encoder packs them.
      limits.padded = config.text.encoder.type != EncoderType::kBert;
      break;
  }
  return limits;
}

BatchLimitsByModality batch_limits(const Config& config) {
  BatchLimitsByModality limits;
  for (Modality m : kAllModalities) {
    if (config.enabled(m)) limits[modality_index(m)] = batch_limits(config, m);
  }
  return limits;
}

BatchRouter::BatchRouter(const BatchLimitsByModality& limits, const ShardPlan& plan,
                         const BatchCostFeedback* feedback)
    : plan_(&plan) {
  for (Modality m : kAllModalities) {
    if (const auto& l = limits[modality_index(m)]) {
      batchers_[modality_index(m)].emplace(m, *l, feedback);
    }
  }
}

BatchRouter::Routed BatchRouter::route(PreparedSamplePtr sample) {
  PC_ASSERT(sample->order == next_order_, "batch router got sample ", sample->order,
            " of the run, expected ", next_order_);
  ++next_order_;
  Routed out;
  out.outline.seq = sample->seq;
  out.outline.id = sample->id;
  out.outline.failures = sample->failures;
  for (Modality m : kAllModalities) {
    auto& batcher = batchers_[modality_index(m)];
    if (!batcher || !sample->has(m)) continue;
    out.outline.expected[modality_index(m)] = true;
    batcher->add(sample, out.batches);
  }
  const bool shard_end = plan_->closes_range(sample->seq);
  if (shard_end) {
    for (auto& batcher : batchers_) {
      if (!batcher) continue;
      if (auto closed = batcher->flush()) out.batches.push_back(std::move(*closed));
    }
  }
  return out;
}

}  // namespace precompute
