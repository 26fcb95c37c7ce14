#include "pipeline/media/nvdec.hpp"

extern "C" {
#include <libavutil/hwcontext.h>
}

#include <fmt/format.h>

#include <cstring>
#include <stdexcept>
#include <utility>

#include "pipeline/media/gpu_rgb_kernel.hpp"

#if PRECOMPUTE_WITH_NVDEC
extern "C" {
#include <libavutil/hwcontext_cuda.h>
}
#include <cuda.h>
#include <cuda_runtime.h>
#endif

// Note [NVDEC through FFmpeg]
// NVDEC is reached through FFmpeg's CUDA hwaccel rather than through the nvcuvid API directly:
// the demuxing, the bitstream parsing, the seeks and the frame dropping that decide which frames
// are decoded (Notes [Seeking to what is sampled] and [Skipping frames nobody keeps] in
// video_decoder.cpp) are then the same code for both decoders, and so are the frames' timestamps;
// only where a picture is decoded and converted differs. FFmpeg checks the decoder's
// capabilities (codec, profile, bit depth, chroma format, size) when it sets the hwaccel up, and
// when they fall short it offers the software formats again, which is how a file NVDEC cannot
// take falls back to the CPU (video_decoder.cpp). What a session keeps across files is the CUDA
// context (the device's primary one, which LibTorch uses too: made once), the stream and the
// buffers; FFmpeg makes the NVDEC decoder itself per file. docs/benchmarks.md measures what
// this path reaches against NVIDIA's own PyNvVideoCodec.

namespace precompute {

#if PRECOMPUTE_WITH_NVDEC

namespace {

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(error)));
  }
}

