#pragma once
// The batching stage. It sees prepared samples in seq order (a sequencer runs before it), sends
// each sample's outline to the writer and its inputs to one batcher per modality, and cuts
// batches by count and by cost (Note [Deterministic batches] in batch_router.cpp). Not
// thread-safe: it runs in a serial node.

#include <array>
#include <atomic>
#include <cstdint>
#include <optional>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/stages/shard_plan.hpp"
#include "pipeline/stages/stage_messages.hpp"

namespace precompute {

struct BatchLimits {
  int max_samples = 1;     // samples per batch
  int64_t max_cost = 0;    // cost units per batch; 0: no cost limit
  bool equal_steps = false;  // every sample of a batch has the same step count (video clips)
  bool padded = false;       // text: the cost is padded tokens (batch size x longest caption)
  // Lowered by the encode stage after an out-of-memory error (Note [Out of memory]); 0: none.
  const std::atomic<int64_t>* learned_max_cost = nullptr;

  // The cost limit in force: the configured one, or the learned one when lower.
  int64_t cost_limit() const;
};

// Accumulates one modality's samples into batches.
class ModalityBatcher {
 public:
  ModalityBatcher(Modality modality, BatchLimits limits);

  // Adds a sample that has this modality. Appends to `ready` the batch closed because the sample
  // did not fit in it, and the batch the sample filled, if any.
  void add(PreparedSamplePtr sample, std::vector<ModalityBatch>& ready);
  // Closes the open batch, if it holds any sample.
  std::optional<ModalityBatch> flush();
  size_t pending() const { return open_.samples.size(); }

 private:
  bool fits(const PreparedSample& sample) const;
  bool full() const;

  Modality modality_;
  BatchLimits limits_;
  ModalityBatch open_;
  int64_t open_cost_ = 0;
  int64_t open_max_tokens_ = 0;  // text: longest caption in the open batch
};

BatchLimits batch_limits(const Config& config, Modality m);

class BatchRouter {
 public:
  // `plan` must outlive the router.
  BatchRouter(const Config& config, const ShardPlan& plan,
              const std::array<std::atomic<int64_t>, kNumModalities>* learned_max_cost = nullptr);

  struct Routed {
    SampleOutline outline;
    std::vector<ModalityBatch> batches;  // ready to encode, any modality
  };
  // Takes the next sample in run order (SampleSpec::order).
  Routed route(PreparedSamplePtr sample);
  size_t pending(Modality m) const { return batchers_[modality_index(m)]->pending(); }

 private:
  const ShardPlan* plan_;
  int64_t next_order_ = 0;
  std::array<std::optional<ModalityBatcher>, kNumModalities> batchers_;
};

}  // namespace precompute
