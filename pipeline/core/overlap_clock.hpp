#pragma once
// The wall time during which at least one of several overlapping activities ran. An encoder
// takes two calls at once (one per CUDA stream), so the sum of its calls' times counts their
// overlap twice, passes the wall time when the encoder is the bound, and cannot tell a busy
// encoder from one that stood idle between calls; this clock's union of the calls can (Note
// [An encoder's time in use] in overlap_clock.cpp).

#include <chrono>
#include <mutex>

namespace precompute {

class OverlapClock {
 public:
  using Clock = std::chrono::steady_clock;

  // One activity, for the length of a scope.
  class Scope {
   public:
    explicit Scope(OverlapClock& clock) : clock_(clock) { clock_.enter(Clock::now()); }
    ~Scope() { clock_.leave(Clock::now()); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    OverlapClock& clock_;
  };

  // An activity begins or ends at `now` (Scope's, or a test's own times, which must not go back).
  void enter(Clock::time_point now);
  void leave(Clock::time_point now);
  // The time at least one activity ran, up to `now` (a span still open counts to it).
  double seconds(Clock::time_point now = Clock::now()) const;

 private:
  mutable std::mutex mutex_;
  int active_ = 0;
  Clock::time_point since_;  // when active_ last went from 0 to 1
  Clock::duration total_{};  // closed spans
};

}  // namespace precompute
