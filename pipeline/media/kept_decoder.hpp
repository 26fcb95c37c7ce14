#pragma once
// An FFmpeg decoder that an NVDEC session keeps open from one file to the next (Note [Keeping
// NVDEC decoders across files] in kept_decoder.cpp), so that the NVDEC decoder and its picture
// pool are made once per session instead of once per file.
//
// Thread-safety: none; it belongs to its session, which one thread holds at a time.

#include <cstdint>
#include <filesystem>

#include "pipeline/media/ffmpeg_common.hpp"

namespace precompute {

class KeptDecoder {
 public:
  // Decoders it makes use FFmpeg's CUDA device `hw_device` (not owned; it must outlive this).
  explicit KeptDecoder(AVBufferRef* hw_device) : hw_device_(hw_device) {}
  KeptDecoder(const KeptDecoder&) = delete;
  KeptDecoder& operator=(const KeptDecoder&) = delete;

  // Whether files of `stream` can go through a kept decoder: H.264 and HEVC, whose parameter
  // sets can travel in the packets (Annex B).
  static bool takes(const AVStream* stream);

  // One file's use of the decoder. Until finish() is called the use counts as failed, and a
  // failed use closes the decoder: the next file starts from a fresh one.
  class FileUse {
   public:
    FileUse(FileUse&& other) noexcept;
    FileUse& operator=(FileUse&&) = delete;
    ~FileUse();
    AVCodecContext* codec() const { return owner_->codec_.get(); }
    // The packets' way to the decoder (ffmpeg::decode_stream's `filter`).
    AVBSFContext* filter() const { return filter_.get(); }
    // The file was decoded to its end or to its last target; the decoder stays open.
    // `drained`: it was put in draining mode (ffmpeg::decode_stream's `drained`), so the next
    // file must flush it.
    void finish(bool drained) {
      finished_ = true;
      owner_->drained_ = drained;
    }
    // The previous file's pictures were not flushed out (Note [Files in a row without a flush]
    // in kept_decoder.cpp), and the file's first packet is still to come: the caller tells
    // first_packet() whether it holds an IDR slice (ffmpeg::h264_packet_has_idr)
    // before it goes in, and the decoder is flushed if not.
    bool flush_unless_idr() const { return flush_unless_idr_; }
    void first_packet(bool idr);
    // Whether `frame` is one of this file's pictures, not one the previous file left in the
    // decoder's reorder buffer.
    bool owns(const AVFrame& frame) const;

   private:
    friend class KeptDecoder;
    FileUse(KeptDecoder* owner, ffmpeg::BsfContextPtr filter, bool flush_unless_idr)
        : owner_(owner), filter_(std::move(filter)), flush_unless_idr_(flush_unless_idr) {}
    KeptDecoder* owner_;
    ffmpeg::BsfContextPtr filter_;
    bool flush_unless_idr_ = false;
    bool finished_ = false;
  };

  // Sets the decoder up for `stream` of `file` (takes(stream) must hold): the open one, emptied
  // of the previous file's pictures and given this file's parameter sets, or a new one when
  // there is none or it was opened with another codec or pixel cap. Throws MediaError as
  // ffmpeg::open_decoder does.
  FileUse begin(const AVStream* stream, int64_t max_pixels, const std::filesystem::path& file);

  // Files that found the decoder open, for the tests and the debug log.
  int64_t reuses() const { return reuses_; }
  // Of those, the files that began without a flush (Note [Files in a row without a flush]).
  int64_t unflushed() const { return unflushed_; }

 private:
  AVBufferRef* hw_device_;
  ffmpeg::CodecContextPtr codec_;
  AVCodecID codec_id_ = AV_CODEC_ID_NONE;
  int64_t max_pixels_ = 0;
  bool in_use_ = false;
  bool drained_ = false;      // the last file put the decoder in draining mode
  int64_t generation_ = 0;    // this file's tag on its pictures (AVCodecContext::reordered_opaque)
  int64_t reuses_ = 0;
  int64_t unflushed_ = 0;
};

}  // namespace precompute
