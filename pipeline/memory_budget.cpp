#include "pipeline/memory_budget.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <map>

#include "encoders/bert/text_settings.hpp"
#include "encoders/text/text_tokenizer.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Memory budgets]
// run.gpu_memory_budget bounds what the CUDA caching allocator may reserve on each GPU. Two
// mechanisms make that hold:
// - The allocator is capped at the budget (setMemoryFraction), so it can never reserve more: an
//   allocation past it fails with c10::OutOfMemoryError, which the encode stage recovers from by
//   splitting the batch (Note [Out of memory]). The cap is the guarantee.
// - Batches are sized so that the cap is rarely hit: each GPU encoder is measured at start-up on
//   batches of a probe sample (largest_sample: the longest the config allows where it sets a
//   length, else 16 frames or 10 s of audio), in its batch-limit unit (frames, audio samples,
//   tokens). The extra memory a call reserves above what was reserved before it is fitted as
//   fixed + per_unit * units from two batch sizes. The budget, less the weights of every encoder
//   on the device, is shared by the encode calls that may run there at once (each GPU encoder
//   runs two, on two streams) by measured need (Note [Shares by measured need]); a modality's
//   cost limit is the most units whose fitted cost fits its share. One batch at that limit then
//   runs as a warm-up, as text-embeddings-inference does, so that a budget too small fails at
//   start-up, not after an hour. A budget that cannot hold one largest sample is refused with
//   the numbers.
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
      auto tokens = tokenizer->encode(words);
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

// Lowers the modality's cost limit (frames, audio samples, tokens) to `units`. The sample count
// limit stays: memory follows units, so more short samples fit than largest ones. Audio is cut
// in whole seconds, as audio.max_batch_seconds is.
void lower_cost_limit(BatchLimits& limits, const Config& config, Modality m, int64_t units) {
  int64_t value = std::max<int64_t>(1, units);
  if (m == Modality::kAudio) {
    const int64_t rate = std::max(1, config.audio.sample_rate);
    value = std::max<int64_t>(1, units / rate) * config.audio.sample_rate;
  }
  limits.max_cost = limits.max_cost > 0 ? std::min(limits.max_cost, value) : value;
}

}  // namespace

namespace {

// One GPU encoder's measured cost on its device: peak extra reservation per call of
// fixed + per_unit * units, from probes at batch 1 and a larger batch.
struct EncoderCost {
  Encoder* encoder = nullptr;
  Modality modality = Modality::kVideo;
  PreparedSamplePtr sample;
  int64_t units = 0;          // of one largest sample
  int calls = 0;              // encode calls of this encoder that may run at once
  int64_t need = 0;           // one largest sample alone, per call
  double per_unit = 0.0;
  double fixed = 0.0;
  int64_t want = 0;           // a full batch of the config (batch_size largest samples), per
                              // call, with the headroom below
  int64_t share = 0;          // what each call of it may use
};

// A quarter kept for fragmentation, the other calls' cached blocks and batches shaped unlike the
// probes: with 90% of the share, batches split after running out of memory many times over
// (docs/benchmarks.md, "GPU memory budgets, out-of-memory recovery, doctor").
constexpr double kUsable = 0.75;

EncoderCost measure(Encoder& e, const Config& config, int64_t available, int64_t budget) {
  EncoderCost c;
  c.encoder = &e;
  c.modality = e.info().modality;
  c.calls = std::max(1, e.info().concurrent_calls);
  c.sample = largest_sample(config, c.modality);
  c.units = sample_cost(c.modality, *c.sample);
  const auto one = probe_batch(e, c.sample, 1);
  const std::string name(modality_name(c.modality));
  PC_CHECK(!one.out_of_memory, ConfigError, "run.gpu_memory_budget ", format_bytes(budget),
           " on ", e.info().device, ": one ", name, " sample of ", c.units,
           " units does not fit next to the encoders' weights; raise the budget or make samples "
           "smaller (video.size, video.num_frames, audio.window_s, text.tokenizer.max_length)");
  c.need = std::max<int64_t>(1, one.peak_extra_reserved);
  // A second point for the slope, as large as the whole budget suggests, capped by the config.
  int second = static_cast<int>(std::clamp<int64_t>(
      available / c.calls / std::max<int64_t>(1, 4 * c.need), 2, 64));
  second = std::min(second, std::max(2, config.section(c.modality).batch_size));
  BatchProbe two = probe_batch(e, c.sample, second);
  while (two.out_of_memory && second > 2) {
    second /= 2;
    two = probe_batch(e, c.sample, second);
  }
  c.per_unit = two.out_of_memory
                   ? static_cast<double>(available) / static_cast<double>(2 * c.units * c.calls)
                   : std::max(1.0, static_cast<double>(two.peak_extra_reserved -
                                                       one.peak_extra_reserved) /
                                       static_cast<double>(two.units - one.units));
  c.fixed = std::max(0.0, static_cast<double>(one.peak_extra_reserved) -
                              c.per_unit * static_cast<double>(c.units));
  const double full = c.fixed + c.per_unit * static_cast<double>(c.units) *
                                    static_cast<double>(config.section(c.modality).batch_size);
  c.want = std::max(c.need, static_cast<int64_t>(full / kUsable));
  return c;
}

}  // namespace

