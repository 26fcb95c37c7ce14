#pragma once
// The first samples of a run prepared while its encoders load (Note [Decoding while the encoders
// load] in early_decoding.cpp): threads of their own prepare them in order and keep each result
// until the graph asks for its position.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "pipeline/core/sample.hpp"

namespace precompute {

class EarlyDecoding {
 public:
  using Clock = std::chrono::steady_clock;
  using Prepare = std::function<PreparedSamplePtr(const SampleSpec&)>;

  // Starts `threads` threads that prepare input[p] for p in `positions`, in that order, with
  // `prepare` (called from those threads, several at once). `on_prepared` runs on the preparing
  // thread after each sample prepared without an exception, `on_taken` when the graph takes one
  // (for the run's counters: a sample counts as prepared when the graph has it).
  EarlyDecoding(const std::vector<SampleSpec>& input, std::vector<int64_t> positions,
                Prepare prepare, int threads, std::function<void()> on_prepared = {},
                std::function<void()> on_taken = {});
  // Starts no more samples and waits for those being prepared.
  ~EarlyDecoding();
  EarlyDecoding(const EarlyDecoding&) = delete;
  EarlyDecoding& operator=(const EarlyDecoding&) = delete;

  // The sample at input position `seq`, prepared early: waits while it is being prepared and
  // rethrows what its preparation threw. nullptr when it is not among the early positions, or
  // was not started yet (it is then never started: the caller prepares it). Each position is
  // handed out once.
  PreparedSamplePtr take(int64_t seq);

  // When the threads found nothing left to prepare and the last sample had ended; nullopt while
  // one is being prepared or waits for a thread.
  std::optional<Clock::time_point> idle_since() const;

  // Samples prepared early so far, taken or not.
  int64_t prepared() const;

  // When the threads were started.
  Clock::time_point started() const { return started_; }

 private:
  enum class State { kWaiting, kPreparing, kDone, kTaken };
  struct Item {
    SampleSpec spec;
    State state = State::kWaiting;
    PreparedSamplePtr sample;
    std::exception_ptr error;
  };

  void work();

  Clock::time_point started_ = Clock::now();
  Prepare prepare_;
  std::function<void()> on_prepared_;
  std::function<void()> on_taken_;
  mutable std::mutex mutex_;
  std::condition_variable done_;
  std::vector<Item> items_;
  std::map<int64_t, size_t> by_seq_;
  size_t next_ = 0;       // the first item no thread has claimed
  int64_t busy_ = 0;      // items being prepared
  int64_t prepared_ = 0;  // items that ended
  bool stopping_ = false;
  std::optional<Clock::time_point> idle_since_;
  std::vector<std::thread> threads_;
};

}  // namespace precompute
