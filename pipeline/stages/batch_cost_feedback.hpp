#pragma once
// What the encode stage learns about batch cost and the batch router acts on: after a batch runs
// out of device memory, later batches of its modality are cut below half of its cost (Note [Out
// of memory] in encode_stage.cpp). Thread-safe: encode calls lower it from any thread while the
// router reads it from its serial node.

#include <array>
#include <atomic>
#include <cstdint>

#include "pipeline/core/modality.hpp"

namespace precompute {

class BatchCostFeedback {
 public:
  // Lowers the learned cost limit of `m` to `cost` when none is learned yet or `cost` is lower;
  // returns the limit in force afterwards.
  int64_t lower(Modality m, int64_t cost);
  // The learned cost limit of `m` (frames, audio samples, tokens); 0: none learned yet.
  int64_t limit(Modality m) const;

 private:
  std::array<std::atomic<int64_t>, kNumModalities> learned_{};
};

}  // namespace precompute
