#pragma once
// Where a run's start-up time goes: each step before the graph is marked once, logged at debug
// level as "start-up: <step>" and kept, with its time since the process started, for the run
// summary's `start_up` list (docs/format.md, "Run summary").

#include <string>
#include <string_view>
#include <vector>

namespace precompute {

struct StartUpMark {
  double at_seconds = 0.0;  // since the process started (the kernel's start time)
  std::string step;
};

// Fixes the process's start on the steady clock. Called in main() before the supervisor forks,
// so that a worker's marks count from the command's start, library loading included; a process
// that never calls it fixes it at its first mark.
void note_process_start();

// Forgets earlier marks: a run's list holds its own steps only.
void clear_start_up_marks();

// Logs "start-up: <step>" at debug level and keeps it with the time since the process started.
void mark_start_up(std::string_view step);

// The marks since the last clear, in the order made.
std::vector<StartUpMark> start_up_marks();

}  // namespace precompute