// Makes `device` current for the scope: the decoding thread may be one of oneTBB's workers,
// which run other work (LibTorch's included) that sets its own device.
class DeviceScope {
 public:
  explicit DeviceScope(int device) {
    check_cuda(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != device) check_cuda(cudaSetDevice(device), "cudaSetDevice");
  }
  ~DeviceScope() { cudaSetDevice(previous_); }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace

bool nvdec_built() { return true; }

NvdecSession::NvdecSession(int device) : device_(device) {
  DeviceScope scope(device);
  // FFmpeg's own way to the primary context (av_hwdevice_ctx_create with primary_ctx) insists
  // on its scheduling flags and refuses the context LibTorch has already started with others
  // ("Primary context already active with incompatible flags"). So the context is handed over
  // as it is: made current by the runtime, read back through the driver's cuCtxGetCurrent
  // (found through the runtime, so the binary does not link libcuda, which machines without a
  // GPU lack). FFmpeg does not destroy a context it was given.
  check_cuda(cudaFree(nullptr), "starting CUDA");
  void* get_current = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  check_cuda(cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &get_current, 12000,
                                              cudaEnableDefault, &found),
             "cudaGetDriverEntryPointByVersion(cuCtxGetCurrent)");
  if (get_current == nullptr || found != cudaDriverEntryPointSuccess) {
    throw std::runtime_error("the CUDA driver has no cuCtxGetCurrent");
  }
  CUcontext context = nullptr;
  if (reinterpret_cast<CUresult (*)(CUcontext*)>(get_current)(&context) != CUDA_SUCCESS ||
      context == nullptr) {
    throw std::runtime_error(fmt::format("no CUDA context is current on cuda:{}", device));
  }
  cudaStream_t stream = nullptr;
  check_cuda(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
  hw_device_ = av_hwdevice_ctx_alloc(AV_HWDEVICE_TYPE_CUDA);
  if (hw_device_ == nullptr) {
    cudaStreamDestroy(stream);
    throw std::bad_alloc();
  }
  auto* device_context = reinterpret_cast<AVHWDeviceContext*>(hw_device_->data);
  auto* cuda = static_cast<AVCUDADeviceContext*>(device_context->hwctx);
  cuda->cuda_ctx = context;
  // NVDEC maps each picture on this stream (FFmpeg reads it when it makes a decoder), and the
  // kernel runs on it after the map: ordered without any other synchronisation.
  cuda->stream = stream;
  const int made = av_hwdevice_ctx_init(hw_device_);
  if (made < 0) {
    av_buffer_unref(&hw_device_);
    cudaStreamDestroy(stream);
    stream_ = nullptr;
    char text[AV_ERROR_MAX_STRING_SIZE] = {};
    av_strerror(made, text, sizeof(text));
    throw std::runtime_error(fmt::format(
        "cannot set up FFmpeg's CUDA device on cuda:{} (av_hwdevice_ctx_init): {}", device, text));
  }
}

NvdecSession::~NvdecSession() {
  av_buffer_unref(&hw_device_);
  cudaSetDevice(device_);
  if (device_rgb_ != nullptr) cudaFree(device_rgb_);
  if (host_rgb_ != nullptr) cudaFreeHost(host_rgb_);
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void NvdecSession::to_rgb(const GpuRgbParams& params, uint8_t* out) {
  DeviceScope scope(device_);
  const size_t bytes = size_t{3} * params.out_width * params.out_height;
  if (bytes > rgb_capacity_) {
    if (device_rgb_ != nullptr) cudaFree(device_rgb_);
    if (host_rgb_ != nullptr) cudaFreeHost(host_rgb_);
    device_rgb_ = nullptr;
    host_rgb_ = nullptr;
    rgb_capacity_ = 0;
    check_cuda(cudaMalloc(&device_rgb_, bytes), "cudaMalloc");
    check_cuda(cudaMallocHost(&host_rgb_, bytes), "cudaMallocHost");
    rgb_capacity_ = bytes;
  }
  auto stream = static_cast<cudaStream_t>(stream_);
  check_cuda(static_cast<cudaError_t>(launch_gpu_rgb(params, device_rgb_, stream)),
             "the RGB conversion kernel");
  check_cuda(cudaMemcpyAsync(host_rgb_, device_rgb_, bytes, cudaMemcpyDeviceToHost, stream),
             "cudaMemcpyAsync");
  check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  std::memcpy(out, host_rgb_, bytes);
}

#else

bool nvdec_built() { return false; }

NvdecSession::NvdecSession(int device) : device_(device) {
  throw std::runtime_error(
      "this build of precompute has no CUDA, so no NVDEC: build it with the CUDA toolkit, or "
      "set video.decoder: cpu");
}

NvdecSession::~NvdecSession() = default;

void NvdecSession::to_rgb(const GpuRgbParams&, uint8_t*) {
  throw std::logic_error("NvdecSession::to_rgb in a build without CUDA");
}

#endif

NvdecPool::NvdecPool(const std::vector<int>& devices, int sessions_per_device)
    : devices_(devices) {
  // Interleaved by GPU, so that leases taken in order spread over the GPUs.
  for (int i = 0; i < sessions_per_device; ++i) {
    for (const int device : devices) {
      try {
        sessions_.push_back(std::make_unique<NvdecSession>(device));
      } catch (const std::exception& e) {
        throw std::runtime_error(fmt::format("NVDEC session {} of {} on cuda:{}: {}", i + 1,
                                             sessions_per_device, device, e.what()));
      }
    }
  }
  // Taken from the back: reversed, the first lease gets the first session.
  for (auto it = sessions_.rbegin(); it != sessions_.rend(); ++it) free_.push_back(it->get());
}

NvdecPool::~NvdecPool() = default;

NvdecSession* NvdecPool::take_locked() {
  NvdecSession* session = free_.back();
  free_.pop_back();
  return session;
}

NvdecPool::Lease NvdecPool::try_acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return {};
  return Lease(this, take_locked());
}

NvdecPool::Lease NvdecPool::acquire() {
  std::unique_lock lock(mutex_);
  freed_.wait(lock, [&] { return !free_.empty(); });
  return Lease(this, take_locked());
}

void NvdecPool::release(NvdecSession* session) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(session);
  }
  freed_.notify_one();
}

std::string NvdecPool::describe() const {
  std::string gpus;
  for (const int device : devices_) gpus += fmt::format("{}cuda:{}", gpus.empty() ? "" : ", ", device);
  return fmt::format("{} NVDEC session(s) on {}", sessions_.size(), gpus);
}

NvdecPool::Lease::Lease(Lease&& other) noexcept
    : pool_(std::exchange(other.pool_, nullptr)), session_(std::exchange(other.session_, nullptr)) {}

NvdecPool::Lease& NvdecPool::Lease::operator=(Lease&& other) noexcept {
  if (this != &other) {
    if (session_ != nullptr) pool_->release(session_);
    pool_ = std::exchange(other.pool_, nullptr);
    session_ = std::exchange(other.session_, nullptr);
  }
  return *this;
}

NvdecPool::Lease::~Lease() {
  if (session_ != nullptr) pool_->release(session_);
}

}  // namespace precompute
