#include "pipeline/core/overlap_clock.hpp"

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [An encoder's time in use]
// Whether a heavy encoder bounds a job, or stands idle waiting for decoded frames, is the first
// question of any tuning, and the summed time of its calls cannot answer it: with two calls in
// flight most of the time, the sum is near twice the wall time when the encoder is saturated
// and near the wall time when it idles half the time with both calls overlapping. The union of
// the calls' spans, the time at least one was running, is the encoder's time in use: near the
// graph's wall time when it bounds the job, and frames over it is the rate the encoder kept
// while it ran, which compares with the same model alone. A modality's clock covers its
// encoders on every GPU, so with several GPUs it tells whether any was in use, and frames over
// it is their rate together. The calls are batches, a few a second, so a mutex costs nothing
// here.

void OverlapClock::enter(Clock::time_point now) {
  const std::lock_guard lock(mutex_);
  if (active_++ == 0) since_ = now;
}

void OverlapClock::leave(Clock::time_point now) {
  const std::lock_guard lock(mutex_);
  PC_ASSERT(active_ > 0, "an activity left an overlap clock none had entered");
  if (--active_ == 0) total_ += now - since_;
}

double OverlapClock::seconds(Clock::time_point now) const {
  const std::lock_guard lock(mutex_);
  Clock::duration total = total_;
  if (active_ > 0 && now > since_) total += now - since_;
  return std::chrono::duration<double>(total).count();
}

}  // namespace precompute
