#include "pipeline/media/nvdec.hpp"

extern "C" {
#include <libavutil/hwcontext.h>
}

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <future>
#include <optional>
#include <string>
#include <thread>
#include <vector>
#include <stdexcept>
#include <utility>

#include "pipeline/core/seconds_since.hpp"
#include "pipeline/media/ffmpeg_common.hpp"
#include "pipeline/media/gpu_rgb_kernel.hpp"
#include "pipeline/media/kept_decoder.hpp"

#if PRECOMPUTE_WITH_NVDEC
extern "C" {
#include <libavutil/hwcontext_cuda.h>
}
#include <cuda.h>
#include <cuda_runtime.h>
#if PRECOMPUTE_WITH_NVDEC_CAPS
#include <dlfcn.h>
// After cuda.h, whose types it uses (it then leaves out its own copies of them).
#include <ffnvcodec/dynlink_cuviddec.h>
#endif
#endif

// Note [NVDEC through FFmpeg]
// NVDEC is reached through FFmpeg's CUDA hwaccel rather than through the nvcuvid API directly:
// the demuxing, the bitstream parsing, the seeks and the frame dropping that decide which frames
// are decoded (Notes [Seeking to what is sampled] and [Skipping frames nobody keeps] in
// video_decoder.cpp) are then the same code for both decoders, and so are the frames' timestamps;
// only where a picture is decoded and converted differs. FFmpeg checks the decoder's
// capabilities (codec, profile, bit depth, chroma format, size) when it sets the hwaccel up, and
// when they fall short it offers the software formats again, which is how a file NVDEC cannot
// take falls back to the CPU (video_decoder.cpp). What a session keeps across files is its
// GPU's CUDA context (Note [One CUDA context for a GPU's sessions]), its stream, the buffers and,
// for H.264 and HEVC, the FFmpeg decoder with its NVDEC decoder (Note [Keeping NVDEC decoders
// across files] in kept_decoder.cpp). docs/benchmarks.md measures what this path reaches against
// NVIDIA's own PyNvVideoCodec.

namespace precompute {

#if PRECOMPUTE_WITH_NVDEC

namespace {

void check_cuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) {
    throw std::runtime_error(fmt::format("CUDA error in {}: {}", what, cudaGetErrorString(error)));
  }
}

// The driver calls that make a session's context current (Note [One CUDA context for a GPU's
// sessions]), found through the runtime so that the binary does not link libcuda, which
// machines without a GPU lack.
struct DriverCalls {
  CUresult (*push)(CUcontext) = nullptr;
  CUresult (*pop)(CUcontext*) = nullptr;
  CUresult (*device_get)(CUdevice*, int) = nullptr;
  CUresult (*retain_primary)(CUcontext*, CUdevice) = nullptr;
  CUresult (*release_primary)(CUdevice) = nullptr;
};

const DriverCalls& driver_calls() {
  static const DriverCalls calls = [] {
    DriverCalls c;
    const auto find = [](const char* name) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      check_cuda(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &found),
                 name);
      if (fn == nullptr || found != cudaDriverEntryPointSuccess) {
        throw std::runtime_error(fmt::format("the CUDA driver has no {}", name));
      }
      return fn;
    };
    c.push = reinterpret_cast<CUresult (*)(CUcontext)>(find("cuCtxPushCurrent"));
    c.pop = reinterpret_cast<CUresult (*)(CUcontext*)>(find("cuCtxPopCurrent"));
    c.device_get = reinterpret_cast<CUresult (*)(CUdevice*, int)>(find("cuDeviceGet"));
    c.retain_primary =
        reinterpret_cast<CUresult (*)(CUcontext*, CUdevice)>(find("cuDevicePrimaryCtxRetain"));
    c.release_primary = reinterpret_cast<CUresult (*)(CUdevice)>(find("cuDevicePrimaryCtxRelease"));
    return c;
  }();
  return calls;
}

// Makes a session's context current on this thread for the scope: the CUDA runtime's calls
// then act in it.
class ContextScope {
 public:
  explicit ContextScope(CUcontext context) {
    if (driver_calls().push(context) != CUDA_SUCCESS) {
      throw std::runtime_error("cannot make the NVDEC session's CUDA context current");
    }
  }
  ~ContextScope() {
    CUcontext popped = nullptr;
    driver_calls().pop(&popped);
  }
  ContextScope(const ContextScope&) = delete;
  ContextScope& operator=(const ContextScope&) = delete;
};

}  // namespace

