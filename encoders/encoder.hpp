#pragma once
// The interface the pipeline sees of an encoder: a batch of prepared samples in, one embedding
// per sample out. Free of LibTorch (Note [Two fmt libraries] in
// cmake/PrecomputeDependencies.cmake). An Encoder instance owns one model on one device and is
// used by one thread at a time (the inference stage checks instances out of a pool).

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
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

// Where a model's weights live and what they take: for `precompute doctor`.
struct ParameterSummary {
  int64_t tensors = 0;   // parameters and buffers
  int64_t elements = 0;
  int64_t bytes = 0;
  std::vector<std::string> devices;  // distinct, e.g. {"cuda:0"}
  std::vector<std::string> dtypes;   // distinct, e.g. {"BFloat16"}
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
  // retries samples alone to find the one at fault), and DeviceOutOfMemoryError, a ModelError,
  // when the device ran out of memory (the caller splits the batch; Note [Out of memory] in
  // pipeline/stages/encode_stage.cpp): the LibTorch encoders turn c10::OutOfMemoryError into it,
  // so the pipeline never sees a LibTorch type.
  virtual std::vector<SampleEmbedding> encode(const std::vector<PreparedSamplePtr>& batch) = 0;

  // The model's weights (parameters and buffers).
  virtual ParameterSummary parameters() const = 0;
  // The dtype the encoder converts inputs to (what the model computes in), e.g. "Float".
  virtual std::string input_dtype() const = 0;
};

// The identity of `modality`'s model, as EncoderInfo::model_sha256 records it: the SHA-256 of a
// TorchScript file, or of a BERT folder's files (the names and contents of its .json, .txt and
// .safetensors files, in sorted order: a README edit does not change it). Once `*cancelled` is
// set it stops early and returns "".
std::string model_sha256(const Config& config, Modality modality,
                         const std::atomic<bool>* cancelled = nullptr);

// model_sha256() on its way: computed on a thread of its own, beside the loading.
using ModelHash = std::shared_future<std::string>;

// Loads the encoder of `modality` as the config describes it onto `device`, and runs one warm-up
// batch through it, which checks the model's inputs and outputs against the config and learns the
// output width. Throws ConfigError/ModelError with the fix. `hash`: the model's identity if
// already started (EarlyStart), else the loading starts it.
std::unique_ptr<Encoder> load_encoder(const Config& config, Modality modality,
                                      const std::string& device, ModelHash hash = {});

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

// The CUDA caching allocator's view of one device (Note [Memory budgets] in
// pipeline/memory_budget.cpp).
struct DeviceMemoryUse {
  int64_t allocated_bytes = 0;
  int64_t reserved_bytes = 0;
  int64_t peak_allocated_bytes = 0;  // since the last reset_device_memory_peaks()
  int64_t peak_reserved_bytes = 0;
  int64_t total_bytes = 0;  // the card's memory
  int64_t free_bytes = 0;   // free on the card now (all processes)
};
// std::nullopt for "cpu".
std::optional<DeviceMemoryUse> device_memory_use(const std::string& device);
void reset_device_memory_peaks(const std::string& device);
// Returns cached blocks to the driver (after an out-of-memory error, between probes).
void release_cached_device_memory(const std::string& device);
// Caps what the caching allocator may reserve on `device`; past it, allocations fail with
// c10::OutOfMemoryError (which the encode stage recovers from). No effect on "cpu".
void cap_device_memory(const std::string& device, int64_t bytes);

}  // namespace precompute
