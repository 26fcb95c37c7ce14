// load_encoder() and the process-wide LibTorch settings declared in encoders/encoder.hpp.

#include <ATen/Parallel.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <filesystem>
#include <future>
#include <sstream>
#include <thread>

#ifdef PRECOMPUTE_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#endif

#include <algorithm>

#include "encoders/audio_encoder.hpp"
#include "encoders/bert_text_encoder.hpp"
#include "encoders/encoder.hpp"
#include "encoders/text_encoder.hpp"
#include "encoders/video_encoder.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"

namespace precompute {

namespace {

// A BERT folder's identity (model_sha256()).
std::string folder_sha256(const std::filesystem::path& dir, const std::atomic<bool>* cancelled) {
  std::vector<std::filesystem::path> files;
  for (const auto& entry : std::filesystem::recursive_directory_iterator(dir)) {
    const auto ext = entry.path().extension();
    if (entry.is_regular_file() && (ext == ".json" || ext == ".txt" || ext == ".safetensors")) {
      files.push_back(entry.path());
    }
  }
  std::sort(files.begin(), files.end());
  Sha256 h;
  for (const auto& file : files) {
    h.update(file.lexically_relative(dir).generic_string());
    h.update(sha256_file(file, cancelled));
    if (cancelled != nullptr && cancelled->load()) return "";
  }
  return h.hex_digest();
}

}  // namespace

std::string model_sha256(const Config& config, Modality modality,
                         const std::atomic<bool>* cancelled) {
  switch (modality) {
    case Modality::kVideo:
      return sha256_file(config.video.encoder.path, cancelled);
    case Modality::kAudio:
      return sha256_file(config.audio.encoder.path, cancelled);
    case Modality::kText:
      return config.text.encoder.type == EncoderType::kBert
                 ? folder_sha256(config.text.encoder.path, cancelled)
                 : sha256_file(config.text.encoder.path, cancelled);
  }
  PC_ASSERT(false, "unknown modality");
}

std::unique_ptr<Encoder> load_encoder(const Config& config, Modality modality,
                                      const std::string& device, ModelHash hash) {
  const auto resolved = resolve_device(device);
  if (!hash.valid()) {
    hash = std::async(std::launch::async, [&config, modality] {
             return model_sha256(config, modality);
           }).share();
  }
  switch (modality) {
    case Modality::kVideo:
      return make_video_encoder(config.video, resolved, std::move(hash));
    case Modality::kAudio:
      return make_audio_encoder(config.audio, resolved, std::move(hash));
    case Modality::kText:
      return config.text.encoder.type == EncoderType::kBert
                 ? make_bert_text_encoder(config.text, resolved, std::move(hash))
                 : make_text_encoder(config.text, resolved, std::move(hash));
  }
  PC_ASSERT(false, "unknown modality");
}

void configure_torch_threads(int threads) {
  const int n = threads > 0 ? threads : static_cast<int>(std::thread::hardware_concurrency());
  at::set_num_threads(std::max(1, n));
}

std::string resolve_device(const std::string& device) {
  if (device == "cpu") return device;
  const int available = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count())
                                                    : 0;
  PC_CHECK(available > 0, ConfigError, "device '", device,
           "' was asked for, but this process sees no CUDA device (LibTorch ", TORCH_VERSION,
           "); use --device cpu, or check the driver and CUDA_VISIBLE_DEVICES");
  const int index = device == "cuda" ? 0 : std::stoi(device.substr(5));
  PC_CHECK(index < available, ConfigError, "device '", device, "' does not exist: ", available,
           " CUDA device(s) visible (cuda:0 .. cuda:", available - 1, ")");
  return "cuda:" + std::to_string(index);
}

std::string describe_devices() {
  std::ostringstream out;
  out << "LibTorch " << TORCH_VERSION << ", " << at::get_num_threads() << " CPU threads, ";
  const int cuda = torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0;
  out << cuda << " CUDA device(s)";
  return out.str();
}


std::vector<DeviceMemoryPeak> device_memory_peaks() {
  std::vector<DeviceMemoryPeak> peaks;
#ifdef PRECOMPUTE_WITH_CUDA
  if (!torch::cuda::is_available()) return peaks;
  // A run on the CPU of a machine with a GPU never starts the allocator, whose statistics then
  // refuse every device.
  if (!c10::cuda::CUDACachingAllocator::get()->initialized()) return peaks;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  for (int d = 0; d < static_cast<int>(torch::cuda::device_count()); ++d) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d);
    if (stats.reserved_bytes[aggregate].peak == 0) continue;
    peaks.push_back({"cuda:" + std::to_string(d), stats.allocated_bytes[aggregate].peak,
                     stats.reserved_bytes[aggregate].peak});
  }
#endif
  return peaks;
}

namespace {

#ifdef PRECOMPUTE_WITH_CUDA
// The CUDA device index of "cuda:N"; -1 for the CPU.
int cuda_index(const std::string& device) { return cuda_ordinal(device).value_or(-1); }
#endif

}  // namespace

std::optional<DeviceMemoryUse> device_memory_use(const std::string& device) {
#ifdef PRECOMPUTE_WITH_CUDA
  const int index = cuda_index(device);
  if (index < 0) return std::nullopt;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  DeviceMemoryUse use;
  use.allocated_bytes = stats.allocated_bytes[aggregate].current;
  use.reserved_bytes = stats.reserved_bytes[aggregate].current;
  use.peak_allocated_bytes = stats.allocated_bytes[aggregate].peak;
  use.peak_reserved_bytes = stats.reserved_bytes[aggregate].peak;
  size_t free = 0, total = 0;
  const c10::cuda::CUDAGuard guard(static_cast<c10::DeviceIndex>(index));
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  use.free_bytes = static_cast<int64_t>(free);
  use.total_bytes = static_cast<int64_t>(total);
  return use;
#else
  (void)device;
  return std::nullopt;
#endif
}

void reset_device_memory_peaks(const std::string& device) {
#ifdef PRECOMPUTE_WITH_CUDA
  const int index = cuda_index(device);
  if (index >= 0) c10::cuda::CUDACachingAllocator::resetPeakStats(index);
#else
  (void)device;
#endif
}

void release_cached_device_memory(const std::string& device) {
#ifdef PRECOMPUTE_WITH_CUDA
  if (cuda_index(device) >= 0) c10::cuda::CUDACachingAllocator::emptyCache();
#else
  (void)device;
#endif
}

void cap_device_memory(const std::string& device, int64_t bytes) {
#ifdef PRECOMPUTE_WITH_CUDA
  const int index = cuda_index(device);
  if (index < 0) return;
  const auto use = device_memory_use(device);
  const double fraction =
      std::min(1.0, static_cast<double>(bytes) / static_cast<double>(use->total_bytes));
  c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction, index);
#else
  (void)device;
  (void)bytes;
#endif
}

}  // namespace precompute