// Note [One CUDA context for a GPU's sessions]
// A GPU's sessions share one CUDA context. The driver makes contexts one at a time, so a
// context per session would make start-up and exit grow with the sessions, and with two
// sessions per engine eat what the extra sessions give (docs/benchmarks.md, "The engines' own
// bound"); one context opens in about the same time whatever the sessions. Each session has a
// stream of its own in it, and a device of FFmpeg's own around it (FFmpeg takes the stream from
// the device); the kernel, the streams and the buffers live in the shared context.
//
// Which context. By default one made by FFmpeg for the sessions, not the device's primary one
// that LibTorch computes in: a CUDA error that spoils a context (a fault in the conversion
// kernel, say) is then the sessions', whose files fall back to the CPU, and cannot leave the
// encoders' context unusable. The price: kernels of different contexts never run at the same
// time on a GPU, which switches between contexts by time slices, so every picture's map and
// conversion (thousands a second at dense sampling) waits for a slice beside a heavy
// encoder's work and cuts the encoder's slices short. With video.nvdec_own_context: false the
// sessions decode in the primary context instead, retained here and wrapped in FFmpeg's device
// (FFmpeg's own primary_ctx option refuses a primary context that LibTorch started with other
// flags): their maps and kernels are then streams beside the encoders', and the sessions'
// streams, made at the device's highest priority, go ahead of the encoders' (at the default
// one) as soon as an SM is free; but a fault while decoding then stops the encoders too
// (NVDEC's own errors on a broken stream are returned, not sticky, and fall back per file
// either way). The isolation stays the default until the gain is measured beside a heavy
// encoder (docs/benchmarks.md, "A heavy encoder at 4 frames a second"). Waits on a session's
// stream block on an event made to block (cudaEventBlockingSync) rather than spin, whatever
// flags the context was started with: LibTorch's may spin, and fourteen spinning session
// threads would take the cores the CPU decoders need.

bool nvdec_built() { return true; }

// Note [Two sessions per engine]
// A session decodes one file at a time, and between the pictures it hands the engines its
// thread parses the packets, maps each picture and converts it, so a GPU's engines are all busy
// only with more sessions than engines. The engine count differs by GPU (7 on an H100 or H200,
// 5 on an A100, 4 on an L4), and the driver reports it (CUVIDDECODECAPS::nNumNVDECs, asked for
// 8-bit 4:2:0 H.264), so video.nvdec_sessions: 0, the default, opens two per engine on each
// GPU: one per engine leaves the engines idle part of the time, two keep them busy, three add
// nothing (docs/benchmarks.md, "The engines' own bound"). A session costs only a stream and a
// kept NVDEC decoder in the GPU's one context (Note [One CUDA context for a GPU's sessions]).
// A driver that does not say (older than the Video Codec SDK 11.1 API, which added the field)
// gets 4. The question needs a CUDA context: the device's primary one, which LibTorch has
// usually started by then (Note [Started beside the input's read] in encoders/early_start.cpp),
// made current on a thread of its own so that the caller's current device is untouched.
std::optional<int> nvdec_engine_count(int device, std::string* why_not) {
#if PRECOMPUTE_WITH_NVDEC_CAPS
  std::string reason;
  auto asked = std::async(std::launch::async, [device, &reason]() -> std::optional<int> {
    void* library = dlopen("libnvcuvid.so.1", RTLD_NOW | RTLD_LOCAL);
    if (library == nullptr) {
      const char* error = dlerror();
      reason = fmt::format("cannot load libnvcuvid.so.1 ({})", error != nullptr ? error : "?");
      return std::nullopt;
    }
    std::optional<int> engines;
    auto* caps_of = reinterpret_cast<tcuvidGetDecoderCaps*>(dlsym(library, "cuvidGetDecoderCaps"));
    if (caps_of == nullptr) {
      reason = "the driver's libnvcuvid has no cuvidGetDecoderCaps";
    } else if (cudaSetDevice(device) != cudaSuccess || cudaFree(nullptr) != cudaSuccess) {
      reason = fmt::format("cannot start CUDA on cuda:{}", device);
      (void)cudaGetLastError();
    } else {
      CUVIDDECODECAPS caps = {};
      caps.eCodecType = cudaVideoCodec_H264;
      caps.eChromaFormat = cudaVideoChromaFormat_420;
      caps.nBitDepthMinus8 = 0;
      const CUresult asked_caps = caps_of(&caps);
      if (asked_caps != CUDA_SUCCESS) {
        reason = fmt::format("cuvidGetDecoderCaps failed (CUresult {})",
                             static_cast<int>(asked_caps));
      } else if (caps.bIsSupported == 0 || caps.nNumNVDECs == 0) {
        reason = "the driver reports no engine count";
      } else {
        engines = caps.nNumNVDECs;
      }
    }
    dlclose(library);
    return engines;
  });
  auto engines = asked.get();
  if (!engines && why_not != nullptr) *why_not = reason;
  return engines;
#else
  (void)device;
  if (why_not != nullptr) {
    *why_not = "this build has no Video Codec SDK headers (Debian: libffmpeg-nvenc-dev)";
  }
  return std::nullopt;
#endif
}

