#include "pipeline/memory_budget.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>

#include "encoders/bert/text_settings.hpp"
#include "encoders/text/wordpiece_tokenizer.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Memory budgets]
// run.gpu_memory_budget bounds what the CUDA caching allocator may reserve on each GPU. Two
// mechanisms make that hold:
// - The allocator is capped at the budget (setMemoryFraction), so it can never reserve more: an
//   allocation past it fails with c10::OutOfMemoryError, which the encode stage recovers from by
//   splitting the batch (Note [Out of memory]). The cap is the guarantee.
// - Batches are sized so that the cap is rarely hit: each GPU encoder is measured at start-up on
//   batches of the largest sample the config allows (largest_sample), in its batch-limit unit
//   (frames, audio samples, tokens). The extra memory a call reserves above what was reserved
//   before it is fitted as fixed + per_unit * units from two batch sizes. The budget, less the
//   weights of every encoder on the device, is shared equally by the encode calls that may run
//   there at once (each GPU encoder runs two, on two streams); a modality's cost limit is the
//   most units whose fitted cost fits one share. One batch at that limit then runs as a warm-up,
//   as text-embeddings-inference does, so that a budget too small fails at start-up, not after
//   an hour. A budget that cannot hold one largest sample is refused with the numbers.
// Limits only ever go down from the config's, and they are not part of the fingerprint: a
// resume under another budget stores the same embeddings.

namespace {

using Clock = std::chrono::steady_clock;

bool is_gpu(const std::string& device) { return device.rfind("cuda", 0) == 0; }

}  // namespace

PreparedSamplePtr largest_sample(const Config& config, Modality m) {
  auto sample = std::make_shared<PreparedSample>();
  sample->id = "probe";
  switch (m) {
    case Modality::kVideo: {
      const auto& v = config.video;
      VideoFrames frames;
      frames.num_frames = v.num_frames > 0 ? v.num_frames : 16;
      frames.height = v.height;
      frames.width = v.width;
      frames.rgb.assign(static_cast<size_t>(frames.num_frames) * v.height * v.width * 3, 128);
      for (int64_t k = 0; k < frames.num_frames; ++k) frames.timestamps.push_back(double(k));
      frames.duration_s = static_cast<double>(frames.num_frames);
      sample->video = std::move(frames);
      break;
    }
    case Modality::kAudio: {
      const auto& a = config.audio;
      AudioWindows audio;
      audio.sample_rate = a.sample_rate;
      audio.window_samples = static_cast<int64_t>(
          std::llround((a.window_s > 0 ? a.window_s : 10.0) * a.sample_rate));
      audio.num_windows = 1;
      audio.samples.assign(static_cast<size_t>(audio.window_samples), 0.0f);
      audio.timestamps = {0.0};
      audio.valid_samples = {audio.window_samples};
      audio.duration_s = static_cast<double>(audio.window_samples) / a.sample_rate;
      sample->audio = std::move(audio);
      break;
    }
    case Modality::kText: {
      const auto tokenizer = make_text_tokenizer(config.text);
      std::string words;
      for (int i = 0; i < 70000 && words.size() < 400000; ++i) words += "word ";
      auto tokens = tokenizer.encode(words);
      sample->text = std::move(tokens);
      break;
    }
  }
  return sample;
}

BatchProbe probe_batch(Encoder& encoder, const PreparedSamplePtr& sample, int batch) {
  const std::string& device = encoder.info().device;
  BatchProbe probe;
  probe.batch = batch;
  probe.units = sample_cost(encoder.info().modality, *sample) * batch;
  release_cached_device_memory(device);
  reset_device_memory_peaks(device);
  probe.before = device_memory_use(device);
  const std::vector<PreparedSamplePtr> samples(static_cast<size_t>(batch), sample);
  const auto started = Clock::now();
  try {
    const auto out = encoder.encode(samples);
    probe.rows_per_sample = out.front().rows;
    probe.dim = out.front().dim;
  } catch (const DeviceOutOfMemoryError&) {
    probe.out_of_memory = true;
    release_cached_device_memory(device);
    return probe;
  }
  probe.seconds = std::chrono::duration<double>(Clock::now() - started).count();
  probe.after = device_memory_use(device);
  if (probe.before && probe.after) {
    probe.peak_extra_reserved = probe.after->peak_reserved_bytes - probe.before->reserved_bytes;
  }
  return probe;
}

namespace {

// Lowers the modality's cost limit (frames, audio seconds, tokens) to `units`. The sample count
// limit stays: memory follows units, so more short samples fit than largest ones.
void lower_cost_limit(Config& config, Modality m, int64_t units) {
  const auto lower = [](int64_t& limit, int64_t value) {
    limit = limit > 0 ? std::min(limit, value) : value;
  };
  switch (m) {
    case Modality::kVideo:
      lower(config.video.max_batch_frames, std::max<int64_t>(1, units));
      break;
    case Modality::kAudio:
      lower(config.audio.max_batch_seconds,
            std::max<int64_t>(1, units / std::max(1, config.audio.sample_rate)));
      break;
    case Modality::kText:
      lower(config.text.max_batch_tokens, std::max<int64_t>(1, units));
      break;
  }
}

}  // namespace

