#pragma once
// What decodes a video file's packets into frames, seen from decode_video (video_decoder.hpp),
// which owns everything the backends share: the demuxing, the sample times, the seeks, the
// frames dropped and kept, and the conversion of software frames (Note [Sampling frames] in
// video_decoder.cpp). A backend owns the decoder: which one is opened for a file, whether it
// outlives the file, what is done to it at a seek, which of its frames belong to the file, and
// how a frame in device memory becomes RGB. So the frames kept are the same whatever decodes
// them, and a new decoder (another hardware path, a source of its own) is a new backend.
//
// A backend decodes one file at a time, on one thread; open() may follow close() for the next
// file (or for the same file decoded again). Its per-packet and per-frame calls allocate nothing.

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

struct AVBSFContext;
struct AVCodecContext;
struct AVFrame;
struct AVPacket;
struct AVStream;

namespace precompute {

struct GpuRgbParams;
struct VideoDecodeOptions;

struct DecoderCapabilities {
  std::string_view name;  // for the log: "CPU", "NVDEC"
  // Frames may come in device memory (AV_PIX_FMT_CUDA), converted by to_rgb.
  bool gpu_frames = false;
  // Honours VideoDecodeOptions::give_up: a file may leave it part-way for another backend (Note
  // [Handing a file over to NVDEC] in pipeline/stages/nvdec_handover.cpp).
  bool may_give_up = false;
  // The decoder stays open from file to file, so frames of the previous file may still come
  // out (owns() tells them apart).
  bool keeps_decoder = false;
  // Non-reference frames no target keeps are dropped before they are decoded (Note [Skipping
  // frames nobody keeps] in video_decoder.cpp), when seeking is on, for files whose targets lie
  // at least this many frames apart on average; 0: always. Where dropping costs more than it
  // saves at dense sampling (Note [NVDEC drops frames only at sparse sampling]).
  double drops_frames_from_gap = 0.0;
};

class VideoDecoderBackend {
 public:
  virtual ~VideoDecoderBackend() = default;

  virtual DecoderCapabilities capabilities() const = 0;

  // Makes a decoder ready for `stream` of `file`, with the limits of `options` (which must
  // outlive the file's decode). Throws MediaError as ffmpeg::open_decoder does.
  virtual void open(const AVStream* stream, const VideoDecodeOptions& options,
                    const std::filesystem::path& file) = 0;
  // The open decoder, and the packets' way to it (null: straight in; ffmpeg::decode_stream's
  // `filter`).
  virtual AVCodecContext* codec() const = 0;
  virtual AVBSFContext* packet_filter() const { return nullptr; }

  // The demuxer has just moved to a keyframe (Note [Seeking to what is sampled] in
  // video_decoder.cpp): flushes the decoder and returns true, or returns false to have it
  // flushed only when the next packet holds no IDR slice (Note [Seeking without a flush]).
  virtual bool seek() = 0;
  // Called with every packet before it goes to the decoder.
  virtual void before_packet(const AVPacket& /*packet*/) {}
  // Whether a frame out of the decoder is this file's, not one a kept decoder still held from
  // the previous file.
  virtual bool owns(const AVFrame& /*frame*/) const { return true; }
  // Converts a frame in device memory to out_width x out_height RGB24 in host memory at `out`
  // (Note [Converting NVDEC pictures on the GPU] in gpu_rgb_kernel.cu). Throws
  // std::runtime_error; only backends with gpu_frames are asked.
  virtual void to_rgb(const GpuRgbParams& /*params*/, uint8_t* /*out*/) {
    throw std::logic_error("a frame in device memory from a decoder without a GPU");
  }

  // The file was decoded to its end or to its last target (`drained`: the decoder was put in
  // draining mode, ffmpeg::decode_stream's `drained`). Without it, a decode that failed
  // part-way leaves a kept decoder to be closed rather than reused.
  virtual void close(bool drained) = 0;

  // What the debug log adds about this file's decoder; empty when nothing.
  virtual std::string describe_use() const { return {}; }
};

}  // namespace precompute
