#include "pipeline/metrics_file.hpp"

#include <spdlog/spdlog.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "encoders/encoder.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/failure.hpp"
#include "pipeline/run_stats.hpp"
#include "storage/atomic_file.hpp"

namespace precompute {

// Note [A metrics file for the textfile collector]
// node_exporter's textfile collector exports every *.prom file of a folder at each scrape, so a
// run that keeps one there is scraped like any service, without a port of its own. The file is
// replaced whole (storage/atomic_file.hpp) at every progress tick, so a scrape never reads half
// of it, and once more as the run ends, with precompute_run_finished 1 and the exit code: after
// the run the file stays as its last state, and precompute_metrics_updated_timestamp_seconds
// tells a dead run (its file no longer changes) from a live one. Every series carries the output
// folder this process writes as its `output` label, so the files of two runs, or of two ranks of
// a job on one host (each writes its own file: pipeline/report_files.hpp), never export the same
// series. Counters count this process's run: a run restarted by its supervisor starts them at 0,
// which Prometheus' rate() reads as a counter reset. Every modality and failure category
// configured is exported from the start, 0 included, so that rate() sees each series begin.

namespace {

int64_t rss_bytes() {
  std::FILE* f = std::fopen("/proc/self/statm", "r");
  if (f == nullptr) return 0;
  long long size = 0, resident = 0;
  const int read = std::fscanf(f, "%lld %lld", &size, &resident);
  std::fclose(f);
  return read == 2 ? resident * static_cast<int64_t>(::sysconf(_SC_PAGESIZE)) : 0;
}

int64_t peak_rss_bytes() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<int64_t>(usage.ru_maxrss) * 1024;  // Linux reports KiB
}

double seconds(int64_t ns) { return static_cast<double>(ns) / 1e9; }

double unix_seconds(std::chrono::system_clock::time_point t) {
  return std::chrono::duration<double>(t.time_since_epoch()).count();
}

// Writes families of samples, each with its HELP and TYPE lines first and the output label on
// every sample.
class Exposition {
 public:
  explicit Exposition(const std::string& output)
      : output_label_("output=\"" + prometheus_label_value(output) + "\"") {}

  void family(std::string_view name, std::string_view type, std::string_view help) {
    name_ = name;
    text_ += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
  }

  using Labels = std::vector<std::pair<std::string_view, std::string>>;
  void sample(double value, const Labels& labels = {}) {
    std::string all = output_label_;
    for (const auto& [key, v] : labels) {
      all += fmt::format(",{}=\"{}\"", key, prometheus_label_value(v));
    }
    text_ += fmt::format("{}{{{}}} {}\n", name_, all, value);
  }
  void sample(int64_t value, const Labels& labels = {}) {
    sample(static_cast<double>(value), labels);
  }

  std::string take() { return std::move(text_); }

 private:
  std::string output_label_;
  std::string name_;
  std::string text_;
};

}  // namespace

std::string prometheus_label_value(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  while (i < text.size()) {
    const unsigned char lead = byte(i);
    size_t length = 0;
    unsigned char low = 0x80, high = 0xBF;
    if (lead < 0x80) {
      length = 1;
    } else if (lead >= 0xC2 && lead <= 0xDF) {
      length = 2;
    } else if (lead >= 0xE0 && lead <= 0xEF) {
      length = 3;
      if (lead == 0xE0) low = 0xA0;
      if (lead == 0xED) high = 0x9F;
    } else if (lead >= 0xF0 && lead <= 0xF4) {
      length = 4;
      if (lead == 0xF0) low = 0x90;
      if (lead == 0xF4) high = 0x8F;
    }
    bool valid = length > 0 && i + length <= text.size();
    for (size_t k = 1; valid && k < length; ++k) {
      const unsigned char b = byte(i + k);
      valid = k == 1 ? (b >= low && b <= high) : (b & 0xC0) == 0x80;
    }
    if (!valid) {
      out += "\xEF\xBF\xBD";  // U+FFFD for one byte that starts no valid sequence
      ++i;
      continue;
    }
    if (length == 1) {
      const char ch = text[i];
      if (ch == '\\') {
        out += "\\\\";
      } else if (ch == '"') {
        out += "\\\"";
      } else if (ch == '\n') {
        out += "\\n";
      } else {
        out += ch;
      }
    } else {
      out.append(text.substr(i, length));
    }
    i += length;
  }
  return out;
}

