#include "pipeline/host_memory_budget.hpp"

#include <memory>

namespace precompute {

// Note [Host memory budget]
// Decoded samples are the pipeline's bulk: a 16-frame 224x224 clip is 2.4 MB of RGB. The
// in-flight limit bounds their count (Note [The graph]); the budget bounds their bytes too, so
// that a run with large clips does not need a hand-tuned run.max_in_flight. A prepared sample is
// charged when its decoding ends and released when its last reference goes (after its batches
// are encoded), through an aliasing shared_ptr that owns a releaser. Samples admitted but not
// decoded yet count as the largest sample seen (before the first one is decoded, as too much).
// The source waits while that projection exceeds the budget, but never below the minimum count
// the graph needs to fill every batch, which keeps the graph free of deadlock: past the budget it behaves as a limiter at that
// minimum. Peak RSS is therefore about models + budget + one batch per encoder.

HostMemoryBudget::HostMemoryBudget(int64_t budget_bytes, int64_t min_samples)
    : budget_(budget_bytes), min_samples_(min_samples) {}

PreparedSamplePtr HostMemoryBudget::charge(PreparedSamplePtr sample) {
  const auto bytes = static_cast<int64_t>(sample->bytes());
  const int64_t now = held_.fetch_add(bytes) + bytes;
  int64_t peak = peak_.load();
  while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
  }
  int64_t largest = largest_.load();
  while (bytes > largest && !largest_.compare_exchange_weak(largest, bytes)) {
  }
  struct Holder {
    Holder(PreparedSamplePtr s, HostMemoryBudget* b, int64_t n)
        : sample(std::move(s)), budget(b), bytes(n) {}
    Holder(const Holder&) = delete;
    Holder& operator=(const Holder&) = delete;
    ~Holder() { budget->release(bytes); }
    PreparedSamplePtr sample;
    HostMemoryBudget* budget;
    int64_t bytes;
  };
  auto holder = std::make_shared<Holder>(std::move(sample), this, bytes);
  const PreparedSample* raw = holder->sample.get();
  return PreparedSamplePtr(std::move(holder), raw);
}

void HostMemoryBudget::release(int64_t bytes) {
  held_.fetch_sub(bytes);
  released_.notify_all();
}

}  // namespace precompute
