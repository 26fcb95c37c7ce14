#include "pipeline/media/kept_decoder.hpp"

#include <cstring>
#include <new>
#include <utility>

#include "pipeline/core/error.hpp"

// Note [Keeping NVDEC decoders across files]
// Closing an FFmpeg decoder that decodes on NVDEC destroys the NVDEC decoder and frees its
// picture pool, and both wait for the GPU, far longer than decoding a frame takes
// (docs/benchmarks.md, "NVDEC"): a session that opened a decoder per file would spend most of
// its time opening and closing. PyNvVideoCodec
// keeps one decoder and reconfigures it; here a session keeps its FFmpeg decoder open and feeds
// it file after file:
// - The decoder is opened without the stream's extradata, and every packet reaches it in Annex B
//   form through FFmpeg's mp4toannexb filter, made per file from that file's parameters. At the
//   start of each file the filter's Annex B parameter sets (SPS, PPS, and VPS for HEVC) are sent
//   as a packet of their own, so the pictures that follow are decoded with this file's sets even
//   when its first picture is not an IDR, before which the filter would insert them.
// - Between files the decoder is flushed, as after a seek (Note [Seeking to what is sampled] in
//   video_decoder.cpp): nothing of the previous file is output. For HEVC that is all a new file
//   costs. FFmpeg's H.264 decoder sets its hwaccel up anew after a flush (Note [Seeking without a
//   flush] there), so H.264 files in a row skip the flush where they can (Note [Files in a row
//   without a flush], below). Ending each file with end-of-sequence packets instead (each
//   returns one delayed frame, and no flush is needed) was tried and fails: the decoder then
//   drops the next file's first frames, whose picture order counts are below the last one it
//   output (KeptDecoder.FilesInARow... in tests/unit/video_decoder_test.cpp caught it).
// - A new file with other dimensions or another pixel format makes FFmpeg ask get_format again
//   and set NVDEC up anew, as a change inside one stream would; a file of another codec gets a
//   new decoder. What stays from file to file is what is not per picture: the NVDEC decoder,
//   its pool and FFmpeg's reorder depth, which only grows (it delays output, never changes
//   which frames come out).
// - The stream properties that frames take from the decoder where the bitstream is silent
//   (colour range, matrix, primaries, transfer, chroma siting, aspect ratio) are set from each
//   file's parameters, as a new decoder's would be.
// - A file that fails part-way closes the decoder: the next file never meets a decoder left in
//   an unknown state.
// H.264 and HEVC only, the codecs with such a filter; others get a decoder per file.

// Note [Files in a row without a flush]
// A flush makes FFmpeg's H.264 decoder remake the NVDEC decoder, which costs far more than a
// file's frames (docs/benchmarks.md, "NVDEC"). A file whose first picture packet holds an IDR
// slice needs no flush, for the reason a seek onto one needs none (Note [Seeking without a
// flush] in video_decoder.cpp): the IDR drops every reference picture and restarts
// the picture order count, and FFmpeg outputs every picture queued before an IDR ahead of it,
// so the previous file's pictures still in the reorder buffer come out first, in their order.
// They are told apart by a tag: each file sets the decoder's reordered_opaque, which FFmpeg
// copies into the pictures it starts while the file's packets go in (FileUse::owns), and the
// caller drops pictures of other files before counting them (VideoDecoderBackend::owns).
// Otherwise a flush:
// - when the previous file drained the decoder (read to its end: a draining decoder takes no
//   packets until flushed; a file that reached its last target earlier leaves it taking them),
// - when this file's first picture packet is no IDR (an open GOP's I-frame, a recovery point),
//   which the caller finds out as the packet goes in (FileUse::first_packet),
// - after a full-range file decoded on the CPU (full_range_format, below),
// - for HEVC, whose flush keeps the NVDEC decoder, and with FFmpeg 7 and later, where
//   reordered_opaque is gone.
// Parameter sets (SPS, PPS) survive a flush and the lack of one alike; SEI is read anew with
// every picture. The CPU tests decode the same files in a row both ways, bit for bit against a
// decoder of their own per file, and count the files that skipped the flush.

