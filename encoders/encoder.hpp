#pragma once
// The interface the pipeline sees of an encoder: a batch of prepared samples in, one embedding
// per sample out. Free of LibTorch (Note [Two fmt libraries] in
// cmake/PrecomputeDependencies.cmake). An Encoder instance owns one model on one device and is
// used by one thread at a time (the inference stage checks instances out of a pool).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

struct EncoderInfo {
  Modality modality = Modality::kVideo;
  std::string device;        // "cpu", "cuda:0", ...
  std::string model_file;    // file name of the model
  std::string model_sha256;  // content hash of the model file
  int64_t dim = 0;           // width of the stored vectors, learnt from the warm-up pass
  bool per_step = false;     // one vector per frame / window / token (pooling: none)
  // Calls of encode() this instance may run at once (on different threads): a GPU encoder runs
  // each on its own CUDA stream, so that one batch's host work overlaps another's kernels.
  int concurrent_calls = 1;
};

class Encoder {
 public:
  virtual ~Encoder() = default;
  Encoder() = default;
  Encoder(const Encoder&) = delete;
  Encoder& operator=(const Encoder&) = delete;

  virtual const EncoderInfo& info() const = 0;

  // Embeds this modality of every sample in `batch` (each has it). Returns one embedding per
  // sample, in order. Throws ModelError when the batch as a whole cannot be embedded (the caller
  // retries samples alone to find the one at fault).
  virtual std::vector<SampleEmbedding> encode(const std::vector<PreparedSamplePtr>& batch) = 0;
};

// Loads the encoder of `modality` as the config describes it onto `device`, and runs one warm-up
// batch through it, which checks the model's inputs and outputs against the config and learns the
// output width. Throws ConfigError/ModelError with the fix.
std::unique_ptr<Encoder> load_encoder(const Config& config, Modality modality,
                                      const std::string& device);

// Sets LibTorch's intra-op threads (0: one per core) before any model runs.
void configure_torch_threads(int threads);

// "cuda" -> "cuda:0"; checks that the device exists in this process. Throws ConfigError.
std::string resolve_device(const std::string& device);

// A short description of the compute devices (LibTorch version, CUDA devices) for the log.
std::string describe_devices();

// The CUDA caching allocator's peak memory on one device since the process started.
struct DeviceMemoryPeak {
  std::string device;          // "cuda:0"
  int64_t allocated_bytes = 0;  // held by tensors
  int64_t reserved_bytes = 0;   // taken from the driver, allocated + cache
};
// One entry per CUDA device this process used; empty without CUDA.
std::vector<DeviceMemoryPeak> device_memory_peaks();

}  // namespace precompute