// Note [Shares by measured need]
// The budget left after the weights is split by what each encoder was measured to need, not
// evenly per call: an even split refused 1 GiB for ResNet-50 + BERT-base + a small audio encoder
// because one video call needs 164 MiB while the audio encoder needs almost nothing. Each call
// first gets what one largest sample needs (refused, with every encoder's need listed, when even
// that does not fit); what is left goes to each call in proportion to what a full batch of the
// config would add, and no call gets more than that. The proportion is computed in doubles; for
// sizes past 2^53 bytes (or when rounding lands a byte high) the shares are trimmed back so that
// the calls together never get more than is available, and no size overflows on the way
// (tests/unit/memory_budget_test.cpp). docs/benchmarks.md, "Three encoders on one GPU: shares by
// measured need", has the three-encoder job that an even split refused.

namespace {

// a + b and a * b for a, b >= 0, held at INT64_MAX instead of overflowing.
int64_t add_held(int64_t a, int64_t b) {
  return a > std::numeric_limits<int64_t>::max() - b ? std::numeric_limits<int64_t>::max() : a + b;
}
int64_t mul_held(int64_t a, int64_t b) {
  return b != 0 && a > std::numeric_limits<int64_t>::max() / b
             ? std::numeric_limits<int64_t>::max()
             : a * b;
}

}  // namespace

BudgetSplit share_by_need(const std::vector<EncoderNeed>& encoders, int64_t available,
                          const std::string& device, int64_t budget) {
  // The inputs as the split reads them: at least one call, need >= 0, want >= need.
  std::vector<EncoderNeed> es = encoders;
  for (auto& e : es) {
    e.calls = std::max(1, e.calls);
    e.need = std::max<int64_t>(0, e.need);
    e.want = std::max(e.need, e.want);
  }
  BudgetSplit split;
  int64_t needed = 0;
  bool past_int64 = false;  // the sum is past INT64_MAX (needed is held there): too much
  double wanted = 0;
  for (const auto& e : es) {
    const int64_t calls_need = mul_held(e.need, e.calls);
    past_int64 = past_int64 || e.need > std::numeric_limits<int64_t>::max() / e.calls ||
                 needed > std::numeric_limits<int64_t>::max() - calls_need;
    needed = add_held(needed, calls_need);
    wanted += static_cast<double>(e.want - e.need) * e.calls;
  }
  if (past_int64 || needed > available) {
    std::string needs;
    for (const auto& e : es) {
      needs += fmt::format("{}{} {} x {} call(s)", needs.empty() ? "" : ", ",
                           modality_name(e.modality), format_bytes(e.need), e.calls);
    }
    split.refusal = detail::concat(
        "run.gpu_memory_budget ", format_bytes(budget), " on ", device, " leaves ",
        format_bytes(available), " after what the encoders keep resident, but one largest "
        "sample per "
        "encoder call needs ", format_bytes(needed), " (", needs, "); raise the budget or make "
        "samples smaller (video.size, video.num_frames, audio.window_s, "
        "text.tokenizer.max_length)");
    return split;
  }
  const int64_t spare = available - needed;
  const double ratio =
      wanted <= static_cast<double>(spare) ? 1.0 : static_cast<double>(spare) / wanted;
  // What each call gets on top of its need: never more than want - need (a double that rounds
  // up to 2^63 is not converted).
  std::vector<int64_t> extra;
  for (const auto& e : es) {
    const int64_t most = e.want - e.need;
    const double x = ratio * static_cast<double>(most);
    extra.push_back(ratio == 1.0 || x >= static_cast<double>(most)
                        ? most
                        : std::min(most, static_cast<int64_t>(x)));
  }
  // Trim what rounding put past `spare` (nothing, short of sizes past 2^53 bytes or a byte of
  // rounding), from the largest extra.
  const auto used = [&] {
    int64_t u = 0;
    for (size_t i = 0; i < es.size(); ++i) u = add_held(u, mul_held(extra[i], es[i].calls));
    return u;
  };
  for (int64_t over = used() - spare; over > 0; over = used() - spare) {
    const size_t k = static_cast<size_t>(
        std::max_element(extra.begin(), extra.end()) - extra.begin());
    extra[k] -= std::min(extra[k], over / es[k].calls + 1);
  }
  for (size_t i = 0; i < es.size(); ++i) split.shares.push_back(es[i].need + extra[i]);
  return split;
}

