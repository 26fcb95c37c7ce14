#include "pipeline/stages/batch_cost_feedback.hpp"

namespace precompute {

int64_t BatchCostFeedback::lower(Modality m, int64_t cost) {
  auto& learned = learned_[modality_index(m)];
  int64_t current = learned.load();
  while ((current == 0 || cost < current) && !learned.compare_exchange_weak(current, cost)) {
  }
  return learned.load();
}

int64_t BatchCostFeedback::limit(Modality m) const { return learned_[modality_index(m)].load(); }

}  // namespace precompute
