#include "pipeline/stages/nvdec_handover.hpp"

#include <algorithm>

namespace precompute {

// Note [Handing a file over to NVDEC]
// Under video.decoder: auto a file goes to a free NVDEC session, else to the CPU. While files
// keep coming that keeps both kinds busy, but when they stop (the end of a job, or a job of a
// few long files) the sessions go idle while the CPU decoders still work through their last
// files, each several times slower than a session: 24 one-minute 1080p HEVC clips took longer
// under auto than on the sessions alone (docs/benchmarks.md). So a CPU decode asks, as it reads,
// whether a session has gone untaken for kNvdecIdleBeforeHandover (no file is waiting for it:
// any decode thread starting a file would have taken it) and whether the session would decode
// the whole file in clearly less time than the CPU needs for the rest; if both, the thread
// takes the session and starts the file again there, the CPU's frames dropped. While files keep
// coming, sessions are taken within milliseconds and nothing is handed over. The CPU's rest is
// its time so far scaled by the share of the file's time still to read; the session's time is
// the pace of the files NVDEC decoded before (seconds a second of video, a running average that
// follows the last few files), so nothing is handed over before a session has finished a file.
// The margin keeps a near tie on the CPU, where the work done is not thrown away.
namespace {

constexpr double kMargin = 1.5;       // the CPU's rest must exceed the session's time by this
constexpr double kLatestWeight = 0.25;  // of a new file in the running average
constexpr double kShortestFile = 1.0;   // seconds: shorter files are paced as this long (a
                                        // session's time per file does not go to 0)

}  // namespace

void NvdecPace::add(double seconds, double duration_s) {
  if (!(seconds >= 0.0) || !(duration_s >= 0.0)) return;  // NaN or a clock gone back
  const double pace = seconds / std::max(duration_s, kShortestFile);
  std::lock_guard lock(mutex_);
  const double before = seconds_per_second_.load(std::memory_order_relaxed);
  seconds_per_second_.store(before == 0.0 ? pace : before + kLatestWeight * (pace - before),
                            std::memory_order_relaxed);
}

std::optional<double> NvdecPace::expected_seconds(double duration_s) const {
  const double pace = seconds_per_second_.load(std::memory_order_relaxed);
  if (pace == 0.0 || !(duration_s >= 0.0)) return std::nullopt;
  return pace * std::max(duration_s, kShortestFile);
}

bool worth_handing_over(double elapsed_s, double done, double nvdec_s) {
  if (!(nvdec_s >= 0.0) || !(elapsed_s >= 0.0)) return false;
  if (!(done > 0.0)) return true;  // nothing read yet: nothing to lose
  if (done >= 1.0) return false;
  const double cpu_rest = elapsed_s * (1.0 - done) / done;
  return cpu_rest > kMargin * nvdec_s;
}

}  // namespace precompute