std::vector<DeviceBudget> apply_memory_budget(Config& config, const EncoderPools& pools) {
  std::vector<DeviceBudget> budgets;
  if (!config.run.gpu_memory_budget.set()) return budgets;

  // Every GPU encoder instance, by device.
  std::map<std::string, std::vector<Encoder*>> by_device;
  for (const auto& pool : pools) {
    if (!pool) continue;
    for (const auto& e : pool->encoders()) {
      if (is_gpu(e->info().device)) by_device[e->info().device].push_back(e.get());
    }
  }
  if (by_device.empty()) {
    spdlog::info("run.gpu_memory_budget: no encoder runs on a GPU; nothing to budget");
    return budgets;
  }
  for (const auto& [device, encoders] : by_device) {
    DeviceBudget b;
    b.device = device;
    const auto use = device_memory_use(device);
    b.budget_bytes = config.run.gpu_memory_budget.bytes_of(use->total_bytes);
    for (const auto* e : encoders) {
      b.weights_bytes += e->parameters().bytes;
      b.concurrent_calls += e->info().concurrent_calls;
    }
    b.per_call_bytes = (b.budget_bytes - b.weights_bytes) / std::max(1, b.concurrent_calls);
    PC_CHECK(b.per_call_bytes > 0, ConfigError, "run.gpu_memory_budget ",
             format_bytes(b.budget_bytes), " on ", device, " does not even hold the encoders' ",
             format_bytes(b.weights_bytes), " of weights; raise it");
    cap_device_memory(device, b.budget_bytes);

    for (auto* e : encoders) {
      const Modality m = e->info().modality;
      const std::string name(modality_name(m));
      const auto sample = largest_sample(config, m);
      const int64_t units = sample_cost(m, *sample);
      const auto one = probe_batch(*e, sample, 1);
      PC_CHECK(!one.out_of_memory && one.peak_extra_reserved <= b.per_call_bytes, ConfigError,
               "run.gpu_memory_budget ", format_bytes(b.budget_bytes), " on ", device,
               " leaves ", format_bytes(b.per_call_bytes), " to each of ", b.concurrent_calls,
               " concurrent encoder calls, but one ", name, " sample of ", units,
               " units needs ",
               one.out_of_memory ? std::string("more than that")
                                 : format_bytes(one.peak_extra_reserved),
               "; raise the budget or make samples smaller (video.size, video.num_frames, "
               "audio.window_s, text.tokenizer.max_length)");
      // A second point for the slope, as large as the share suggests, capped by the config.
      int second = static_cast<int>(std::clamp<int64_t>(
          b.per_call_bytes / std::max<int64_t>(1, 4 * one.peak_extra_reserved), 2, 64));
      second = std::min(second, std::max(2, config.section(m).batch_size));
      BatchProbe two = probe_batch(*e, sample, second);
      while (two.out_of_memory && second > 2) {
        second /= 2;
        two = probe_batch(*e, sample, second);
      }
      const double per_unit =
          two.out_of_memory
              ? static_cast<double>(b.per_call_bytes) / static_cast<double>(2 * units)
              : std::max(1.0, static_cast<double>(two.peak_extra_reserved -
                                                  one.peak_extra_reserved) /
                                  static_cast<double>(two.units - one.units));
      const double fixed = std::max(
          0.0, static_cast<double>(one.peak_extra_reserved) - per_unit * static_cast<double>(units));
      // A quarter kept for fragmentation, the other calls' cached blocks and batches shaped
      // unlike the probes (measured on an H200 with BERT-base: 90% of the share cost 1,195
      // out-of-memory splits in 50,000 texts under 2 GiB; docs/benchmarks.md).
      int64_t fit_units = static_cast<int64_t>(
          (0.75 * static_cast<double>(b.per_call_bytes) - fixed) / per_unit);
      fit_units = std::max(fit_units, units);
      int fit_samples = static_cast<int>(std::max<int64_t>(1, fit_units / units));
      fit_samples = std::min(fit_samples, config.section(m).batch_size);
      // Warm-up at the largest planned batch; shrink until it fits.
      BatchProbe check = probe_batch(*e, sample, fit_samples);
      while ((check.out_of_memory || check.peak_extra_reserved > b.per_call_bytes) &&
             fit_samples > 1) {
        fit_samples = std::max(1, fit_samples * 3 / 4);
        check = probe_batch(*e, sample, fit_samples);
      }
      lower_cost_limit(config, m, units * fit_samples);
      spdlog::info("{} on {}: {:.2f} KiB per unit + {} per call; at most {} units per batch "
                   "(largest samples: {} units each); a warm-up batch of {} reserved {} of the "
                   "{} each call may use",
                   name, device, per_unit / 1024.0, format_bytes(static_cast<int64_t>(fixed)),
                   units * fit_samples, units, fit_samples,
                   format_bytes(check.peak_extra_reserved), format_bytes(b.per_call_bytes));
    }
    spdlog::info("{}: budget {} (weights {}, {} concurrent calls of {} each)", device,
                 format_bytes(b.budget_bytes), format_bytes(b.weights_bytes), b.concurrent_calls,
                 format_bytes(b.per_call_bytes));
    budgets.push_back(b);
  }
  return budgets;
}

}  // namespace precompute
