#pragma once
// Time a stopped process did not run (Note [Paused runs] in pause_clock.cpp): per-sample time
// limits measure wall time on the steady clock, and a job stopped with SIGSTOP or Ctrl-Z (or a
// scheduler's suspend) must not find every sample it had in flight "timed out" when it goes on.

#include <cstdint>

namespace precompute {

// Steady-clock nanoseconds (std::chrono::steady_clock's epoch).
int64_t steady_now_ns();

// Makes a SIGCONT mark the moment the process went on after a stop. Idempotent.
void install_continue_handler();

// The steady time of the last resume: a SIGCONT, or a stall the watchdog noticed
// (note_tick); 0 when the process never stopped. A time limit that started before it counts
// from it instead.
int64_t last_resume_ns();

// For a thread that wakes every `period_ns`: when more than `period_ns + stall_ns` passed since
// its previous tick, the process did not run in between (stopped without a SIGCONT to see, e.g.
// frozen by a cgroup freezer), and now counts as a resume. Returns whether it did.
bool note_tick(int64_t now_ns, int64_t& previous_tick_ns, int64_t period_ns, int64_t stall_ns);

// Marks `now_ns` as a resume (tests; the SIGCONT handler).
void mark_resume(int64_t now_ns);

}  // namespace precompute