BudgetedLimits apply_memory_budget(const Config& config, const EncoderPools& pools) {
  BudgetedLimits out{batch_limits(config), {}};
  auto& budgets = out.devices;
  if (!config.run.gpu_memory_budget.set()) return out;

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
    return out;
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
    // What stays allocated between calls: the weights, and what each encoder's streams keep
    // from their warm-up on (cuBLAS' workspaces, Note [One thread per CUDA stream] in
    // encoders/torch_encoder.cpp). The calls share the rest.
    release_cached_device_memory(device);
    const auto resident = device_memory_use(device);
    b.resident_bytes = std::max(b.weights_bytes, resident ? resident->reserved_bytes : 0);
    const int64_t available = b.budget_bytes - b.resident_bytes;
    PC_CHECK(available > 0, ConfigError, "run.gpu_memory_budget ", format_bytes(b.budget_bytes),
             " on ", device, " does not even hold what the encoders keep resident, ",
             format_bytes(b.resident_bytes), " (weights ", format_bytes(b.weights_bytes),
             "); raise it");
    b.per_call_bytes = available / std::max(1, b.concurrent_calls);
    cap_device_memory(device, b.budget_bytes);

    std::vector<EncoderCost> costs;
    for (auto* e : encoders) costs.push_back(measure(*e, config, available, b.budget_bytes));
    std::vector<EncoderNeed> needs;
    for (const auto& c : costs) needs.push_back({c.modality, c.calls, c.need, c.want});
    const BudgetSplit split = share_by_need(needs, available, device, b.budget_bytes);
    if (split.refused()) PC_THROW(ConfigError, split.refusal);
    for (size_t i = 0; i < costs.size(); ++i) costs[i].share = split.shares[i];

    for (auto& c : costs) {
      const Modality m = c.modality;
      const std::string name(modality_name(m));
      int64_t fit_units = static_cast<int64_t>(
          (kUsable * static_cast<double>(c.share) - c.fixed) / c.per_unit);
      fit_units = std::max(fit_units, c.units);
      int fit_samples = static_cast<int>(std::max<int64_t>(1, fit_units / c.units));
      fit_samples = std::min(fit_samples, config.section(m).batch_size);
      // Warm-up at the largest planned batch; shrink until it fits.
      BatchProbe check = probe_batch(*c.encoder, c.sample, fit_samples);
      while ((check.out_of_memory || check.peak_extra_reserved > c.share) && fit_samples > 1) {
        fit_samples = std::max(1, fit_samples * 3 / 4);
        check = probe_batch(*c.encoder, c.sample, fit_samples);
      }
      PC_ASSERT(out.limits[modality_index(m)], name, " has an encoder but no batch limits");
      lower_cost_limit(*out.limits[modality_index(m)], config, m, c.units * fit_samples);
      spdlog::info("{} on {}: {:.2f} KiB per unit + {} per call; {} per call for a largest "
                   "sample, {} per call given; at most {} units per batch (largest samples: {} "
                   "units each); a warm-up batch of {} reserved {}",
                   name, device, c.per_unit / 1024.0, format_bytes(static_cast<int64_t>(c.fixed)),
                   format_bytes(c.need), format_bytes(c.share), c.units * fit_samples, c.units,
                   fit_samples, format_bytes(check.peak_extra_reserved));
      b.encoders.push_back({m, c.need, c.share, c.units,
                            out.limits[modality_index(m)]->max_cost, fit_samples,
                            check.peak_extra_reserved});
    }
    spdlog::info("{}: budget {} (resident {}: weights {} and what the encoders' streams keep; "
                 "{} concurrent calls, shared by measured need)",
                 device, format_bytes(b.budget_bytes), format_bytes(b.resident_bytes),
                 format_bytes(b.weights_bytes), b.concurrent_calls);
    budgets.push_back(b);
  }
  return out;
}

}  // namespace precompute
