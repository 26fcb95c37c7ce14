#pragma once
// run.host_memory_budget: a bound on the bytes of decoded samples (frames, audio, token ids)
// held between the decoders and the encoders, with back-pressure on the source
// (Note [Host memory budget] in host_memory_budget.cpp). Thread-safe.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <limits>
#include <mutex>

#include "pipeline/core/sample.hpp"
#include "pipeline/core/stop_request.hpp"

namespace precompute {

class HostMemoryBudget {
 public:
  // `budget_bytes` 0: no byte limit (the sample-count limit alone bounds memory).
  // `min_samples`: samples that must be allowed in flight whatever their bytes, so that every
  // batch can fill (the graph's deadlock-free minimum).
  HostMemoryBudget(int64_t budget_bytes, int64_t min_samples);

  // Called by the source before it takes a sample: waits while the decoded bytes held, plus
  // those of the samples admitted but not decoded yet (`undecoded()`, each counted as the
  // largest sample so far), exceed the budget and at least `min_samples` samples are in flight
  // (`in_flight()`). Returns at once after a stop request: the source then takes nothing, and
  // the samples it waits for are being dropped.
  template <class InFlight, class Undecoded>
  void wait_for_room(InFlight in_flight, Undecoded undecoded) {
    if (budget_ <= 0) return;
    std::unique_lock lock(mutex_);
    while (!stop_requested() && in_flight() >= min_samples_ &&
           projected(undecoded()) > budget_) {
      // Completions lower in_flight() without notifying: poll as well.
      released_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }

  // Counts `sample`'s bytes until the last reference to the returned pointer is gone.
  PreparedSamplePtr charge(PreparedSamplePtr sample);

  int64_t held_bytes() const { return held_.load(); }
  int64_t peak_bytes() const { return peak_.load(); }

 private:
  void release(int64_t bytes);
  // Bytes held once `undecoded` more samples are decoded; unbounded before the first sample
  // shows what a sample weighs.
  int64_t projected(int64_t undecoded) const {
    const int64_t largest = largest_.load();
    if (largest == 0) return undecoded > 0 ? std::numeric_limits<int64_t>::max() : held_.load();
    return held_.load() + undecoded * largest;
  }

  int64_t budget_;
  int64_t min_samples_;
  std::atomic<int64_t> held_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> largest_{0};  // the largest sample charged so far
  std::mutex mutex_;
  std::condition_variable released_;
};

}  // namespace precompute
