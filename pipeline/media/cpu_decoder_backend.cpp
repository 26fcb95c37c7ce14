#include "pipeline/media/cpu_decoder_backend.hpp"

#include "pipeline/media/video_decoder.hpp"

namespace precompute {

DecoderCapabilities CpuDecoderBackend::capabilities() const {
  DecoderCapabilities caps;
  caps.name = "CPU";
  caps.may_give_up = true;
  return caps;
}

void CpuDecoderBackend::open(const AVStream* stream, const VideoDecodeOptions& options,
                             const std::filesystem::path& file) {
  codec_.reset();  // the previous file's, before the next one is made
  // The decoder refuses to allocate pictures over its cap before we see them, a backstop for
  // streams whose frames grow past their header's size; decode_video checks the exact limit on
  // every frame.
  codec_ = ffmpeg::open_decoder(stream, options.threads, options.max_pixels, file, nullptr);
  flush_on_seek_ = options.flush_on_seek;
}

bool CpuDecoderBackend::seek() {
  // Without a flush only when asked (VideoDecodeOptions::flush_on_seek): the tests check the
  // flushless seek of Note [Seeking without a flush] on the CPU, where the decoder is the same.
  if (!flush_on_seek_) return false;
  avcodec_flush_buffers(codec_.get());
  return true;
}

}  // namespace precompute
