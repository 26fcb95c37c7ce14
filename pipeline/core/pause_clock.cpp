#include "pipeline/core/pause_clock.hpp"

#include <signal.h>
#include <time.h>

#include <atomic>
#include <chrono>

namespace precompute {

// Note [Paused runs]
// run.sample_timeout_s is a wall-clock limit (FFmpeg's interrupt callback, the watchdog), since
// a decoder stuck in a blocking read uses no CPU time. But wall time also runs while the whole
// process is stopped: after `kill -STOP`, Ctrl-Z or a scheduler's suspend longer than the limit,
// every sample in flight would be recorded `timeout` for good, and the watchdog would restart the
// run. So each limit counts from the later of its start and the last resume. A resume is seen
// two ways: the SIGCONT that ends a stop (its handler stores the time: async-signal-safe,
// clock_gettime and a lock-free store), and, for stops without a SIGCONT (a cgroup freezer), a
// tick of the watchdog thread that comes far later than its period. A limit is never shortened,
// only restarted, so a sample that really hangs is still caught one limit after the resume.

namespace {

std::atomic<int64_t> g_last_resume_ns{0};
static_assert(std::atomic<int64_t>::is_always_lock_free);

void on_continue(int) {
  timespec now{};
  // CLOCK_MONOTONIC is what std::chrono::steady_clock reads on Linux.
  clock_gettime(CLOCK_MONOTONIC, &now);
  g_last_resume_ns.store(int64_t{now.tv_sec} * 1000000000 + now.tv_nsec);
}

}  // namespace

int64_t steady_now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void install_continue_handler() {
  struct sigaction action {};
  action.sa_handler = on_continue;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGCONT, &action, nullptr);
}

int64_t last_resume_ns() { return g_last_resume_ns.load(std::memory_order_relaxed); }

void mark_resume(int64_t now_ns) {
  int64_t seen = g_last_resume_ns.load();
  while (seen < now_ns && !g_last_resume_ns.compare_exchange_weak(seen, now_ns)) {
  }
}

bool note_tick(int64_t now_ns, int64_t& previous_tick_ns, int64_t period_ns, int64_t stall_ns) {
  const bool paused = previous_tick_ns > 0 && now_ns - previous_tick_ns > period_ns + stall_ns;
  if (paused) mark_resume(now_ns);
  previous_tick_ns = now_ns;
  return paused;
}

}  // namespace precompute
