#pragma once
// Decodes one video file into the frames an encoder sees: sampled by time, scaled and
// colour-converted by libswscale straight from the decoder's pixel format to the encoder's input
// size (Note [Sampling frames] in video_decoder.cpp), turned as the file says it is to be shown
// (Note [Display orientation] there), and stamped on the file's clock (Note [Sample clock]
// in ffmpeg_common.hpp). Stateless between calls; each call opens its own FFmpeg objects, so
// concurrent calls on different threads are safe.

#include <cstdint>
#include <exception>
#include <filesystem>
#include <functional>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

class VideoDecoderBackend;

// Defaults are the config's (default_video_section(), default_run_section()): declared once.
struct VideoDecodeOptions {
  double fps = default_video_section().fps;  // frames per second of video, or ...
  int num_frames = default_video_section().num_frames;  // ... this many frames spread evenly
                                                        // over the clip (exactly one is > 0)
  int height = default_video_section().height;  // output frame size
  int width = default_video_section().width;
  ResizeMode resize = default_video_section().resize;
  double max_duration_s = default_video_section().max_duration_s;  // longer: MediaError kTooLong
  int max_frames = default_video_section().max_frames;  // fps sampling yields at most this many
  int threads = default_video_section().decoder_threads;  // FFmpeg decoder threads; 0: FFmpeg's
  // coded width * height above this: MediaError kTooLarge
  int64_t max_pixels = default_video_section().max_pixels;
  // frames out of the decoder, at most: kTooLong
  int64_t max_decoded_frames = default_video_section().max_decoded_frames;
  double timeout_s = default_run_section().sample_timeout_s;  // the whole decode, at most: kTimeout
  int64_t max_file_bytes = default_run_section().max_file_bytes;  // larger files: kTooLarge
  bool autorotate = default_video_section().autorotate;  // frames in display orientation (the
                                                         // stream's display matrix)
  // Skip to keyframes near the targets and drop non-reference frames no target keeps (Notes
  // [Seeking to what is sampled] and [Skipping frames nobody keeps] in video_decoder.cpp);
  // false: every frame.
  bool seek = default_video_section().seek;
  // Flush the decoder at each seek (Note [Seeking without a flush] in video_decoder.cpp); H.264
  // on NVDEC never does, whatever this says. false is there so the CPU tests can check the
  // flushless seek frame by frame.
  bool flush_on_seek = true;
  // Whether non-reference frames no target keeps are dropped when seek is on (Note [Skipping
  // frames nobody keeps]): kAuto leaves it to the backend (DecoderCapabilities::
  // drops_frames_from_gap); the others are for measuring both ways (tools/bench/decode_bench.cpp
  // --drop-frames).
  enum class FrameDropping { kAuto, kOn, kOff };
  FrameDropping drop_frames = FrameDropping::kAuto;
  // On the CPU, asked as the file is read, with the share of its time read so far (0 to 1) and
  // its length in seconds; true gives the file up: decode_video throws DecodeGivenUp (for
  // handing it over to NVDEC, Note [Handing a file over to NVDEC] in
  // pipeline/stages/nvdec_handover.cpp). Empty: never asked.
  std::function<bool(double done, double duration_s)> give_up;
};

// What decode_video throws when VideoDecodeOptions::give_up said so: not a failure of the file.
class DecodeGivenUp : public std::exception {
 public:
  DecodeGivenUp(int64_t decoded_frames, double seconds_left)
      : decoded_frames_(decoded_frames), seconds_left_(seconds_left) {}
  const char* what() const noexcept override { return "the decode was given up"; }
  int64_t decoded_frames() const { return decoded_frames_; }  // before it was
  // Of the file's options.timeout_s (run.sample_timeout_s): what a decode started again may
  // take, so that the file's limit holds across both.
  double seconds_left() const { return seconds_left_; }

 private:
  int64_t decoded_frames_;
  double seconds_left_;
};

// The options of `section`, with the per-file limits of `run`.
VideoDecodeOptions video_decode_options(const VideoSection& section, const RunSection& run);

// Throws MediaError with the failure category (missing, unreadable, no_stream, decode_error,
// too_long, too_large, timeout, unsupported) and a message naming the file; DecodeGivenUp
// when options.give_up says so (and the backend may give up).
//
// Decodes on `backend` (decoder_backend.hpp: the CPU's, or an NVDEC session's), which it opens
// for the file and closes after.
VideoFrames decode_video(const MediaSource& source, const VideoDecodeOptions& options,
                         VideoDecoderBackend& backend);
// On the CPU (CpuDecoderBackend).
VideoFrames decode_video(const MediaSource& source, const VideoDecodeOptions& options);

}  // namespace precompute
