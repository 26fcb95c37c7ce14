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
#include "pipeline/core/sample.hpp"
#include "pipeline/stages/encode_stage.hpp"

namespace precompute {

// The largest sample of `m` the config lets through, made up (zeros, [CLS] x ... [SEP]): video
// clips of video.num_frames frames (16 in fps mode, whose clips vary), audio of one window (10 s
// in whole-clip mode), text of max_length tokens. Probes batch it.
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

// What every encoder call on one device may use, and the limit each encoder got from it.
struct DeviceBudget {
  std::string device;
  int64_t budget_bytes = 0;
  int64_t weights_bytes = 0;   // all encoders' weights on the device
  int concurrent_calls = 0;    // encode calls that may run at once on the device
  int64_t per_call_bytes = 0;  // (budget - weights) / calls: the mean share; each encoder's own
                               // follows its measured need
};

// Applies run.gpu_memory_budget: caps the caching allocator of every GPU the encoders use,
// measures each GPU encoder's cost per unit, and lowers `config`'s batch limits (batch_size,
// max_batch_frames / max_batch_seconds / max_batch_tokens) so that the largest planned batch fits
// its share, then runs that batch once to check. Logs the limits chosen. Throws ConfigError when
// the budget cannot hold one largest sample. No effect without a budget or without GPUs.
std::vector<DeviceBudget> apply_memory_budget(Config& config, const EncoderPools& pools);

}  // namespace precompute