namespace {

AVCUDADeviceContext* cuda_device_of(AVBufferRef* device) {
  auto* device_context = reinterpret_cast<AVHWDeviceContext*>(device->data);
  return static_cast<AVCUDADeviceContext*>(device_context->hwctx);
}

// FFmpeg's CUDA device on GPU `device` around `context`, made elsewhere: FFmpeg leaves such a
// context alone when the device goes. With `primary_of`, `context` is that CUDA device's primary
// context, retained by the caller: the device holds that reference and releases it when it
// goes, or here when it cannot be made. Throws std::runtime_error with FFmpeg's reason.
AVBufferRef* wrap_cuda_context(int device, CUcontext context,
                               std::optional<CUdevice> primary_of = std::nullopt) {
  AVBufferRef* made = av_hwdevice_ctx_alloc(AV_HWDEVICE_TYPE_CUDA);
  if (made == nullptr) {
    if (primary_of) driver_calls().release_primary(*primary_of);
    throw std::bad_alloc();
  }
  if (primary_of) {
    auto* device_context = reinterpret_cast<AVHWDeviceContext*>(made->data);
    device_context->user_opaque = reinterpret_cast<void*>(static_cast<intptr_t>(*primary_of));
    device_context->free = [](AVHWDeviceContext* released) {
      driver_calls().release_primary(
          static_cast<CUdevice>(reinterpret_cast<intptr_t>(released->user_opaque)));
    };
  }
  cuda_device_of(made)->cuda_ctx = context;
  const int error = av_hwdevice_ctx_init(made);
  if (error < 0) {
    av_buffer_unref(&made);  // with primary_of, releases the primary context
    throw std::runtime_error(
        fmt::format("cannot set FFmpeg's CUDA device up on cuda:{}{} (av_hwdevice_ctx_init): {}",
                    device, primary_of ? "'s primary context" : "", ffmpeg::error_text(error)));
  }
  return made;
}

}  // namespace

AVBufferRef* open_nvdec_context(int device, NvdecContext kind) {
  if (kind == NvdecContext::kPrimary) {
    // Note [One CUDA context for a GPU's sessions]: the primary context, held for as long as
    // FFmpeg's device around it lives (its free callback lets it go).
    const DriverCalls& cu = driver_calls();
    CUdevice cuda_device = 0;
    CUcontext primary = nullptr;
    if (cu.device_get(&cuda_device, device) != CUDA_SUCCESS ||
        cu.retain_primary(&primary, cuda_device) != CUDA_SUCCESS) {
      throw std::runtime_error(
          fmt::format("cannot retain the primary CUDA context of cuda:{}", device));
    }
    return wrap_cuda_context(device, primary, cuda_device);
  }
  AVBufferRef* made = nullptr;
  const int error = av_hwdevice_ctx_create(&made, AV_HWDEVICE_TYPE_CUDA,
                                           std::to_string(device).c_str(), nullptr, 0);
  if (error < 0) {
    throw std::runtime_error(
        fmt::format("cannot open FFmpeg's CUDA device on cuda:{} (av_hwdevice_ctx_create): {}",
                    device, ffmpeg::error_text(error)));
  }
  return made;
}

