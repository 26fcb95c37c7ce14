#pragma once
// Decoding on the CPU: FFmpeg's software decoder, one per file (VideoDecoderBackend in
// decoder_backend.hpp).

#include "pipeline/media/decoder_backend.hpp"
#include "pipeline/media/ffmpeg_common.hpp"

namespace precompute {

class CpuDecoderBackend final : public VideoDecoderBackend {
 public:
  DecoderCapabilities capabilities() const override;
  void open(const AVStream* stream, const VideoDecodeOptions& options,
            const std::filesystem::path& file) override;
  AVCodecContext* codec() const override { return codec_.get(); }
  bool seek() override;
  // The decoder stays open until the next open() or the end: frames the caller still holds
  // need nothing of it, but the caller may still flush it.
  void close(bool /*drained*/) override {}

 private:
  ffmpeg::CodecContextPtr codec_;
  bool flush_on_seek_ = true;
};

}  // namespace precompute
