#pragma once
// run.metrics_file (--metrics-file): the run's counters in Prometheus' text exposition format,
// rewritten atomically at every progress tick and once as the run ends, for node_exporter's
// textfile collector (Note [A metrics file for the textfile collector] in metrics_file.cpp;
// docs/format.md, "Metrics file").

#include <array>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/core/modality.hpp"

namespace precompute {

struct RunStats;

// What the metrics say beside the counters.
struct MetricsContext {
  // The folder this process writes (a rank: its rank folder): every series' `output` label.
  std::string output;
  std::string config_fingerprint;
  int64_t rank = 0;
  int64_t world_size = 1;
  std::array<bool, kNumModalities> modalities{};  // configured
  std::vector<std::string> gpu_devices;           // CUDA devices the encoders use
  std::chrono::system_clock::time_point started;  // the run's start
};

// The exposition of `stats` now. `exit_code`: the run has ended with it.
std::string metrics_text(const RunStats& stats, const MetricsContext& context,
                         std::optional<int> exit_code = std::nullopt);

// Prometheus text escaping of a label value: backslash, double quote and line feed escaped, and
// bytes that are not UTF-8 (a path may hold any) replaced by U+FFFD, which the format requires.
std::string prometheus_label_value(std::string_view text);

class MetricsFile {
 public:
  // An empty `path`: no file; write() does nothing.
  MetricsFile(std::filesystem::path path, MetricsContext context);

  bool enabled() const { return !path_.empty(); }
  // Replaces the file with the exposition of `stats` now. Never throws: a file that cannot be
  // written is a warning (once, until a write succeeds again), not the run's failure.
  // Thread-safe.
  void write(const RunStats& stats, std::optional<int> exit_code = std::nullopt);

 private:
  std::filesystem::path path_;
  MetricsContext context_;
  std::mutex mutex_;
  bool failing_ = false;
};

}  // namespace precompute
