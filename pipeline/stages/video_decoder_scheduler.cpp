#include "pipeline/stages/video_decoder_scheduler.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/low_priority_threads.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/media/cpu_decoder_backend.hpp"
#include "pipeline/media/nvdec.hpp"
#include "pipeline/media/nvdec_decoder_backend.hpp"
#include "pipeline/run_stats.hpp"

namespace precompute {

namespace {

// Note [CPU decoders at a lower priority].
constexpr int kCpuDecodeNiceIncrement = 10;

// The CUDA ordinals among video's devices, each once.
std::vector<int> cuda_devices(const std::vector<std::string>& devices) {
  std::vector<int> ordinals;
  for (const auto& d : devices) {
    if (const auto ordinal = cuda_ordinal(d)) ordinals.push_back(*ordinal);
  }
  std::sort(ordinals.begin(), ordinals.end());
  ordinals.erase(std::unique(ordinals.begin(), ordinals.end()), ordinals.end());
  return ordinals;
}

}  // namespace

// Note [Choosing the video decoder]
// video.decoder: auto opens NVDEC sessions on the GPUs video runs on, when the build has CUDA
// and video has a GPU; the decode threads then take a free session for each file and decode on
// the CPU when none is free, so both kinds stay busy. A thread on NVDEC mostly waits for the
// GPU, so auto adds a decode thread per session to the one per core (unless
// run.decode_threads says otherwise): the cores keep decoding at full strength beside the
// engines. When files stop coming, auto hands a CPU file over to a session gone idle if that is
// faster (Note [Handing a file over to NVDEC] in nvdec_handover.cpp). Without a build or GPU
// for it, auto is the CPU, said once at start-up. nvdec waits for a session for every file, and
// refuses to start without them. Either way a file NVDEC fails on (a stream it cannot take, a
// decode error) is decoded again on the CPU and counted.
VideoDecoderScheduler::VideoDecoderScheduler(const Config& config, VideoDecodeOptions options,
                                             RunStats& stats)
    : options_(std::move(options)), stats_(&stats) {
  const VideoDecoderKind wanted = config.video.decoder;
  if (wanted == VideoDecoderKind::kCpu) return;
  const std::vector<int> gpus = cuda_devices(config.devices_for(Modality::kVideo));
  std::string why_not;
  if (!nvdec_built()) {
    why_not = "this build of precompute has no CUDA";
  } else if (gpus.empty()) {
    why_not = "video runs on no CUDA device (video.device or run.device)";
  } else {
    try {
      nvdec_ = std::make_unique<NvdecPool>(
          gpus, config.video.nvdec_sessions,
          config.video.nvdec_own_context ? NvdecContext::kOwn : NvdecContext::kPrimary);
      cpu_decode_threads_ = std::make_unique<LowPriorityThreads>(kCpuDecodeNiceIncrement);
      kind_ = wanted;
      spdlog::info("video decoding: {}{}", nvdec_->describe(),
                   wanted == VideoDecoderKind::kAuto ? " and the CPU decoders" : "");
      return;
    } catch (const std::exception& e) {
      why_not = e.what();
    }
  }
  PC_CHECK(wanted != VideoDecoderKind::kNvdec, ConfigError, "video.decoder: nvdec, but ", why_not,
           "; use video.decoder: auto (NVDEC where it can) or cpu");
  spdlog::info("video decoding: on the CPU ({})", why_not);
}

VideoDecoderScheduler::~VideoDecoderScheduler() = default;

// Note [CPU decoders at a lower priority]
// With NVDEC sessions open, CPU decodes run on threads of their own at a nice value 10 above
// the process's (LowPriorityThreads), the thread that took the file waiting for them. A file on
// NVDEC costs the cores little, but its thread must run the moment the engine hands back a
// picture or the engine waits for its next one; at the same priority, the busy CPU decoders
// delay it. At nice 10 the sessions get their threads back while the CPU decoders keep their
// pace; nice 19 gives NVDEC no more and takes from the CPU (docs/benchmarks.md, "CPU decoders
// at a lower priority"). Linux cannot raise a thread's priority back without privilege, hence
// threads kept for this rather than the graph's own threads lowered and raised per file.
VideoFrames VideoDecoderScheduler::decode_on_cpu_threads(const MediaSource& file,
                                                         const VideoDecodeOptions& options) const {
  const StageTimer on_cpu(stats_->video_cpu_decode_ns);
  return cpu_decode_threads_->run([&] {
    CpuDecoderBackend cpu;
    return decode_video(file, options, cpu);
  });
}

VideoFrames VideoDecoderScheduler::decode(const MediaSource& file) const {
  if (!nvdec_) {
    const StageTimer on_cpu(stats_->video_cpu_decode_ns);
    CpuDecoderBackend cpu;
    return decode_video(file, options_, cpu);
  }
  NvdecPool::Lease lease =
      kind_ == VideoDecoderKind::kNvdec ? nvdec_->acquire() : nvdec_->try_acquire();
  double seconds_left = options_.timeout_s;  // of the file's time limit
  if (!lease) {
    // auto, every session busy: the CPU, until a session goes idle and is worth it (Note
    // [Handing a file over to NVDEC] in nvdec_handover.cpp).
    VideoDecodeOptions options = options_;
    const auto started = std::chrono::steady_clock::now();
    options.give_up = [&](double done, double duration_s) {
      if (!nvdec_->any_free()) return false;
      const auto nvdec_s = nvdec_pace_.expected_seconds(duration_s);
      if (!nvdec_s) return false;
      if (!worth_handing_over(seconds_since(started), done, *nvdec_s)) return false;
      lease = nvdec_->try_acquire_idle(kNvdecIdleBeforeHandover);
      return static_cast<bool>(lease);
    };
    try {
      return decode_on_cpu_threads(file, options);
    } catch (const DecodeGivenUp& given_up) {
      seconds_left = given_up.seconds_left();
      stats_->video_nvdec_handovers.fetch_add(1, std::memory_order_relaxed);
      stats_->video_decoded_frames.fetch_add(given_up.decoded_frames(), std::memory_order_relaxed);
      spdlog::debug("{}: handed over to a free NVDEC session after {} frame(s) on the CPU",
                    file.name(), given_up.decoded_frames());
    }
  }
  VideoDecodeOptions options = options_;
  options.timeout_s = std::max(1e-3, seconds_left);  // a file handed over keeps what is left
  try {
    const StageTimer on_nvdec(stats_->video_nvdec_ns);
    const auto started = std::chrono::steady_clock::now();
    NvdecDecoderBackend on_session(lease.session(), nullptr);
    VideoFrames frames = decode_video(file, options, on_session);
    // Frames, but none from NVDEC: FFmpeg could not set the engine up for this stream and the
    // same call decoded it on the CPU.
    if (!frames.nvdec) {
      stats_->video_nvdec_fallbacks.fetch_add(1, std::memory_order_relaxed);
    } else {
      nvdec_pace_.add(seconds_since(started), frames.duration_s);
    }
    return frames;
  } catch (const MediaError& e) {
    // Limits (too long, too large, timeout) hold on every decoder; the rest may be NVDEC's.
    if (e.category() != FailureCategory::kDecodeError &&
        e.category() != FailureCategory::kUnsupported) {
      throw;
    }
    spdlog::debug("{}: NVDEC failed ({}); decoding on the CPU", file.name(), e.what());
  }
  lease = {};  // free for another file while this one decodes on the CPU
  stats_->video_nvdec_fallbacks.fetch_add(1, std::memory_order_relaxed);
  VideoDecodeOptions on_cpu = options_;
  on_cpu.timeout_s = options.timeout_s;
  return decode_on_cpu_threads(file, on_cpu);
}

int VideoDecoderScheduler::nvdec_sessions() const { return nvdec_ ? nvdec_->size() : 0; }

int VideoDecoderScheduler::decode_threads_beside_the_cpu() const {
  return kind_ == VideoDecoderKind::kAuto ? nvdec_sessions() : 0;
}

std::string VideoDecoderScheduler::describe() const {
  if (!nvdec_) return {};
  return kind_ == VideoDecoderKind::kAuto ? nvdec_->describe() + " and CPU" : nvdec_->describe();
}

}  // namespace precompute
