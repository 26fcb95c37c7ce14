#include "pipeline/media/nvdec_decoder_backend.hpp"

#include <fmt/format.h>

#include "pipeline/media/nvdec.hpp"
#include "pipeline/media/video_decoder.hpp"

namespace precompute {
namespace {

// Note [NVDEC drops frames only at sparse sampling]
// Dropping the non-reference frames nobody keeps (Note [Skipping frames nobody keeps] in
// video_decoder.cpp) saves the CPU decoder their work at any sampling. On NVDEC it saves engine
// time only where most frames can go: with targets 30 and 75 frames apart (1 frame a second, 4
// a clip, on 30-fps clips) the sessions alone ran 1.43x and 1.57x faster dropping than decoding
// every frame, but with targets 7.5 frames apart (4 a second) 2.46x slower, the engines idle 80%
// of the time where decoding every frame keeps them busy (docs/benchmarks.md, "Dense sampling
// on NVDEC"). What slows it lies inside FFmpeg's hwaccel and the driver, where frames are
// mapped; it is measured, not explained. So a session drops frames only for files whose
// targets lie at least this many frames apart on average: between the measured 7.5 (keep
// every frame) and 30 (drop), nearer the first, as the loss there is the larger.
constexpr double kNvdecDropsFramesFromGap = 15.0;

}  // namespace

NvdecDecoderBackend::NvdecDecoderBackend(NvdecSession* session, KeptDecoder* kept)
    : session_(session),
      kept_(kept != nullptr ? kept : session != nullptr ? session->kept_decoder() : nullptr) {}

DecoderCapabilities NvdecDecoderBackend::capabilities() const {
  DecoderCapabilities caps;
  caps.name = session_ != nullptr ? "NVDEC" : "CPU";
  caps.gpu_frames = session_ != nullptr;
  // A file on a session stays there: handing over goes from the CPU to NVDEC.
  caps.may_give_up = session_ == nullptr;
  caps.keeps_decoder = kept_ != nullptr;
  caps.drops_frames_from_gap = session_ != nullptr ? kNvdecDropsFramesFromGap : 0.0;
  return caps;
}

void NvdecDecoderBackend::open(const AVStream* stream, const VideoDecodeOptions& options,
                               const std::filesystem::path& file) {
  kept_use_.reset();
  own_codec_.reset();
  codec_ = nullptr;
  parameters_ = stream->codecpar;
  flush_on_seek_ = options.flush_on_seek;
  used_kept_ = kept_ != nullptr && KeptDecoder::takes(stream);
  if (used_kept_) {
    kept_use_.emplace(kept_->begin(stream, options.max_pixels, file));
    codec_ = kept_use_->codec();
  } else {
    // The pixel cap as on the CPU (CpuDecoderBackend::open).
    own_codec_ = ffmpeg::open_decoder(stream, options.threads, options.max_pixels, file,
                                      session_ != nullptr ? session_->hw_device() : nullptr);
    codec_ = own_codec_.get();
  }
}

AVBSFContext* NvdecDecoderBackend::packet_filter() const {
  return kept_use_ ? kept_use_->filter() : nullptr;
}

bool NvdecDecoderBackend::seek() {
  // Note [Seeking without a flush] in video_decoder.cpp: H.264 on the engine never flushes at a
  // seek unless the packet landed on asks for it. A stream the engine could not take has no
  // hardware frames context and is flushed as on the CPU.
  const bool h264_on_nvdec =
      codec_->codec_id == AV_CODEC_ID_H264 && codec_->hw_frames_ctx != nullptr;
  if (!flush_on_seek_ || h264_on_nvdec) return false;
  avcodec_flush_buffers(codec_);
  return true;
}

void NvdecDecoderBackend::before_packet(const AVPacket& packet) {
  // Note [Files in a row without a flush] in kept_decoder.cpp: the file's first packet decides.
  if (kept_use_ && kept_use_->flush_unless_idr()) {
    kept_use_->first_packet(ffmpeg::h264_packet_has_idr(packet, *parameters_));
  }
}

bool NvdecDecoderBackend::owns(const AVFrame& frame) const {
  // The previous file's last pictures, out of a kept decoder that was not flushed, are not.
  return !kept_use_ || kept_use_->owns(frame);
}

void NvdecDecoderBackend::to_rgb(const GpuRgbParams& params, uint8_t* out) {
  if (session_ == nullptr) VideoDecoderBackend::to_rgb(params, out);
  session_->to_rgb(params, out);
}

void NvdecDecoderBackend::close(bool drained) {
  // The kept decoder is left in a known state for the next file.
  if (kept_use_) kept_use_->finish(drained);
  kept_use_.reset();
}

std::string NvdecDecoderBackend::describe_use() const {
  return used_kept_ ? fmt::format(", decoder kept (reused {} times)", kept_->reuses())
                    : std::string();
}

}  // namespace precompute