namespace precompute {

namespace {

const char* annex_b_filter_name(AVCodecID codec) {
  switch (codec) {
    case AV_CODEC_ID_H264:
      return "h264_mp4toannexb";
    case AV_CODEC_ID_HEVC:
      return "hevc_mp4toannexb";
    default:
      return nullptr;
  }
}

// The stream properties a decoder of its own would start with (avcodec_parameters_to_context's
// choice) where the bitstream may not say them: the decoder writes what the parameter sets say
// over these, and frames take the rest from here, so a kept decoder must not keep the previous
// file's (a full-range file made the next, untagged one full range: the tests caught it). The
// picture size and format are the decoder's own, set from the parameter sets.
void starts_like_a_new_decoder(AVCodecContext& codec, const AVCodecParameters& parameters) {
  codec.codec_tag = parameters.codec_tag;
  codec.bit_rate = parameters.bit_rate;
  codec.bits_per_coded_sample = parameters.bits_per_coded_sample;
  codec.bits_per_raw_sample = parameters.bits_per_raw_sample;
  codec.profile = parameters.profile;
  codec.level = parameters.level;
  codec.field_order = parameters.field_order;
  codec.color_range = parameters.color_range;
  codec.color_primaries = parameters.color_primaries;
  codec.color_trc = parameters.color_trc;
  codec.colorspace = parameters.color_space;
  codec.chroma_sample_location = parameters.chroma_location;
  codec.sample_aspect_ratio = parameters.sample_aspect_ratio;
}

// Note [Files in a row without a flush]: the tag each file puts on its pictures. FFmpeg 5 and 6
// carry AVCodecContext::reordered_opaque into the pictures they start; FFmpeg 7 dropped it
// (its packets' opaque fields would do, through the Annex B filter too, not written here).
#if LIBAVCODEC_VERSION_MAJOR < 61
constexpr bool kTagsPictures = true;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
void tag_pictures(AVCodecContext& codec, int64_t tag) { codec.reordered_opaque = tag; }
int64_t picture_tag(const AVFrame& frame) { return frame.reordered_opaque; }
#pragma GCC diagnostic pop
#else
constexpr bool kTagsPictures = false;
void tag_pictures(AVCodecContext&, int64_t) {}
int64_t picture_tag(const AVFrame&) { return 0; }
#endif

// FFmpeg's full-range ("J") formats, which its CPU H.264 decoder picks for a full-range stream
// and keeps, without a flush, for the next stream of the same size (it compares formats without
// the J): a limited-range file would come out as full range (the tests caught it). NVDEC's
// pictures are AV_PIX_FMT_CUDA, never one of these.
bool full_range_format(AVPixelFormat format) {
  return format == AV_PIX_FMT_YUVJ420P || format == AV_PIX_FMT_YUVJ422P ||
         format == AV_PIX_FMT_YUVJ444P || format == AV_PIX_FMT_YUVJ440P ||
         format == AV_PIX_FMT_YUVJ411P;
}

}  // namespace

bool KeptDecoder::FileUse::owns(const AVFrame& frame) const {
  return !kTagsPictures || picture_tag(frame) == owner_->generation_;
}

void KeptDecoder::FileUse::first_packet(bool idr) {
  PC_ASSERT(flush_unless_idr_, "a kept decoder's first packet decided twice");
  flush_unless_idr_ = false;
  if (idr) {
    ++owner_->unflushed_;
  } else {
    avcodec_flush_buffers(owner_->codec_.get());
  }
}

bool KeptDecoder::takes(const AVStream* stream) {
  const char* name = annex_b_filter_name(stream->codecpar->codec_id);
  return name != nullptr && av_bsf_get_by_name(name) != nullptr;
}

KeptDecoder::FileUse::FileUse(FileUse&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)),
      filter_(std::move(other.filter_)),
      flush_unless_idr_(other.flush_unless_idr_),
      finished_(other.finished_) {}

