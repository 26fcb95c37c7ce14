#pragma once
// Decoding on an NVDEC session (nvdec.hpp): FFmpeg's CUDA hwaccel, with H.264 and HEVC through
// the session's decoder kept open from file to file (Note [Keeping NVDEC decoders across files]
// in kept_decoder.cpp) and every other codec through a decoder of its own per file. A stream the
// engine cannot take is decoded by the same FFmpeg decoder on the CPU (Note [NVDEC through
// FFmpeg] in nvdec.cpp): its frames then come in host memory.

#include <optional>

#include "pipeline/media/decoder_backend.hpp"
#include "pipeline/media/ffmpeg_common.hpp"
#include "pipeline/media/kept_decoder.hpp"

namespace precompute {

class NvdecSession;

class NvdecDecoderBackend final : public VideoDecoderBackend {
 public:
  // On `session` (not owned), through `kept` (not owned) for the codecs it takes; `kept` null:
  // the session's own (NvdecSession::kept_decoder()), none when the session keeps none. A null
  // session with a kept decoder decodes on the CPU through it, which is how the CPU tests check
  // the kept decoder's frames.
  NvdecDecoderBackend(NvdecSession* session, KeptDecoder* kept);

  DecoderCapabilities capabilities() const override;
  void open(const AVStream* stream, const VideoDecodeOptions& options,
            const std::filesystem::path& file) override;
  AVCodecContext* codec() const override { return codec_; }
  AVBSFContext* packet_filter() const override;
  bool seek() override;
  void before_packet(const AVPacket& packet) override;
  bool owns(const AVFrame& frame) const override;
  void to_rgb(const GpuRgbParams& params, uint8_t* out) override;
  void close(bool drained) override;
  std::string describe_use() const override;

 private:
  NvdecSession* session_;
  KeptDecoder* kept_;
  const AVCodecParameters* parameters_ = nullptr;  // the open file's stream's
  bool flush_on_seek_ = true;
  std::optional<KeptDecoder::FileUse> kept_use_;  // while a file goes through kept_
  ffmpeg::CodecContextPtr own_codec_;             // else the file's own decoder
  AVCodecContext* codec_ = nullptr;               // one of the two
  bool used_kept_ = false;                        // the last file went through kept_
};

}  // namespace precompute
