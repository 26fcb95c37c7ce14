#include "pipeline/progress_reporter.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <utility>

#include "encoders/encoder.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/run_stats.hpp"

namespace precompute {

namespace {

constexpr double kMinIntervalS = 0.001;
constexpr double kMaxIntervalS = 24 * 3600.0;

std::string format_duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const auto s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

}  // namespace

namespace {

std::string gpu_memory_text(const std::vector<std::string>& gpu_devices) {
  std::string text;
  for (const auto& device : gpu_devices) {
    const auto use = device_memory_use(device);
    if (!use) continue;
    text += fmt::format(" | {} {:.2f} GiB reserved, peak {:.2f}", device,
                        static_cast<double>(use->reserved_bytes) / (1 << 30),
                        static_cast<double>(use->peak_reserved_bytes) / (1 << 30));
  }
  return text;
}

}  // namespace

std::string progress_line(const RunStats& stats, const ProgressContext& context) {
  const auto total = stats.total.load();
  const auto done = stats.completed.load();
  const double elapsed = seconds_since(context.started);
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const double eta = rate > 0 ? static_cast<double>(total - done) / rate : NAN;
  std::string queues;
  for (Modality m : kAllModalities) {
    const int i = modality_index(m);
    const auto queued = stats.batches_queued[i].load() - stats.batches_done[i].load();
    queues += fmt::format(" {}:{}", modality_name(m).substr(0, 1), queued);
  }
  return fmt::format(
      "{}/{} samples ({:.1f}%), {:.1f}/s, ETA {} | decoding {}, reordering {}, encoding {} "
      "(queued batches{}) | {} shards, {} failed",
      done, total, total > 0 ? 100.0 * static_cast<double>(done) / static_cast<double>(total) : 100.0,
      rate, format_duration(eta), stats.submitted.load() - stats.prepared.load(),
      stats.prepared.load() - stats.routed.load(), stats.routed.load() - stats.completed.load(),
      queues, stats.shards_written.load(),
      stats.failed_samples.load()) + gpu_memory_text(context.gpu_devices);
}

ProgressReporter::ProgressReporter(const RunStats& stats, ProgressContext context,
                                   double interval_s, std::function<void()> on_tick)
    : stats_(stats), context_(std::move(context)), on_tick_(std::move(on_tick)) {
  const bool lines = interval_s > 0;
  if (!lines && !on_tick_) return;
  const double tick_s = lines ? interval_s : kTickWithoutLinesS;
  thread_ = std::thread([this, tick_s, lines] { loop(tick_s, lines); });
}

ProgressReporter::~ProgressReporter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void ProgressReporter::loop(double interval_s, bool lines) {
  // wait_for adds the interval to now() in integer clock ticks: an interval beyond about 292
  // years wraps into the past, every wait then ends at once and the log floods without end.
  // validate() bounds the setting; the clamp keeps any other caller safe, and its floor keeps a
  // tiny interval from spinning. A stop still wakes the wait at once, however long it is.
  const auto interval = std::chrono::milliseconds(
      std::llround(std::clamp(interval_s, kMinIntervalS, kMaxIntervalS) * 1000.0));
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, interval, [this] { return stop_; })) {
    if (lines) spdlog::info("progress: {}", progress_line(stats_, context_));
    if (on_tick_) on_tick_();
  }
}

}  // namespace precompute
