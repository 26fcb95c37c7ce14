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

// Ends the decodes under way at their next check, as a stop request does, without asking the run
// to stop: for a run that ends (refused, or by an error) while samples decoded ahead of the graph
// are still being prepared, whose results it drops (Note [Decoding while the encoders load] in
// pipeline/early_decoding.cpp). For the rest of the process.
void cut_decodes_short();
// True once cut_decodes_short() was called.
bool decodes_cut_short();

// "SIGINT", "SIGTERM", "SIGHUP": for messages.
const char* stop_signal_name(int signal);

}  // namespace precompute
