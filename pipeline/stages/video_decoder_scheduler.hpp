#pragma once
// Which decoder backend each video file goes to (Note [Choosing the video decoder] in
// video_decoder_scheduler.cpp): the CPU, an NVDEC session, or the CPU first and a session
// later (Note [Handing a file over to NVDEC] in nvdec_handover.cpp). It owns the NVDEC
// sessions and the threads the CPU decodes on beside them. Thread-safe: the decode threads call
// decode() at once.

#include <filesystem>
#include <memory>
#include <string>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"
#include "pipeline/media/video_decoder.hpp"
#include "pipeline/stages/nvdec_handover.hpp"

namespace precompute {

class LowPriorityThreads;
class NvdecPool;
struct RunStats;

class VideoDecoderScheduler {
 public:
  // Opens the NVDEC sessions that config.video.decoder asks for and the build and video's
  // devices allow. Throws ConfigError when video.decoder is nvdec and they cannot be had.
  VideoDecoderScheduler(const Config& config, VideoDecodeOptions options, RunStats& stats);
  ~VideoDecoderScheduler();
  VideoDecoderScheduler(const VideoDecoderScheduler&) = delete;
  VideoDecoderScheduler& operator=(const VideoDecoderScheduler&) = delete;

  // Decodes `file` on the backend its turn gives it; counts into the run's stats.
  VideoFrames decode(const MediaSource& file) const;

  // The NVDEC sessions (every GPU's); 0 when only the CPU decodes.
  int nvdec_sessions() const;
  // Decode threads to add to one per core so that the CPU decoders stay as many while some
  // threads wait on NVDEC: the sessions, under video.decoder: auto; else 0.
  int decode_threads_beside_the_cpu() const;
  // The NVDEC sessions and whether CPU decoders join them; empty when only the CPU decodes.
  std::string describe() const;

 private:
  VideoFrames decode_on_cpu_threads(const MediaSource& file,
                                    const VideoDecodeOptions& options) const;

  VideoDecodeOptions options_;
  RunStats* stats_;
  VideoDecoderKind kind_ = VideoDecoderKind::kCpu;  // kCpu when no NVDEC pool could be had
  std::unique_ptr<NvdecPool> nvdec_;
  // NVDEC's seconds per file, for handing CPU files over; thread-safe.
  mutable NvdecPace nvdec_pace_;
  // Where CPU decodes run while NVDEC sessions decode beside them (Note [CPU decoders at a lower
  // priority] in video_decoder_scheduler.cpp); null without sessions.
  std::unique_ptr<LowPriorityThreads> cpu_decode_threads_;
};

}  // namespace precompute
