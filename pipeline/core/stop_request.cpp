#include "pipeline/core/stop_request.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace precompute {

// Note [Stopping on a signal]
// The handler only stores to a lock-free atomic (async-signal-safe). The graph polls
// stop_requested(): the source takes no more samples, and the samples in flight are dropped,
// decodes under way cut short (Note [A stop drops the samples in flight] in
// pipeline/graph.cpp); the shards completed before are committed, and the dropped samples are
// redone on resume. What the stop waits for is the encoder calls already running and the
// shards being written. A decoder stuck inside one call cannot be cut short; someone who does
// not want to wait for it (or for anything) sends the signal again: the process exits at once
// with the same code, which is safe because only committed shards count.

namespace {

std::atomic<int> g_signal{0};
static_assert(std::atomic<int>::is_always_lock_free);

void on_signal(int signal) {
  if (g_signal.exchange(signal) != 0) _exit(128 + signal);
}

}  // namespace

void handle_stop_signals(void (*handler)(int)) {
  struct sigaction action {};
  action.sa_handler = handler;
  sigemptyset(&action.sa_mask);
  // Restart interrupted system calls: stops are polled, nobody needs EINTR.
  action.sa_flags = SA_RESTART;
  sigaction(SIGINT, &action, nullptr);
  sigaction(SIGTERM, &action, nullptr);
  // A closed terminal or ended ssh session: commit what is complete, as for SIGTERM.
  sigaction(SIGHUP, &action, nullptr);
}

void install_stop_handlers() { handle_stop_signals(on_signal); }

void request_stop(int signal) {
  int expected = 0;
  g_signal.compare_exchange_strong(expected, signal);
}

void clear_stop_request() { g_signal.store(0); }

bool stop_requested() { return g_signal.load(std::memory_order_relaxed) != 0; }

namespace {
std::atomic<bool> g_decodes_cut_short{false};
}  // namespace

void cut_decodes_short() { g_decodes_cut_short.store(true); }

bool decodes_cut_short() { return g_decodes_cut_short.load(std::memory_order_relaxed); }

int stop_signal() { return g_signal.load(); }

const char* stop_signal_name(int signal) {
  switch (signal) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

}  // namespace precompute
