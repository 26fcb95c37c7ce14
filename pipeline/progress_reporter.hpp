#pragma once
// A background thread that prints one progress line to stderr every interval: samples done of
// total, rate, ETA and where samples wait (decoding, encoder queues, writer). Stops and joins in
// its destructor.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace precompute {

struct RunStats;

// What the progress line shows beside the counters.
struct ProgressContext {
  std::chrono::steady_clock::time_point started;  // when the graph started
  std::vector<std::string> gpu_devices;  // CUDA devices the encoders use: their memory is shown
};

// The progress line for the current counters (also used for the last line).
std::string progress_line(const RunStats& stats, const ProgressContext& context);

class ProgressReporter {
 public:
  // Prints a line every `interval_s` (<= 0: no lines) and calls `on_tick`, when given, at every
  // tick: every `interval_s`, or every kTickWithoutLinesS when there are no lines (the metrics
  // file, pipeline/metrics_file.hpp, is rewritten on it).
  ProgressReporter(const RunStats& stats, ProgressContext context, double interval_s,
                   std::function<void()> on_tick = {});
  static constexpr double kTickWithoutLinesS = 2.0;
  ~ProgressReporter();
  ProgressReporter(const ProgressReporter&) = delete;
  ProgressReporter& operator=(const ProgressReporter&) = delete;

 private:
  void loop(double interval_s, bool lines);

  const RunStats& stats_;
  const ProgressContext context_;
  const std::function<void()> on_tick_;
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace precompute