KeptDecoder::FileUse::~FileUse() {
  if (owner_ == nullptr) return;
  owner_->in_use_ = false;
  if (!finished_) owner_->codec_.reset();
}

KeptDecoder::FileUse KeptDecoder::begin(const AVStream* stream, int64_t max_pixels,
                                        const std::filesystem::path& file) {
  PC_ASSERT(!in_use_, "a kept decoder is used by one file at a time");
  PC_ASSERT(takes(stream), "a kept decoder for a codec without an Annex B filter");
  const AVCodecParameters& parameters = *stream->codecpar;
  const char* filter_name = annex_b_filter_name(parameters.codec_id);

  AVBSFContext* raw = nullptr;
  if (av_bsf_alloc(av_bsf_get_by_name(filter_name), &raw) < 0) throw std::bad_alloc();
  ffmpeg::BsfContextPtr filter(raw);
  int done = avcodec_parameters_copy(filter->par_in, &parameters);
  if (done >= 0) {
    filter->time_base_in = stream->time_base;
    done = av_bsf_init(filter.get());
  }
  PC_MEDIA_CHECK(done >= 0, FailureCategory::kDecodeError, file.string(),
                 ": cannot read the stream's parameter sets (", filter_name,
                 "): ", ffmpeg::error_text(done));

  if (codec_ && (codec_id_ != parameters.codec_id || max_pixels_ != max_pixels)) codec_.reset();
  bool flush_unless_idr = false;
  if (codec_) {
    ++reuses_;
    if (parameters.codec_id == AV_CODEC_ID_H264 && !drained_ && kTagsPictures &&
        !full_range_format(codec_->pix_fmt)) {
      flush_unless_idr = true;
    } else {
      avcodec_flush_buffers(codec_.get());
    }
  } else {
    ffmpeg::CodecParametersPtr bare(avcodec_parameters_alloc());
    if (!bare || avcodec_parameters_copy(bare.get(), &parameters) < 0) throw std::bad_alloc();
    av_freep(&bare->extradata);
    bare->extradata_size = 0;
    codec_ = ffmpeg::open_decoder(*bare, stream->time_base, /*threads=*/1, max_pixels, file,
                                  hw_device_);
    codec_id_ = parameters.codec_id;
    max_pixels_ = max_pixels;
  }
  drained_ = false;
  starts_like_a_new_decoder(*codec_, parameters);
  codec_->pkt_timebase = stream->time_base;
  codec_->skip_frame = AVDISCARD_DEFAULT;
  ++generation_;
  tag_pictures(*codec_, generation_);
  in_use_ = true;
  FileUse use(this, std::move(filter), flush_unless_idr);

  // This file's parameter sets, before any of its pictures.
  const AVCodecParameters* sets = use.filter()->par_out;
  if (sets->extradata_size > 0) {
    ffmpeg::PacketPtr packet = ffmpeg::make_packet();
    if (av_new_packet(packet.get(), sets->extradata_size) < 0) throw std::bad_alloc();
    std::memcpy(packet->data, sets->extradata, static_cast<size_t>(sets->extradata_size));
    // H.264 answers a packet without a picture with AVERROR_INVALIDDATA ("no frame"), having
    // read the sets; sets it cannot read leave the pictures undecodable, which the decode loop
    // reports as it would for a file of its own.
    (void)avcodec_send_packet(codec_.get(), packet.get());
    ffmpeg::FramePtr frame = ffmpeg::make_frame();
    while (avcodec_receive_frame(codec_.get(), frame.get()) >= 0) av_frame_unref(frame.get());
  }
  return use;
}

}  // namespace precompute
