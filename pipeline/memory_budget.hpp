#pragma once
// Device memory budgets (Note [Memory budgets] in memory_budget.cpp): measuring what an
// encoder's batches cost on its device, and turning run.gpu_memory_budget into batch limits
// before a run starts. Also the measurements `precompute doctor` prints.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "encoders/encoder.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/sample.hpp"
#include "pipeline/stages/batch_router.hpp"
#include "pipeline/stages/encode_stage.hpp"

namespace precompute {

// The sample the calibration probes with ("largest sample" in its messages), made up (zeros,
// [CLS] word ... [SEP]): text of text.tokenizer.max_length tokens and video clips of
// video.sampling.num_frames frames, the longest the config lets through; where the config sets
// no length (fps sampling, whole-clip audio) 16 frames and 10 s; audio of one window of
// audio.window_s otherwise. Costs are fitted per unit (token, frame, audio sample), so a longer
// sample is priced by its own units (docs/usage.md, "Memory"). Probes batch it.
PreparedSamplePtr largest_sample(const Config& config, Modality m);

// One encode of `batch` copies of a sample, with the device memory around it.
struct BatchProbe {
  int batch = 0;
  int64_t units = 0;           // frames, audio samples or tokens in the batch
  bool out_of_memory = false;  // the device ran out of memory (the other fields are then 0)
  double seconds = 0.0;
  std::optional<DeviceMemoryUse> before;  // unset on the CPU
  std::optional<DeviceMemoryUse> after;
  int64_t peak_extra_reserved = 0;  // peak reserved during the call minus reserved before
  int64_t rows_per_sample = 0;      // stored vectors per sample (1 when pooled)
  int64_t dim = 0;
};
BatchProbe probe_batch(Encoder& encoder, const PreparedSamplePtr& sample, int batch);

// What one GPU encoder got from its device's budget (the run summary's memory.gpu_budget).
struct EncoderBudget {
  Modality modality = Modality::kVideo;
  int64_t need_bytes = 0;      // per call, for one largest sample alone
  int64_t share_bytes = 0;     // per call, given
  int64_t sample_units = 0;    // cost units (frames, audio samples, tokens) of a largest sample
  int64_t batch_units = 0;     // the cost limit of a batch it got
  int warmup_batch = 0;        // largest samples in the batch that checked the limit
  int64_t warmup_reserved_bytes = 0;  // what that batch reserved beyond what was reserved before
};

// What every encoder call on one device may use, and the limit each encoder got from it.
struct DeviceBudget {
  std::string device;
  int64_t budget_bytes = 0;
  int64_t weights_bytes = 0;   // all encoders' weights on the device
  int64_t resident_bytes = 0;  // reserved between calls: the weights and what each encoder's
                               // streams keep (cuBLAS workspaces); at least weights_bytes
  int concurrent_calls = 0;    // encode calls that may run at once on the device
  int64_t per_call_bytes = 0;  // (budget - resident) / calls: the mean share; each encoder's
                               // own follows its measured need
  std::vector<EncoderBudget> encoders;  // the device's GPU encoders, in the order measured
};

// One GPU encoder as the split of its device's budget sees it (Note [Shares by measured need] in
// memory_budget.cpp): bytes of device memory per encode call, measured at start-up above what
// was reserved before the call.
struct EncoderNeed {
  Modality modality = Modality::kVideo;
  int calls = 1;     // encode calls of it that may run at once on the device (below 1: 1)
  int64_t need = 0;  // what one largest sample needs, per call (below 0: 0)
  int64_t want = 0;  // what a full batch of the config would take, per call (below need: need)
};

// The split: what each call of each encoder may use, or why the budget cannot be used.
struct BudgetSplit {
  std::vector<int64_t> shares;  // per call, one per encoder in the order given; empty if refused
  std::string refusal;          // the ConfigError message when refused, else empty
  bool refused() const { return !refusal.empty(); }
};

// Splits the `available` bytes of `device` (run.gpu_memory_budget `budget` less the weights of
// every encoder on it) by measured need: each call first gets its encoder's need, and what is
// left goes in proportion to want - need, no call getting more than its want. Refused, with
// every encoder's need in the message, when one need per call does not fit. The calls' shares
// together never exceed `available`, for any sizes up to INT64_MAX. Pure: no device, no LibTorch.
BudgetSplit share_by_need(const std::vector<EncoderNeed>& encoders, int64_t available,
                          const std::string& device, int64_t budget);

// The batch limits a run cuts by, and what the budget on each GPU came to.
struct BudgetedLimits {
  BatchLimitsByModality limits;  // the config's (batch_limits), cost limits lowered to the budget
  std::vector<DeviceBudget> devices;  // empty without a budget or without GPUs
};

// Applies run.gpu_memory_budget: caps the caching allocator of every GPU the encoders use,
// measures each GPU encoder's cost per unit, and returns the config's batch limits with the cost
// limit (video frames, audio samples, text tokens) of each GPU modality lowered so that the
// largest planned batch fits its share, after running that batch once to check. The sample count
// limit stays the config's. Logs the limits chosen. Throws ConfigError when the budget cannot
// hold one largest sample. Without a budget or without GPUs: the config's limits.
BudgetedLimits apply_memory_budget(const Config& config, const EncoderPools& pools);

}  // namespace precompute