std::string metrics_text(const RunStats& stats, const MetricsContext& context,
                         std::optional<int> exit_code) {
  Exposition e(context.output);
  std::vector<Modality> modalities;
  for (Modality m : kAllModalities) {
    if (context.modalities[modality_index(m)]) modalities.push_back(m);
  }
  const auto name = [](Modality m) { return std::string(modality_name(m)); };

  e.family("precompute_run_info", "gauge",
           "The run this file describes: its settings' fingerprint and its rank of the job");
  e.sample(int64_t{1}, {{"config_fingerprint", context.config_fingerprint},
                        {"rank", std::to_string(context.rank)},
                        {"world_size", std::to_string(context.world_size)}});
  e.family("precompute_run_start_timestamp_seconds", "gauge", "When the run started (Unix time)");
  e.sample(unix_seconds(context.started));
  const auto now = std::chrono::system_clock::now();
  e.family("precompute_metrics_updated_timestamp_seconds", "gauge",
           "When this file was written (Unix time); a file that stops changing before "
           "precompute_run_finished is 1 belongs to a run that died");
  e.sample(unix_seconds(now));
  e.family("precompute_run_finished", "gauge", "1 once the run has ended, else 0");
  e.sample(int64_t{exit_code ? 1 : 0});
  if (exit_code) {
    e.family("precompute_run_exit_code", "gauge",
             "The run's exit code (README, \"Exit codes\"); present once it has ended");
    e.sample(int64_t{*exit_code});
  }

  e.family("precompute_samples", "gauge",
           "Samples this run processes: its part of the input less those already committed");
  e.sample(stats.total.load());
  e.family("precompute_samples_done_total", "counter",
           "Samples complete: every modality embedded or recorded as failed");
  e.sample(stats.completed.load());
  e.family("precompute_samples_failed_total", "counter",
           "Complete samples with at least one failure record");
  e.sample(stats.failed_samples.load());
  e.family("precompute_samples_embedded_total", "counter", "Samples embedded, per modality");
  for (Modality m : modalities) {
    e.sample(stats.embedded[modality_index(m)].load(), {{"modality", name(m)}});
  }
  e.family("precompute_failure_records_total", "counter",
           "Failure records of complete samples, per modality and category");
  for (Modality m : modalities) {
    for (size_t c = 0; c < stats.failures_by_modality[0].size(); ++c) {
      const auto category = failure_category_name(static_cast<FailureCategory>(c));
      if (category.empty() || category == "unknown") continue;
      e.sample(stats.failures_by_modality[modality_index(m)][c].load(),
               {{"modality", name(m)}, {"category", std::string(category)}});
    }
  }
  e.family("precompute_batches_total", "counter", "Batches encoded, per modality");
  for (Modality m : modalities) {
    e.sample(stats.batches_done[modality_index(m)].load(), {{"modality", name(m)}});
  }
  e.family("precompute_batches_queued", "gauge",
           "Batches cut and waiting for an encoder, per modality");
  for (Modality m : modalities) {
    const int i = modality_index(m);
    e.sample(stats.batches_queued[i].load() - stats.batches_done[i].load(),
             {{"modality", name(m)}});
  }
  e.family("precompute_samples_in_stage", "gauge",
           "Samples between the source and the writer, by where they are");
  e.sample(stats.submitted.load() - stats.prepared.load(), {{"stage", "decoding"}});
  e.sample(stats.prepared.load() - stats.routed.load(), {{"stage", "reordering"}});
  e.sample(stats.routed.load() - stats.completed.load(), {{"stage", "encoding"}});
  e.family("precompute_stage_busy_seconds_total", "counter",
           "Time each serial stage and each modality's encoders spent working");
  e.sample(seconds(stats.route_ns.load()), {{"stage", "route"}});
  e.sample(seconds(stats.assemble_ns.load()), {{"stage", "assemble"}});
  e.sample(seconds(stats.build_ns.load()), {{"stage", "build shards"}});
  e.sample(seconds(stats.commit_ns.load()), {{"stage", "commit"}});
  for (Modality m : modalities) {
    e.sample(seconds(stats.encode_ns[modality_index(m)].load()), {{"stage", "encode " + name(m)}});
  }
  e.family("precompute_encoder_in_use_seconds_total", "counter",
           "Time at least one of a modality's encode calls ran (the union of the calls)");
  for (Modality m : modalities) {
    e.sample(stats.encode_in_use[modality_index(m)].seconds(), {{"modality", name(m)}});
  }
  e.family("precompute_batch_wait_seconds_total", "counter",
           "Time batches spent cut and waiting for an encoder, summed over batches");
  for (Modality m : modalities) {
    e.sample(seconds(stats.encode_wait_ns[modality_index(m)].load()), {{"modality", name(m)}});
  }
  e.family("precompute_shards_committed_total", "counter", "Shards committed by this run");
  e.sample(stats.shards_written.load());
  e.family("precompute_written_bytes_total", "counter", "Bytes of shards committed by this run");
  e.sample(stats.bytes_written.load());

  e.family("precompute_host_memory_rss_bytes", "gauge", "The process's resident memory");
  e.sample(rss_bytes());
  e.family("precompute_host_memory_peak_rss_bytes", "gauge", "The process's peak resident memory");
  e.sample(peak_rss_bytes());
  std::vector<std::pair<std::string, DeviceMemoryUse>> devices;
  for (const auto& device : context.gpu_devices) {
    if (const auto use = device_memory_use(device)) devices.emplace_back(device, *use);
  }
  if (!devices.empty()) {
    e.family("precompute_gpu_memory_reserved_bytes", "gauge",
             "Device memory the caching allocator holds, per GPU");
    for (const auto& [device, use] : devices) e.sample(use.reserved_bytes, {{"device", device}});
    e.family("precompute_gpu_memory_peak_reserved_bytes", "gauge",
             "Peak device memory the caching allocator held, per GPU");
    for (const auto& [device, use] : devices) {
      e.sample(use.peak_reserved_bytes, {{"device", device}});
    }
    e.family("precompute_gpu_memory_allocated_bytes", "gauge",
             "Device memory held by tensors, per GPU");
    for (const auto& [device, use] : devices) e.sample(use.allocated_bytes, {{"device", device}});
  }
  if (context.modalities[modality_index(Modality::kVideo)]) {
    const int64_t clips = stats.video_clips.load();
    const int64_t nvdec_clips = stats.video_nvdec_clips.load();
    const int64_t frames = stats.video_decoded_frames.load();
    const int64_t nvdec_frames = stats.video_nvdec_decoded_frames.load();
    e.family("precompute_video_clips_decoded_total", "counter", "Video clips decoded, per decoder");
    e.sample(nvdec_clips, {{"decoder", "nvdec"}});
    e.sample(clips - nvdec_clips, {{"decoder", "cpu"}});
    e.family("precompute_video_frames_decoded_total", "counter",
             "Frames out of the video decoders, per decoder");
    e.sample(nvdec_frames, {{"decoder", "nvdec"}});
    e.sample(frames - nvdec_frames, {{"decoder", "cpu"}});
  }
  return e.take();
}

MetricsFile::MetricsFile(std::filesystem::path path, MetricsContext context)
    : path_(std::move(path)), context_(std::move(context)) {}

void MetricsFile::write(const RunStats& stats, std::optional<int> exit_code) {
  if (!enabled()) return;
  const std::lock_guard lock(mutex_);
  try {
    write_file_atomically(path_, metrics_text(stats, context_, exit_code));
    if (failing_) spdlog::info("metrics file {} written again", path_.string());
    failing_ = false;
  } catch (const std::exception& e) {
    if (!failing_) {
      spdlog::warn(
          "cannot write the metrics file (run.metrics_file, --metrics-file): {}; the run "
          "goes on and tries again at the next progress interval",
          e.what());
    }
    failing_ = true;
  }
}

}  // namespace precompute
