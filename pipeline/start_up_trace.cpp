#include "pipeline/start_up_trace.hpp"

#include <spdlog/spdlog.h>
#include <time.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>

namespace precompute {
namespace {

using Clock = std::chrono::steady_clock;

// Seconds the process has existed, from /proc/self/stat's start time (clock ticks since boot)
// and CLOCK_BOOTTIME, the clock that start time counts on; 0 where either cannot be read.
double seconds_since_exec() {
  std::ifstream in("/proc/self/stat");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // The command name (field 2) may hold spaces and parentheses: fields after it count from the
  // last ')'.
  const auto close = text.rfind(')');
  if (close == std::string::npos) return 0.0;
  std::istringstream fields(text.substr(close + 1));
  std::string field;
  unsigned long long start_ticks = 0;
  // Field 3 (state) is the first after ')'; the start time is field 22.
  for (int k = 3; k <= 22 && fields >> field; ++k) {
    if (k == 22) start_ticks = std::stoull(field);
  }
  timespec now{};
  const long ticks_per_second = ::sysconf(_SC_CLK_TCK);
  if (start_ticks == 0 || ticks_per_second <= 0 || ::clock_gettime(CLOCK_BOOTTIME, &now) != 0) {
    return 0.0;
  }
  const double since_boot = static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
  const double started = static_cast<double>(start_ticks) / static_cast<double>(ticks_per_second);
  return since_boot > started ? since_boot - started : 0.0;
}

struct Trace {
  std::mutex mutex;
  bool started_known = false;
  Clock::time_point started;
  std::vector<StartUpMark> marks;

  void know_start() {
    if (started_known) return;
    started = Clock::now() - std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(seconds_since_exec()));
    started_known = true;
  }
};

Trace& trace() {
  static Trace t;
  return t;
}

}  // namespace

void note_process_start() {
  auto& t = trace();
  std::lock_guard lock(t.mutex);
  t.know_start();
}

void clear_start_up_marks() {
  auto& t = trace();
  std::lock_guard lock(t.mutex);
  t.marks.clear();
}

void mark_start_up(std::string_view step) {
  spdlog::debug("start-up: {}", step);
  auto& t = trace();
  std::lock_guard lock(t.mutex);
  t.know_start();
  t.marks.push_back(
      {std::chrono::duration<double>(Clock::now() - t.started).count(), std::string(step)});
}

std::vector<StartUpMark> start_up_marks() {
  auto& t = trace();
  std::lock_guard lock(t.mutex);
  return t.marks;
}

}  // namespace precompute
