#pragma once
// A graceful stop asked for by SIGINT, SIGTERM or SIGHUP (a closed terminal or session): the
// source stops taking samples, the samples in flight are dropped, complete shards are committed,
// and the run exits with 128 + the signal so that a scheduler sees it was interrupted (Note
// [Stopping on a signal] in stop_request.cpp). A second signal exits at once,
// which is safe because only committed shards count (docs/reliability.md).

namespace precompute {

// Installs the SIGINT, SIGTERM and SIGHUP handlers of a run. Idempotent.
void install_stop_handlers();
// Makes `handler` handle SIGINT, SIGTERM and SIGHUP, with interrupted system calls restarted (what
// install_stop_handlers() installs, and the supervisor's forwarding).
void handle_stop_signals(void (*handler)(int));
// Asks the run to stop as if `signal` had arrived (tests, the watchdog's callers).
void request_stop(int signal);
// Forgets a stop request, so that a process can run another graph after a stopped one (the
// graph tests; a run never does).
void clear_stop_request();
// True once a stop was asked for; cheap enough to poll per sample.
bool stop_requested();
// The signal that asked for the stop; 0 when none did.
int stop_signal();

// "SIGINT", "SIGTERM", "SIGHUP": for messages.
const char* stop_signal_name(int signal);

}  // namespace precompute
