#include "pipeline/run_summary.hpp"

#include <fmt/format.h>

#include <string>

#include "pipeline/core/failure.hpp"

namespace precompute {
namespace {

double seconds_of(const std::atomic<int64_t>& ns) { return static_cast<double>(ns) / 1e9; }

}  // namespace

RunSummary summary_from_stats(const RunStats& stats,
                              const std::array<bool, kNumModalities>& configured) {
  RunSummary summary;
  summary.processed_samples = stats.total;
  summary.failed_samples = stats.failed_samples;
  summary.failure_records = stats.failure_records;
  summary.repaired_texts = stats.invalid_utf8_texts;
  summary.oom_splits = stats.oom_splits;
  summary.video_clips = stats.video_clips;
  summary.video_decoded_frames = stats.video_decoded_frames;
  summary.video_kept_frames = stats.video_kept_frames;
  summary.video_seeks = stats.video_seeks;
  summary.video_seeks_undone = stats.video_seeks_undone;
  summary.video_nvdec_clips = stats.video_nvdec_clips;
  summary.video_nvdec_fallbacks = stats.video_nvdec_fallbacks;
  summary.video_nvdec_handovers = stats.video_nvdec_handovers;
  summary.video_nvdec_decoded_frames = stats.video_nvdec_decoded_frames;
  summary.video_nvdec_seconds = seconds_of(stats.video_nvdec_ns);
  summary.video_cpu_decode_seconds = seconds_of(stats.video_cpu_decode_ns);
  summary.graph_seconds = seconds_of(stats.graph_ns);
  summary.shards = stats.shards_written;
  summary.bytes_written = stats.bytes_written;
  summary.busy_seconds = {{"route", seconds_of(stats.route_ns)},
                          {"assemble", seconds_of(stats.assemble_ns)},
                          {"build shards", seconds_of(stats.build_ns)},
                          {"commit", seconds_of(stats.commit_ns)}};
  for (size_t c = 0; c < stats.failures_by_category.size(); ++c) {
    const auto n = stats.failures_by_category[c].load();
    if (n > 0) {
      summary.failures_by_category[std::string(
          failure_category_name(static_cast<FailureCategory>(c)))] = n;
    }
  }
  for (Modality m : kAllModalities) {
    const int i = modality_index(m);
    summary.modalities[i] = configured[i];
    if (configured[i]) {
      const std::string name(modality_name(m));
      summary.busy_seconds["encode " + name] = seconds_of(stats.encode_ns[i]);
      summary.busy_seconds[name + " batches queued"] = seconds_of(stats.encode_wait_ns[i]);
      summary.busy_seconds[name + " encoder in use"] = stats.encode_in_use[i].seconds();
    }
    summary.run_embedded[i] = stats.embedded[i];
    for (size_t c = 0; c < stats.failures_by_modality[i].size(); ++c) {
      const auto category = failure_category_name(static_cast<FailureCategory>(c));
      if (const auto n = stats.failures_by_modality[i][c].load(); n > 0) {
        summary.run_failures[i][std::string(category)] = n;
      }
    }
  }
  return summary;
}

std::string format_summary(const RunSummary& s) {
  std::string out = fmt::format(
      "{} samples in {:.2f} s ({:.1f}/s; {:.2f} s more waiting for the encoders to load): {} with "
      "embeddings (video {}, audio {}, text {}), {} with failures; {} shards, {:.1f} MB in {}; "
      "peak RSS {:.0f} MB (decoded samples held at most {:.0f} MB)",
      s.processed_samples, s.seconds,
      s.seconds > 0 ? static_cast<double>(s.processed_samples) / s.seconds : 0.0,
      s.load_waited_seconds,
      s.samples_with_embeddings, s.embedded[0], s.embedded[1], s.embedded[2], s.failed_samples,
      s.shards, static_cast<double>(s.bytes_written) / 1e6, s.output.string(),
      static_cast<double>(s.peak_rss_bytes) / 1e6,
      static_cast<double>(s.peak_decoded_bytes) / 1e6);
  if (s.video_clips > 0) {
    out += fmt::format("; video decoding: {} frames decoded for {} kept ({:.1f} per clip), {} "
                       "seek(s) to keyframes",
                       s.video_decoded_frames, s.video_kept_frames,
                       static_cast<double>(s.video_decoded_frames) /
                           static_cast<double>(s.video_clips),
                       s.video_seeks);
    if (s.video_seeks_undone > 0) {
      out += fmt::format(" ({} undone: keyframe later than the index said)", s.video_seeks_undone);
    }
    if (!s.video_decoders.empty()) {
      out += fmt::format("; decoders: {}, {} clip(s) on NVDEC", s.video_decoders,
                         s.video_nvdec_clips);
      if (s.video_nvdec_handovers > 0) {
        out += fmt::format(" ({} of them started on the CPU and handed over)",
                           s.video_nvdec_handovers);
      }
      if (s.video_nvdec_fallbacks > 0) {
        out += fmt::format(" ({} more given to NVDEC fell back to the CPU)",
                           s.video_nvdec_fallbacks);
      }
    }
  }
  out += fmt::format("; graph ran {:.2f} s", s.graph_seconds);
  if (s.early_decoding_seconds > 0) {
    out += fmt::format(" (decoding began {:.2f} s before it)", s.early_decoding_seconds);
  }
  if (s.video_clips > 0 && s.decoding_seconds() > 0) {
    // (Note [How busy the decoders were] in runner.cpp)
    out += ":";
    if (s.nvdec_sessions > 0) {
      out += fmt::format(" NVDEC sessions busy {:.0f}% of it,",
                         100.0 * s.video_nvdec_seconds / (s.nvdec_sessions * s.decoding_seconds()));
    }
    out += fmt::format(" CPU video decodes {:.1f} at a time on average",
                       s.video_cpu_decode_seconds / s.decoding_seconds());
  }
  if (s.oom_splits > 0) {
    out += fmt::format("; {} batch(es) split after running out of device memory", s.oom_splits);
  }
  if (s.repaired_texts > 0) {
    out += fmt::format("; {} caption(s) had invalid UTF-8, replaced by U+FFFD",
                       s.repaired_texts);
  }
  if (s.resumed_samples > 0) {
    out += fmt::format("; {} of the input's {} samples were already in committed shards",
                       s.resumed_samples, s.total_samples);
  }
  for (const auto& peak : s.device_memory) {
    out += fmt::format("; peak GPU memory {} {:.0f} MiB reserved ({:.0f} MiB allocated)",
                       peak.device, static_cast<double>(peak.reserved_bytes) / (1 << 20),
                       static_cast<double>(peak.allocated_bytes) / (1 << 20));
  }
  out += "; busy:";
  for (const auto& [stage, seconds] : s.busy_seconds) out += fmt::format(" {} {:.2f} s", stage, seconds);
  if (!s.failures_by_category.empty()) {
    out += "; failures by category:";
    for (const auto& [category, n] : s.failures_by_category) {
      out += fmt::format(" {} {}", category, n);
    }
  }
  return out;
}

}  // namespace precompute