NvdecSession::NvdecSession(int device, bool keep_decoders, AVBufferRef* shared_context)
    : device_(device) {
  try {
    if (shared_context == nullptr) {
      hw_device_ = open_nvdec_context(device, NvdecContext::kOwn);
    } else {
      // A device of FFmpeg's own around the shared context: FFmpeg reads the stream from the
      // device when it makes a decoder, so each session needs one, and a device FFmpeg did not
      // make the context for leaves the context alone when it goes (the shared ref owns it).
      // FFmpeg 5.1 then keeps no device ordinal of its own (0): it reads one only for its frame
      // pools' texture alignment, a property of the GPU architecture, so on a machine of one
      // GPU model the answer is the same for every GPU.
      shared_context_ = av_buffer_ref(shared_context);
      if (shared_context_ == nullptr) throw std::bad_alloc();
      hw_device_ = wrap_cuda_context(device, cuda_device_of(shared_context_)->cuda_ctx);
    }
    AVCUDADeviceContext* cuda = cuda_device_of(hw_device_);
    cuda_.context = cuda->cuda_ctx;
    ContextScope scope(static_cast<CUcontext>(cuda_.context));
    // The device's highest priority: ahead of the encoders' streams in the same context (Note
    // [One CUDA context for a GPU's sessions]).
    int lowest_priority = 0;
    int highest_priority = 0;
    check_cuda(cudaDeviceGetStreamPriorityRange(&lowest_priority, &highest_priority),
               "cudaDeviceGetStreamPriorityRange");
    cudaStream_t stream = nullptr;
    check_cuda(cudaStreamCreateWithPriority(&stream, cudaStreamNonBlocking, highest_priority),
               "cudaStreamCreateWithPriority");
    cuda_.stream = stream;
    cudaEvent_t done = nullptr;
    check_cuda(cudaEventCreateWithFlags(&done, cudaEventBlockingSync | cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
    cuda_.done = done;
    // NVDEC maps each picture on this stream (FFmpeg reads it when it makes a decoder, per
    // file), and the kernel runs on it after the map: ordered without any other synchronisation.
    cuda->stream = stream;
    if (keep_decoders) kept_ = std::make_unique<KeptDecoder>(hw_device_);
  } catch (...) {
    release();
    throw;
  }
}

NvdecSession::~NvdecSession() { release(); }

void NvdecSession::release() noexcept {
  kept_.reset();  // its NVDEC decoder lives in the session's context
  if (cuda_.context != nullptr) {
    try {
      ContextScope scope(static_cast<CUcontext>(cuda_.context));
      if (cuda_.device_rgb != nullptr) cudaFree(cuda_.device_rgb);
      if (cuda_.host_rgb != nullptr) cudaFreeHost(cuda_.host_rgb);
      if (cuda_.done != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(cuda_.done));
      if (cuda_.stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(cuda_.stream));
    } catch (const std::exception&) {
      // The context is going away with everything in it.
    }
    cuda_ = Cuda{};
  }
  // FFmpeg's device; it destroys the context only where it made it (no shared context).
  av_buffer_unref(&hw_device_);
  // The shared context goes with the last session that holds it.
  av_buffer_unref(&shared_context_);
}

void NvdecSession::to_rgb(const GpuRgbParams& params, uint8_t* out) {
  ContextScope scope(static_cast<CUcontext>(cuda_.context));
  const size_t bytes = size_t{3} * params.out_width * params.out_height;
  if (bytes > cuda_.rgb_capacity) {
    if (cuda_.device_rgb != nullptr) cudaFree(cuda_.device_rgb);
    if (cuda_.host_rgb != nullptr) cudaFreeHost(cuda_.host_rgb);
    cuda_.device_rgb = nullptr;
    cuda_.host_rgb = nullptr;
    cuda_.rgb_capacity = 0;
    check_cuda(cudaMalloc(&cuda_.device_rgb, bytes), "cudaMalloc");
    check_cuda(cudaMallocHost(&cuda_.host_rgb, bytes), "cudaMallocHost");
    cuda_.rgb_capacity = bytes;
  }
  auto stream = static_cast<cudaStream_t>(cuda_.stream);
  check_cuda(static_cast<cudaError_t>(launch_gpu_rgb(params, cuda_.device_rgb, stream)),
             "the RGB conversion kernel");
  check_cuda(
      cudaMemcpyAsync(cuda_.host_rgb, cuda_.device_rgb, bytes, cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync");
  auto done = static_cast<cudaEvent_t>(cuda_.done);
  check_cuda(cudaEventRecord(done, stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(done), "cudaEventSynchronize");
  std::memcpy(out, cuda_.host_rgb, bytes);
}

#else

bool nvdec_built() { return false; }

std::optional<int> nvdec_engine_count(int /*device*/, std::string* why_not) {
  if (why_not != nullptr) *why_not = "this build of precompute has no CUDA";
  return std::nullopt;
}

namespace {

[[noreturn]] void no_nvdec_in_this_build() {
  throw std::runtime_error(
      "this build of precompute has no CUDA, so no NVDEC: build it with the CUDA toolkit, or "
      "set video.decoder: cpu");
}

}  // namespace

AVBufferRef* open_nvdec_context(int /*device*/, NvdecContext /*kind*/) {
  no_nvdec_in_this_build();
}

NvdecSession::NvdecSession(int device, bool /*keep_decoders*/, AVBufferRef* /*shared_context*/)
    : device_(device) {
  no_nvdec_in_this_build();
}

NvdecSession::~NvdecSession() = default;  // kept_ is never made

void NvdecSession::release() noexcept {}

void NvdecSession::to_rgb(const GpuRgbParams&, uint8_t*) {
  throw std::logic_error("NvdecSession::to_rgb in a build without CUDA");
}

#endif

// Note [Opening and closing sessions side by side]
// A CUDA context, and at the end a session's kept NVDEC decoder, take a while to make and to
// destroy, mostly waiting on the driver: one after the other, a GPU's sessions add over a second
// to every run's start and end. So the pool opens each GPU's context on a thread of its own,
// then each session, and closes the sessions so too. The first error, in
// GPU order for the contexts and in session order for the sessions, is the one reported.
NvdecPool::NvdecPool(const std::vector<int>& devices, int sessions_per_device,
                     NvdecContext context)
    : devices_(devices) {
  // Each GPU's count: the one given, or two per engine (Note [Two sessions per engine]).
  constexpr int kWithoutEngineCount = 4;
  constexpr int kSessionsPerEngine = 2;
  std::vector<int> per_device(devices.size(), std::max(0, sessions_per_device));
  if (sessions_per_device == 0) {
    sizing_ = "two per engine";
    for (size_t d = 0; d < devices.size(); ++d) {
      std::string why_not;
      const auto engines = nvdec_engine_count(devices[d], &why_not);
      per_device[d] = engines ? kSessionsPerEngine * *engines : kWithoutEngineCount;
      if (!engines) {
        sizing_ = fmt::format("{} a GPU: the engine count could not be had", kWithoutEngineCount);
        spdlog::info("NVDEC on cuda:{}: {}; opening {} sessions", devices[d], why_not,
                     kWithoutEngineCount);
      }
    }
  }
  // Interleaved by GPU, so that leases taken in order spread over the GPUs: slot k's GPU and
  // its number among that GPU's sessions.
  std::vector<std::pair<size_t, int>> slots;
  for (int round = 0;; ++round) {
    const size_t before = slots.size();
    for (size_t d = 0; d < devices.size(); ++d) {
      if (round < per_device[d]) slots.emplace_back(d, round);
    }
    if (slots.size() == before) break;
  }
  // A context per GPU first (Note [One CUDA context for a GPU's sessions]), then the sessions
  // in them; each is opened on a thread of its own.
  std::vector<AVBufferRef*> contexts(devices.size(), nullptr);
  std::vector<std::string> context_errors(devices.size());
  {
    std::vector<std::thread> openers;
    openers.reserve(devices.size());
    for (size_t d = 0; d < devices.size(); ++d) {
      if (per_device[d] == 0) continue;
      openers.emplace_back([&, d] {
        try {
          contexts[d] = open_nvdec_context(devices[d], context);
        } catch (const std::exception& e) {
          context_errors[d] = fmt::format("NVDEC on cuda:{} ({} session(s)): {}", devices[d],
                                          per_device[d], e.what());
        }
      });
    }
    for (auto& opener : openers) opener.join();
  }
  const auto unref_contexts = [&] {
    for (AVBufferRef*& context : contexts) av_buffer_unref(&context);
  };
  for (const auto& error : context_errors) {
    if (!error.empty()) {
      unref_contexts();
      throw std::runtime_error(error);
    }
  }
  const size_t count = slots.size();
  sessions_.resize(count);
  std::vector<std::string> errors(count);
  {
    std::vector<std::thread> openers;
    openers.reserve(count);
    for (size_t k = 0; k < count; ++k) {
      openers.emplace_back([&, k] {
        const auto [d, number] = slots[k];
        const int device = devices[d];
        try {
          sessions_[k] = std::make_unique<NvdecSession>(device, true, contexts[d]);
        } catch (const std::exception& e) {
          errors[k] = fmt::format("NVDEC session {} of {} on cuda:{}: {}", number + 1,
                                  per_device[d], device, e.what());
        }
      });
    }
    for (auto& opener : openers) opener.join();
  }
  // The sessions hold the contexts now; each goes with its GPU's last session.
  unref_contexts();
  for (const auto& error : errors) {
    if (!error.empty()) {
      close_all();
      throw std::runtime_error(error);
    }
  }
  const auto now = std::chrono::steady_clock::now();
  for (const auto& session : sessions_) free_.push_back({session.get(), now});
  free_count_.store(static_cast<int>(free_.size()), std::memory_order_relaxed);
}

// Note [Sessions left to the process's exit]
// Closing a GPU's sessions takes the driver about half a second at the end of a run, side by
// side or not (14 sessions: docs/benchmarks.md, "The end of a run"): each kept decoder's
// surfaces are freed and its NVDEC decoder destroyed under the context's lock. The CLI's run
// ends its process right after, with _Exit (Note [Leaving without tearing down] in
// tools/cli/main.cpp), and the process's exit takes the device's context, and with it every
// session, back at once. So a run started by the CLI leaves its sessions open: nothing of theirs
// is unwritten (a session holds frames, never output), and the run's summary is written before.
// Everything else (tests, doctor, a process under a sanitizer, whose leak check runs at exit)
// closes them.
namespace {
std::atomic<bool> g_sessions_left_to_exit{false};
}  // namespace

void NvdecPool::leave_sessions_to_process_exit() {
  g_sessions_left_to_exit.store(true, std::memory_order_relaxed);
}

NvdecPool::~NvdecPool() {
  if (g_sessions_left_to_exit.load(std::memory_order_relaxed)) {
    const size_t open = sessions_.size();
    for (auto& session : sessions_) static_cast<void>(session.release());
    spdlog::debug("end: {} NVDEC session(s) left to the process's exit", open);
    return;
  }
  close_all();
}

void NvdecPool::close_all() noexcept {
  const auto started = std::chrono::steady_clock::now();
  const size_t open = sessions_.size();
  std::vector<std::thread> closers;
  for (auto& session : sessions_) {
    if (!session) continue;
    try {
      closers.emplace_back([owned = std::move(session)]() mutable { owned.reset(); });
    } catch (const std::exception&) {
      session.reset();  // no thread to be had: closed here
    }
  }
  for (auto& closer : closers) closer.join();
  sessions_.clear();
  spdlog::debug("end: {} NVDEC session(s) closed in {:.1f} ms", open,
                1000.0 * seconds_since(started));
}

NvdecSession* NvdecPool::take_locked() {
  // First in, first out: leases go round the sessions, and so round the GPUs (Note [Every
  // device gets batches] in pipeline/stages/encode_stage.cpp).
  NvdecSession* session = free_.front().session;
  free_.pop_front();
  free_count_.store(static_cast<int>(free_.size()), std::memory_order_relaxed);
  return session;
}

NvdecPool::Lease NvdecPool::try_acquire() {
  std::lock_guard lock(mutex_);
  if (free_.empty()) return {};
  return Lease(this, take_locked());
}

NvdecPool::Lease NvdecPool::try_acquire_idle(std::chrono::steady_clock::duration idle) {
  std::lock_guard lock(mutex_);
  if (free_.empty() || std::chrono::steady_clock::now() - free_.front().since < idle) return {};
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
    free_.push_back({session, std::chrono::steady_clock::now()});
    free_count_.store(static_cast<int>(free_.size()), std::memory_order_relaxed);
  }
  freed_.notify_one();
}

std::string NvdecPool::describe() const {
  std::string gpus;
  for (const int device : devices_) gpus += fmt::format("{}cuda:{}", gpus.empty() ? "" : ", ", device);
  return fmt::format("{} NVDEC session(s) on {}{}", sessions_.size(), gpus,
                     sizing_.empty() ? "" : " (" + sizing_ + ")");
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
