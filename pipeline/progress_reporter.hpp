#pragma once
// A background thread that prints one progress line to stderr every interval: samples done of
// total, rate, ETA and where samples wait (decoding, encoder queues, writer). Stops and joins in
// its destructor.

#include <array>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace precompute {

struct RunStats;

// The progress line for the current counters (also used for the last line).
std::string progress_line(const RunStats& stats);

class ProgressReporter {
 public:
  // interval_s <= 0 disables the reporter.
  ProgressReporter(const RunStats& stats, double interval_s);
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

 private:
  void loop(double interval_s);

  const RunStats& stats_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace precompute
