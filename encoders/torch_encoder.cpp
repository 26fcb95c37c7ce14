#include "encoders/torch_encoder.hpp"

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <cstdlib>
#include <optional>

#include "encoders/model_failure_message.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"

#ifdef PRECOMPUTE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif

namespace precompute {
namespace {

// What a batch of modality `m` costs in the units the batch limits use.
int64_t batch_cost(Modality m, const std::vector<PreparedSamplePtr>& batch) {
  int64_t cost = 0;
  for (const auto& s : batch) cost += sample_cost(m, *s);
  return cost;
}

// Test hook for the out-of-memory tests on machines without a GPU:
// PRECOMPUTE_TEST_OOM_ABOVE_COST=N makes every batch costing more than N throw the real
// c10::OutOfMemoryError, as the CUDA caching allocator does, so that the whole recovery path runs.
void inject_out_of_memory(Modality m, const std::vector<PreparedSamplePtr>& batch) {
  static const int64_t limit = [] {
    const char* value = std::getenv("PRECOMPUTE_TEST_OOM_ABOVE_COST");
    return value == nullptr ? int64_t{-1} : std::strtoll(value, nullptr, 10);
  }();
  if (limit < 0) return;
  const int64_t cost = batch_cost(m, batch);
  TORCH_CHECK_WITH(OutOfMemoryError, cost <= limit, "test allocator: out of memory for a batch "
                   "costing ", cost, " (PRECOMPUTE_TEST_OOM_ABOVE_COST=", limit, ")");
}

}  // namespace

TorchEncoder::TorchEncoder(Modality modality, const EncoderSection& section,
                           const std::string& device, std::string model_sha256)
    : device_(device) {
  info_.modality = modality;
  info_.device = device_.str();
  info_.model_file = section.encoder.path.filename().string();
  info_.model_sha256 = std::move(model_sha256);
  info_.per_step = section.pooling_mode() == Pooling::kNone;
#ifdef PRECOMPUTE_WITH_CUDA
  if (device_.is_cuda()) {
    info_.concurrent_calls = 2;
    for (int i = 0; i < info_.concurrent_calls; ++i) {
      lanes_.push_back(std::make_unique<Lane>(
          c10::cuda::getStreamFromPool(false, device_.index()).unwrap()));
      free_lanes_.push_back(lanes_.back().get());
    }
  }
#endif
}

// Note [One thread per CUDA stream]
// Each GPU call runs on its lane's own thread, not on the pipeline's thread that asked for it.
// cuBLAS keeps a handle per thread and LibTorch a workspace per handle and stream (32 MiB on
// Hopper), allocated from the caching allocator and kept for the life of the process; called
// from whichever of the pipeline's many threads ran the batch, an encoder left one workspace
// per thread and stream it had met, outside every share of the memory budget, until calls ran
// out of memory with the device idle and samples failed as `oom` (tools/bench/gpu_budget_split.py:
// ResNet-50 beside BERT-base under 1 GiB, 63 of 64 clips, docs/benchmarks.md, "Three encoders on
// one GPU"). With a thread per stream they are as many as the streams, each made by the warm-up
// (warm_up runs every lane) and so counted as resident before the budget is shared.
std::vector<SampleEmbedding> TorchEncoder::encode(const std::vector<PreparedSamplePtr>& batch) {
  if (batch.empty()) return {};
  if (lanes_.empty()) return encode_on(batch, std::nullopt);
  Lane* lane = nullptr;
  {
    std::lock_guard lock(lanes_mutex_);
    PC_ASSERT(!free_lanes_.empty(), "more concurrent encode() calls than streams");
    lane = free_lanes_.back();
    free_lanes_.pop_back();
  }
  struct ReturnLane {
    TorchEncoder* self;
    Lane* lane;
    ~ReturnLane() {
      std::lock_guard lock(self->lanes_mutex_);
      self->free_lanes_.push_back(lane);
    }
  } return_lane{this, lane};
  std::vector<SampleEmbedding> out;
  lane->thread.run([&] { out = encode_on(batch, lane->stream); });
  return out;
}

std::vector<SampleEmbedding> TorchEncoder::encode_on(const std::vector<PreparedSamplePtr>& batch,
                                                     const std::optional<c10::Stream>& stream) {
  // InferenceMode is thread-local: set it on the thread that runs this batch.
  c10::InferenceMode inference_mode;
  c10::DeviceGuard device_guard(device_);
#ifdef PRECOMPUTE_WITH_CUDA
  std::optional<c10::cuda::CUDAStreamGuard> stream_guard;
  if (stream) stream_guard.emplace(c10::cuda::CUDAStream(c10::cuda::CUDAStream::UNCHECKED, *stream));
#else
  (void)stream;
#endif
  std::vector<SampleEmbedding> out;
  try {
    inject_out_of_memory(info_.modality, batch);
    out = run(batch);
  } catch (const c10::OutOfMemoryError& e) {
#ifdef PRECOMPUTE_WITH_CUDA
    // Blocks cached for the failed batch would make the smaller retries fail too.
    if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
    PC_THROW(DeviceOutOfMemoryError, modality_name(info_.modality), " encoder ",
             info_.model_file, " on ", info_.device, " ran out of memory on a batch of ",
             batch.size(), " (cost ", batch_cost(info_.modality, batch),
             "): ", e.what_without_backtrace());
  } catch (const c10::Error& e) {
    // cuBLAS and cuDNN allocate their handles and workspaces outside the caching allocator: on
    // a full device they fail with their own status, which is out of memory all the same.
    const std::string what = e.what_without_backtrace();
    if (what.find("ALLOC_FAILED") != std::string::npos ||
        what.find("CUDA error: out of memory") != std::string::npos) {
#ifdef PRECOMPUTE_WITH_CUDA
      if (device_.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
      PC_THROW(DeviceOutOfMemoryError, modality_name(info_.modality), " encoder ",
               info_.model_file, " on ", info_.device, " ran out of memory on a batch of ",
               batch.size(), " (cost ", batch_cost(info_.modality, batch), "): ", what);
    }
    // Outside a TorchScript module (the native BERT, pooling): the same one-line message as
    // Note [A model's failure in one line], the whole text at debug level.
    if (log_enabled(LogLevel::kDebug)) {
      log_message(LogLevel::kDebug, detail::concat(modality_name(info_.modality), " encoder ",
                                                   info_.model_file, " failed: ", what));
    }
    PC_THROW(ModelError, modality_name(info_.modality), " encoder ", info_.model_file, " on ",
             info_.device, " failed on a batch of ", batch.size(), ": ",
             model_message_line(what), " (the whole error: --log-level debug)");
  }
  PC_ASSERT(out.size() == batch.size(), "encoder returned ", out.size(), " embeddings for ",
            batch.size(), " samples");
  for (size_t i = 0; i < out.size(); ++i) out[i].seq = batch[i]->seq;
  return out;
}

ParameterSummary TorchEncoder::parameters() const {
  ParameterSummary summary;
  for (const auto& t : weights()) {
    if (!t.defined()) continue;
    ++summary.tensors;
    summary.elements += t.numel();
    summary.bytes += static_cast<int64_t>(t.nbytes());
    const auto device = t.device().str();
    const std::string dtype(c10::toString(t.scalar_type()));
    if (std::find(summary.devices.begin(), summary.devices.end(), device) ==
        summary.devices.end()) {
      summary.devices.push_back(device);
    }
    if (std::find(summary.dtypes.begin(), summary.dtypes.end(), dtype) == summary.dtypes.end()) {
      summary.dtypes.push_back(dtype);
    }
  }
  return summary;
}

std::string TorchEncoder::input_dtype() const { return c10::toString(compute_dtype()); }

void TorchEncoder::warm_up(PreparedSample sample) {
  const std::vector<PreparedSamplePtr> batch{
      std::make_shared<const PreparedSample>(std::move(sample))};
  // Every lane once, so that what each stream's thread keeps (cuBLAS' handle and workspace)
  // exists before the memory budget measures what is resident (Note [One thread per CUDA
  // stream]); on the CPU, the calling thread.
  std::vector<SampleEmbedding> out;
  for (const auto& lane : lanes_) {
    lane->thread.run([&] { out = encode_on(batch, lane->stream); });
  }
  if (lanes_.empty()) out = encode(batch);
  PC_CHECK(out.size() == 1 && out[0].dim > 0, ModelError, modality_name(info_.modality),
           " model ", info_.model_file, " returned no vector in its warm-up pass");
  info_.dim = out[0].dim;
}

void TorchEncoder::wait_for_device() const {
#ifdef PRECOMPUTE_WITH_CUDA
  if (device_.is_cuda()) c10::cuda::getCurrentCUDAStream(device_.index()).synchronize();
#endif
}

at::Tensor TorchEncoder::host_buffer(at::IntArrayRef sizes, at::ScalarType type) const {
  return at::empty(sizes,
                   at::TensorOptions().dtype(type).pinned_memory(device_.is_cuda()));
}

}  // namespace precompute
