#pragma once
// NVDEC sessions: the GPU's video decode engines, driven through FFmpeg's CUDA hwaccel (Note
// [NVDEC through FFmpeg] in nvdec.cpp). A session is what one decoding thread needs to decode a
// file on a GPU: FFmpeg's CUDA device (in a CUDA context the GPU's sessions share, made once,
// not per session or per file), a CUDA stream, and the buffers that carry a converted frame
// back. A pool holds a fixed number of sessions per GPU, made at start-up and reused for every
// file; a thread leases one for one file.
//
// Builds without CUDA have the pool type but cannot open one (nvdec_built() is false).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

struct AVBufferRef;

namespace precompute {

struct GpuRgbParams;
class KeptDecoder;

// Whether this build can decode on NVDEC (a CUDA build).
bool nvdec_built();

// The NVDEC engines of GPU `device` (a CUDA ordinal), as its driver reports them for 8-bit 4:2:0
// H.264 (Note [Two sessions per engine] in nvdec.cpp); nullopt, with the reason in `why_not`, when
// it cannot be asked (a driver too old to say, no libnvcuvid, a build without CUDA or without
// the Video Codec SDK's headers).
std::optional<int> nvdec_engine_count(int device, std::string* why_not);

// Which CUDA context a GPU's sessions decode in (Note [One CUDA context for a GPU's sessions]
// in nvdec.cpp): one made for the sessions alone, or the device's primary one, which LibTorch's
// encoders compute in (video.nvdec_own_context: false).
enum class NvdecContext { kPrimary, kOwn };

// FFmpeg's CUDA device on GPU `device` (a CUDA ordinal) around the context `kind` names: what
// sessions share. The caller owns the reference (av_buffer_unref); the primary context is
// retained until the device goes. Throws std::runtime_error with FFmpeg's or CUDA's reason.
AVBufferRef* open_nvdec_context(int device, NvdecContext kind);

class NvdecSession {
 public:
  // A session on GPU `device` with a stream of its own, in `shared_context` (from
  // open_nvdec_context; the session holds a reference, so the context lives as long as its
  // last session), or in a context made for it alone when that is null. `keep_decoders`: H.264 and
  // HEVC files share one decoder kept open (Note [Keeping NVDEC decoders across files] in
  // kept_decoder.cpp); false makes a decoder per file, for measuring. Throws std::runtime_error
  // with FFmpeg's or CUDA's reason.
  explicit NvdecSession(int device, bool keep_decoders = true,
                        AVBufferRef* shared_context = nullptr);
  ~NvdecSession();
  NvdecSession(const NvdecSession&) = delete;
  NvdecSession& operator=(const NvdecSession&) = delete;

  int device() const { return device_; }
  // FFmpeg's device context, for AVCodecContext::hw_device_ctx (the codec takes its own ref).
  AVBufferRef* hw_device() const { return hw_device_; }
  // The CUcontext the session decodes in (its GPU's sessions share it) and its cudaStream_t.
  const void* cuda_context() const { return cuda_.context; }
  const void* cuda_stream() const { return cuda_.stream; }
  // The decoder kept across files, or null when the session makes one per file.
  KeptDecoder* kept_decoder() const { return kept_.get(); }

  // Converts one picture in device memory (Note [Converting NVDEC pictures on the GPU]) on the
  // session's stream, which is the one NVDEC maps pictures on, and copies the out_width x
  // out_height RGB24 result to `out` in host memory. Throws std::runtime_error on a CUDA error.
  void to_rgb(const GpuRgbParams& params, uint8_t* out);

 private:
  void release() noexcept;  // everything the session made, in order; the destructor's work

  int device_;
  AVBufferRef* hw_device_ = nullptr;
  AVBufferRef* shared_context_ = nullptr;  // a reference to the context's owner, or null
  std::unique_ptr<KeptDecoder> kept_;
  // The CUDA objects (none in builds without CUDA).
  struct Cuda {
    void* context = nullptr;  // CUcontext (Note [One CUDA context for a GPU's sessions])
    void* stream = nullptr;   // cudaStream_t
    void* done = nullptr;  // cudaEvent_t, waited for without spinning
    uint8_t* device_rgb = nullptr;
    uint8_t* host_rgb = nullptr;  // pinned
    size_t rgb_capacity = 0;
  } cuda_;
};

class NvdecPool {
 public:
  // `sessions_per_device` sessions on each GPU of `devices` (CUDA ordinals); 0: two per NVDEC
  // engine of each GPU (nvdec_engine_count), 4 where that cannot be had; each GPU's in the
  // context `context` names. Throws std::runtime_error naming the GPU when a session cannot be
  // opened.
  NvdecPool(const std::vector<int>& devices, int sessions_per_device,
            NvdecContext context = NvdecContext::kOwn);
  ~NvdecPool();

  // A session for the length of one file; returns it to the pool when destroyed.
  class Lease {
   public:
    Lease() = default;
    Lease(Lease&& other) noexcept;
    Lease& operator=(Lease&& other) noexcept;
    ~Lease();
    explicit operator bool() const { return session_ != nullptr; }
    NvdecSession* session() const { return session_; }

   private:
    friend class NvdecPool;
    Lease(NvdecPool* pool, NvdecSession* session) : pool_(pool), session_(session) {}
    NvdecPool* pool_ = nullptr;
    NvdecSession* session_ = nullptr;
  };

  // A free session, or an empty lease when every session is busy (video.decoder: auto).
  Lease try_acquire();
  // Waits for a free session (video.decoder: nvdec).
  Lease acquire();
  // A session that has been free for at least `idle`, or an empty lease: a session nobody took
  // for that long means no file is waiting for one (Note [Handing a file over to NVDEC] in
  // pipeline/stages/nvdec_handover.cpp).
  Lease try_acquire_idle(std::chrono::steady_clock::duration idle);
  // Whether some session is free now, without taking the lock (it may be gone when asked).
  bool any_free() const { return free_count_.load(std::memory_order_relaxed) > 0; }

  int size() const { return static_cast<int>(sessions_.size()); }

  // From now on a pool ends without closing its sessions: the process leaves without tearing
  // down, and its exit takes them back (Note [Sessions left to the process's exit] in
  // nvdec.cpp). Only for a process that ends soon after its pools do.
  static void leave_sessions_to_process_exit();
  // "28 NVDEC session(s) on cuda:0, cuda:1 (two per engine)"
  std::string describe() const;

 private:
  void release(NvdecSession* session);
  NvdecSession* take_locked();
  // Every session, each on a thread of its own (Note [Opening and closing sessions side by
  // side] in nvdec.cpp).
  void close_all() noexcept;

  std::vector<std::unique_ptr<NvdecSession>> sessions_;
  std::vector<int> devices_;
  std::string sizing_;  // how the count was chosen, for describe()
  std::mutex mutex_;
  std::condition_variable freed_;
  struct FreeSession {
    NvdecSession* session;
    std::chrono::steady_clock::time_point since;
  };
  std::deque<FreeSession> free_;  // first in, first out (the front is the longest free); GPUs
                                  // interleaved
  std::atomic<int> free_count_{0};  // free_.size(), for any_free()
};

}  // namespace precompute
