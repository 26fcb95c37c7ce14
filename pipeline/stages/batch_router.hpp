#pragma once
// The batching stage. It sees prepared samples in seq order (a sequencer runs before it), sends
// each sample's outline to the writer and its inputs to one batcher per modality, and cuts
// batches by count and by cost (Note [Deterministic batches] in batch_router.cpp). Not
// thread-safe: it runs in a serial node.

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/stages/batch_cost_feedback.hpp"
#include "pipeline/stages/shard_plan.hpp"
#include "pipeline/stages/stage_messages.hpp"

namespace precompute {

struct BatchLimits {
  int max_samples = 1;     // samples per batch
  int64_t max_cost = 0;    // cost units per batch; 0: no cost limit
  bool equal_steps = false;  // every sample of a batch has the same step count (video clips)
  bool padded = false;       // text: the cost is padded tokens (batch size x longest caption)

  // The cost limit in force: max_cost, or `learned` (0: none) when lower.
  int64_t cost_limit(int64_t learned) const;
};

// Every modality's limits; unset for a modality the config leaves out.
using BatchLimitsByModality = std::array<std::optional<BatchLimits>, kNumModalities>;

// Accumulates one modality's samples into batches.
class ModalityBatcher {
 public:
  // `feedback`, when given, lowers the cost limit after an out-of-memory error (Note [Out of
  // memory]); it must outlive the batcher.
  ModalityBatcher(Modality modality, BatchLimits limits,
                  const BatchCostFeedback* feedback = nullptr);

  // Adds a sample that has this modality. Appends to `ready` the batch closed because the sample
  // did not fit in it, and the batch the sample filled, if any.
  void add(PreparedSamplePtr sample, std::vector<ModalityBatch>& ready);
  // Closes the open batch, if it holds any sample.
  std::optional<ModalityBatch> flush();
  size_t pending() const { return open_.samples.size(); }

 private:
  bool fits(const PreparedSample& sample) const;
  bool full() const;
  int64_t cost_limit() const;

  Modality modality_;
  BatchLimits limits_;
  const BatchCostFeedback* feedback_;
  ModalityBatch open_;
  int64_t open_cost_ = 0;
  int64_t open_max_tokens_ = 0;  // text: longest caption in the open batch
};

// The limits the config sets: batch_size and max_batch_frames / max_batch_seconds /
// max_batch_tokens. A GPU memory budget may lower them (apply_memory_budget).
BatchLimits batch_limits(const Config& config, Modality m);
BatchLimitsByModality batch_limits(const Config& config);

class BatchRouter {
 public:
  // One batcher per modality that has limits. `plan` and `feedback` (when given) must outlive
  // the router.
  BatchRouter(const BatchLimitsByModality& limits, const ShardPlan& plan,
              const BatchCostFeedback* feedback = nullptr);

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
