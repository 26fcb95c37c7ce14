#include "pipeline/media/video_decoder.hpp"

extern "C" {
#include <libavutil/display.h>
#include <libavutil/hwcontext.h>
#include <libavutil/pixdesc.h>
}

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <string_view>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/media/cpu_decoder_backend.hpp"
#include "pipeline/media/decoder_backend.hpp"
#include "pipeline/media/ffmpeg_common.hpp"
#include "pipeline/media/gpu_rgb_kernel.hpp"

namespace precompute {
namespace {

using ffmpeg::FramePtr;
using ffmpeg::PacketPtr;
using ffmpeg::SwsContextPtr;

// Note [Sampling frames]
// A clip of duration D seconds is cut into n equal intervals and we take one frame per interval,
// the one on screen at its centre t_k:
//   fps mode:        n = max(1, ceil(D * fps)), t_k = (k + 0.5) / fps
//                    (n > max_frames fails with kTooLong rather than flooding the encoder)
//   num_frames mode: n = num_frames,            t_k = (k + 0.5) * D / n
// Times are relative to the stream's start (its start_time, else the first frame's pts), and D
// counts from there too, whatever the container's own clock (Note [Stream durations] in
// ffmpeg_common.cpp). The frame on screen at t_k is the last decoded frame whose pts <= t_k;
// when t_k precedes the first frame, the first frame; targets past the last frame get the last
// frame. So every clip gives exactly n frames: a clip shorter than its targets repeats frames, a
// one-frame video gives n copies. The duration comes from the headers, or from one pass over the
// packets when they have none; frames are counted by decoding, never from header frame counts
// (docs/reliability.md).
//
// t_k is rounded down to the stream's time base and compared with integer pts, so a frame that
// starts exactly at t_k counts as on screen, whatever the float rounding of t_k. The decoder
// hands frames over in presentation order; we keep a reference to the previous one only, and
// colour-convert only the frames chosen. The stored timestamp is the chosen frame's own pts, not
// t_k, on the sample clock (Note [Sample clock] in ffmpeg_common.hpp). Decoding stops as soon
// as a frame lies past the last target, which also bounds the work when a header understates
// the duration.

// Note [Seeking to what is sampled]
// Decoding every frame to keep a few costs nearly as much for 4 frames of a clip as for all of
// them. When the next target lies past a keyframe that the demuxer has not reached yet, we seek
// there (the container's index: MP4, MKV/WebM cues; files without one are decoded forward) and
// flush the decoder, so the frames in between are never read. Frame-exactness is the rule: the
// frames kept must be the ones a full decode keeps, bit for bit, timestamps included.
// - Whether to seek is decided on the index: a keyframe at or before target - reorder margin
//   (index times are decode times in MP4, and a frame shows at most the decoder's reorder depth,
//   video_delay, after its decode time; the first entry's distance from the stream's start
//   tells the shift between the two clocks) that lies past the last packet read. The seek asks
//   for that entry's time plus the shift, as a pts, which MP4's demuxer turns back into the
//   entry's decode time.
// - After a seek, frames are dropped until a keyframe comes out (an open GOP's leading pictures
//   reference the previous GOP and would differ from a full decode); its pts must be at most the
//   target and past the previous frame kept. Otherwise, or when a non-key frame past the target
//   comes first, or the file ends first, the seek is undone: back to the start, seeking off,
//   frames up to the last one kept dropped, and decoding goes on as a full decode would.
// - Only forward, and only past the last packet read: decoding on is cheaper than re-reading.
//   And each seek goes to a later index entry than the one before: a broken file whose demuxer
//   lands before the entry asked for would otherwise be sent back to that entry again and again
//   until the deadline (a fuzzer found this, allocating gigabytes on the way), where a full
//   decode finishes. So there are at most as many seeks as targets.
// - When seeks and the way back kept no frame at all, the file is decoded again without
//   seeking, in the time left: what a full decode gives is the answer, frames or an error.
// The decoder's output after a flush is the same as from a fresh start at that keyframe, which
// the frame-exactness tests check against a full decode for many GOP structures and containers
// (tests/unit/video_decoder_test.cpp, "Seek").

// Note [Seeking without a flush]
// FFmpeg's H.264 decoder forgets its set-up when flushed, and sets its hwaccel up again at the
// next picture: on NVDEC each seek would destroy the NVDEC decoder and make a new one, which
// costs far more than the frames the seek skips (docs/benchmarks.md, "NVDEC"). So H.264 on
// NVDEC (NvdecDecoderBackend::seek) seeks without a flush when the packet it lands on holds an IDR slice: an IDR drops every reference
// picture and restarts the picture order count, so the frames from it on are decoded as from a
// fresh start; pictures still waiting in the decoder's reorder buffer come out first, with times
// before the keyframe's, and are dropped as every frame before the landing keyframe is. Any
// other keyframe (an open GOP's I-frame, a recovery point) is flushed for: the picture order
// count runs on from the last reference picture decoded, which the seek skipped, and without a
// flush the decoder put frames in the wrong order (the open-GOP test caught it).
// Everything else of the Note above holds unchanged (the landing checks, the undo, which flushes,
// and the redo). The frame-exactness tests run every GOP structure both ways
// (VideoDecodeOptions::flush_on_seek), on the CPU, where the decoder is the same code.

// Note [Skipping frames nobody keeps]
// Between keyframes, the decoder can drop non-reference frames (B-frames, mostly) before
// decoding them (skip_frame = AVDISCARD_NONREF): no other frame is predicted from them. A frame
// of pts p may be kept only for a target t with p <= t < q, where q is the pts of the next frame
// shown after it; so when a frame that will surely be shown, with pts q > p, has already been
// read, and no target lies in [p, q), the frame at p is never kept and may be dropped. "Surely
// shown" means sent to the decoder without skipping: the decoder alone knows which frames are
// references, so a frame sent with skipping allowed may vanish and never counts as q. Each
// packet's pts is known before it is decoded (B-frames come after the frames that follow them
// on screen), which is what makes this work. The frames kept are those of a full decode; the
// tests that check seeking check this too. Whether it pays depends on the backend: a session
// drops frames only at sparse sampling (Note [NVDEC drops frames only at sparse sampling] in
// nvdec_decoder_backend.cpp).

// Target times t_k, in ticks of the stream's time base from its start.
std::vector<int64_t> sample_offsets(int64_t duration, AVRational time_base,
                                    const VideoDecodeOptions& options,
                                    const std::filesystem::path& file) {
  std::vector<int64_t> offsets;
  if (options.fps > 0) {
    // A rational fps keeps ceil(D * fps) and t_k exact in integers.
    const AVRational fps = av_d2q(options.fps, 1 << 24);
    const int64_t count =
        std::max<int64_t>(1, av_rescale_rnd(duration, int64_t{time_base.num} * fps.num,
                                            int64_t{time_base.den} * fps.den, AV_ROUND_UP));
    PC_MEDIA_CHECK(count <= options.max_frames, FailureCategory::kTooLong, file.string(),
                   ": sampling at ", options.fps, " fps gives ", count,
                   " frames, over the limit of ", options.max_frames,
                   " (video.max_frames); raise it or lower video.fps");
    offsets.reserve(count);
    for (int64_t k = 0; k < count; ++k) {
      offsets.push_back(av_rescale_rnd((2 * k + 1) * fps.den, time_base.den,
                                       int64_t{2} * fps.num * time_base.num, AV_ROUND_DOWN));
    }
  } else {
    const int64_t count = options.num_frames;
    offsets.reserve(count);
    for (int64_t k = 0; k < count; ++k) {
      offsets.push_back(av_rescale_rnd(2 * k + 1, duration, 2 * count, AV_ROUND_DOWN));
    }
  }
  return offsets;
}

// The duration of a stream whose headers have none, from one pass over its packets: the end of
// the last packet (pts + duration) from the stream's start.
int64_t measure_duration(AVFormatContext* format, const AVStream* stream,
                         const ffmpeg::Deadline& deadline, const std::filesystem::path& file) {
  PacketPtr packet = ffmpeg::make_packet();
  int64_t first = AV_NOPTS_VALUE;
  int64_t end = AV_NOPTS_VALUE;
  while (true) {
    deadline.check(file, "measuring the duration");
    const int read = av_read_frame(format, packet.get());
    const ffmpeg::PacketUnref unref(packet.get());
    if (read < 0) {
      // Reads fail once the deadline passes; that is a timeout, not damage.
      deadline.check(file, "measuring the duration");
      break;  // the end, or damage: decoding will tell which parts are usable
    }
    if (packet->stream_index != stream->index) continue;
    const int64_t ts = packet->pts != AV_NOPTS_VALUE ? packet->pts : packet->dts;
    if (ts == AV_NOPTS_VALUE) continue;
    first = first == AV_NOPTS_VALUE ? ts : std::min(first, ts);
    end = std::max(end == AV_NOPTS_VALUE ? ts : end, ts + std::max<int64_t>(packet->duration, 0));
  }
  PC_MEDIA_CHECK(end != AV_NOPTS_VALUE, FailureCategory::kDecodeError, file.string(),
                 ": cannot tell the video's duration: neither the headers nor any packet has a "
                 "time");
  const int64_t start = ffmpeg::stream_start(stream);
  return end - (start != AV_NOPTS_VALUE ? start : first);
}

// A rectangle of the source picture, in pixels.
struct Region {
  int x = 0;
  int y = 0;
  int width = 0;
  int height = 0;
};

// The part of a width x height picture that is scaled to out_width x out_height: all of it for
// kStretch; for kShorterSideCrop the largest centred rectangle with the output's aspect ratio,
// its origin rounded down so that it starts on a whole chroma sample (and a whole byte for
// bit-packed formats) in every plane.
Region source_region(int width, int height, int out_width, int out_height, ResizeMode resize,
                     const AVPixFmtDescriptor& desc) {
  if (resize == ResizeMode::kStretch) return {0, 0, width, height};
  Region region{0, 0, width, height};
  const int64_t wide = int64_t{width} * out_height;
  const int64_t tall = int64_t{height} * out_width;
  if (wide > tall) {
    region.width = static_cast<int>(std::max<int64_t>(1, (tall + out_height / 2) / out_height));
  } else if (tall > wide) {
    region.height = static_cast<int>(std::max<int64_t>(1, (wide + out_width / 2) / out_width));
  }
  const int align_x = (desc.flags & AV_PIX_FMT_FLAG_BITSTREAM) ? 8 : 1 << desc.log2_chroma_w;
  const int align_y = 1 << desc.log2_chroma_h;
  region.x = (width - region.width) / 2 / align_x * align_x;
  region.y = (height - region.height) / 2 / align_y * align_y;
  return region;
}

// Pointers to the region's top-left sample in each plane of `frame`, so that libswscale reads
// the crop in place: no full-size copy is made.
void region_planes(const AVFrame& frame, const AVPixFmtDescriptor& desc, const Region& region,
                   const uint8_t* planes[4]) {
  for (int p = 0; p < 4; ++p) {
    planes[p] = frame.data[p];
    // Plane 1 of a paletted format is the palette, not pixels.
    if (planes[p] == nullptr || ((desc.flags & AV_PIX_FMT_FLAG_PAL) && p == 1)) continue;
    const bool chroma = p == 1 || p == 2;  // FFmpeg's own rule for subsampled planes
    const int x = chroma ? region.x >> desc.log2_chroma_w : region.x;
    const int y = chroma ? region.y >> desc.log2_chroma_h : region.y;
    int step = 0;
    for (int c = 0; c < desc.nb_components; ++c) {
      if (desc.comp[c].plane == p) step = desc.comp[c].step;
    }
    const int64_t x_bytes =
        (desc.flags & AV_PIX_FMT_FLAG_BITSTREAM) ? int64_t{x} * step / 8 : int64_t{x} * step;
    planes[p] += int64_t{y} * frame.linesize[p] + x_bytes;
  }
}

// Note [Display orientation]
// A stream may carry a display matrix: phones record with the sensor's orientation and tag how
// the picture is to be turned, editors tag mirroring. Encoders should see what a viewer sees, so
// with video.autorotate (the default) frames are stored as displayed: options.height x
// options.width of the displayed picture, the shorter-side crop taken from the displayed
// picture. Only quarter turns and mirrors are applied; they move pixels without resampling.
// A matrix that turns by another angle keeps the coded orientation: showing it would need a
// larger canvas with invented borders, and such files are rare.
//
// FFmpeg's matrix [a b u; c d v; x y w] (libavutil/display.h) takes a coded pixel (p, q) to the
// displayed (a p + c q, b p + d q), translation aside. For a quarter turn or mirror either
// b = c = 0: the axes stay, a < 0 mirrors the columns and d < 0 the rows; or a = d = 0: the
// axes swap, the displayed columns run along the coded rows (mirrored when c < 0) and the
// displayed rows along the coded columns (mirrored when b < 0). The matrix's own values decide,
// not its angle: a mirror changes the sign of the determinant, which no angle expresses.
//
// libswscale scales the (cropped) coded picture to the output size turned the coded way, and
// that small result is then moved into place, so no full-size picture is ever turned.
struct Orientation {
  bool transpose = false;  // displayed columns run along coded rows
  bool mirror_x = false;   // displayed columns are taken right to left
  bool mirror_y = false;   // displayed rows are taken bottom to top
  bool upright() const { return !transpose && !mirror_x && !mirror_y; }
};

Orientation display_orientation(const AVStream* stream) {
  size_t size = 0;
  const uint8_t* data = av_stream_get_side_data(stream, AV_PKT_DATA_DISPLAYMATRIX, &size);
  int32_t m[9];
  if (data == nullptr || size < sizeof(m)) return {};
  std::memcpy(m, data, sizeof(m));  // side data promises no alignment
  const double angle = av_display_rotation_get(m);
  // NaN: a singular matrix, which shows nothing; keep the picture as coded.
  if (!std::isfinite(angle) || std::abs(std::remainder(angle, 90.0)) > 1.0) return {};
  const int64_t a = m[0];
  const int64_t b = m[1];
  const int64_t c = m[3];
  const int64_t d = m[4];
  Orientation orientation;
  orientation.transpose = std::abs(b) + std::abs(c) > std::abs(a) + std::abs(d);
  orientation.mirror_x = orientation.transpose ? c < 0 : a < 0;
  orientation.mirror_y = orientation.transpose ? b < 0 : d < 0;
  return orientation;
}

// libswscale's colour matrix for a frame: its own, BT.601 when it names none (as the ffmpeg CLI
// assumes for untagged video). The CPU and the GPU conversions both take it from here.
int swscale_colorspace(AVColorSpace colorspace) {
  return colorspace == AVCOL_SPC_UNSPECIFIED ? SWS_CS_ITU601 : static_cast<int>(colorspace);
}

// Scales and colour-converts decoded frames to tightly packed RGB24 of the output size, straight
// from the decoder's pixel format, then turns them upright (Note [Display orientation]). Keeps
// one libswscale context, made again when the frame's size, format or colour description
// changes mid-stream.
class RgbConverter {
 public:
  RgbConverter(const VideoDecodeOptions& options, VideoDecoderBackend& backend,
               Orientation orientation, const std::filesystem::path& file)
      : options_(options),
        backend_(backend),
        gpu_frames_(backend.capabilities().gpu_frames),
        orientation_(orientation),
        scaled_width_(orientation.transpose ? options.height : options.width),
        scaled_height_(orientation.transpose ? options.width : options.height),
        file_(file) {
    if (!orientation_.upright()) scaled_.resize(size_t{3} * scaled_width_ * scaled_height_);
  }

  // Writes options.height * options.width * 3 bytes to `out`.
  void convert(const AVFrame& frame, uint8_t* out) {
    if (frame.format == AV_PIX_FMT_CUDA) {
      convert_on_gpu(frame, out);
      return;
    }
    const auto format = static_cast<AVPixelFormat>(frame.format);
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    PC_ASSERT(desc != nullptr, "decoded frame with unknown pixel format ", frame.format);
    const Region region = source_region(frame.width, frame.height, scaled_width_, scaled_height_,
                                        options_.resize, *desc);
    const Key key{region.width, region.height, format, frame.colorspace, frame.color_range};
    if (!context_ || !(key == key_)) {
      context_ = make_context(key, *desc);
      key_ = key;
    }
    const uint8_t* planes[4];
    region_planes(frame, *desc, region, planes);
    uint8_t* const dst[4] = {orientation_.upright() ? out : scaled_.data(), nullptr, nullptr,
                             nullptr};
    const int dst_stride[4] = {scaled_width_ * 3, 0, 0, 0};
    const int rows =
        sws_scale(context_.get(), planes, frame.linesize, 0, region.height, dst, dst_stride);
    PC_MEDIA_CHECK(
        rows == scaled_height_, FailureCategory::kDecodeError, file_.string(),
        ": cannot convert a ", frame.width, "x", frame.height, " ", av_get_pix_fmt_name(format),
        " frame to RGB (sws_scale): ", rows < 0 ? ffmpeg::error_text(rows) : "short output");
    if (!orientation_.upright()) turn_upright(out);
  }

 private:
  struct Key {
    int width = 0;
    int height = 0;
    AVPixelFormat format = AV_PIX_FMT_NONE;
    AVColorSpace colorspace = AVCOL_SPC_UNSPECIFIED;
    AVColorRange range = AVCOL_RANGE_UNSPECIFIED;
    bool operator==(const Key&) const = default;
  };

  // A picture in device memory, converted by the backend (NVDEC: the session's kernel, Note
  // [Converting NVDEC pictures on the GPU] in gpu_rgb_kernel.cu) with the region and colour
  // set-up of the CPU path.
  void convert_on_gpu(const AVFrame& frame, uint8_t* out) {
    PC_MEDIA_CHECK(gpu_frames_ && frame.hw_frames_ctx != nullptr, FailureCategory::kDecodeError,
                   file_.string(), ": a CUDA frame from a decoder without a GPU");
    const auto* frames = reinterpret_cast<const AVHWFramesContext*>(frame.hw_frames_ctx->data);
    const AVPixelFormat format = frames->sw_format;
    PC_MEDIA_CHECK(format == AV_PIX_FMT_NV12 || format == AV_PIX_FMT_P010 ||
                       format == AV_PIX_FMT_P016,
                   FailureCategory::kUnsupported, file_.string(), ": NVDEC gave ",
                   av_get_pix_fmt_name(format), " pictures, which the GPU conversion does not read");
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(format);
    const Region region = source_region(frame.width, frame.height, scaled_width_, scaled_height_,
                                        options_.resize, *desc);
    GpuRgbParams p;
    p.luma = frame.data[0];
    p.luma_pitch = frame.linesize[0];
    p.chroma = frame.data[1];
    p.chroma_pitch = frame.linesize[1];
    p.bytes_per_sample = desc->comp[0].step;
    p.region_x = region.x;
    p.region_y = region.y;
    p.region_width = region.width;
    p.region_height = region.height;
    p.out_width = scaled_width_;
    p.out_height = scaled_height_;
    // libswscale's table and range handling (sws_setColorspaceDetails), as make_context sets up:
    // the frame's matrix (BT.601 when it names none), limited range unless it says full.
    const int* table = sws_getCoefficients(swscale_colorspace(frame.colorspace));
    const bool full = frame.color_range == AVCOL_RANGE_JPEG;
    const float chroma_scale = full ? 224.0f / 255.0f : 1.0f;
    p.crv = static_cast<float>(table[0]) / 65536.0f * chroma_scale;
    p.cbu = static_cast<float>(table[1]) / 65536.0f * chroma_scale;
    p.cgu = static_cast<float>(table[2]) / 65536.0f * chroma_scale;
    p.cgv = static_cast<float>(table[3]) / 65536.0f * chroma_scale;
    p.y_offset = full ? 0.0f : 16.0f;
    p.y_scale = full ? 1.0f : 255.0f / 219.0f;
    try {
      backend_.to_rgb(p, orientation_.upright() ? out : scaled_.data());
    } catch (const std::runtime_error& e) {
      PC_MEDIA_THROW(FailureCategory::kDecodeError, file_.string(), ": ",
                     backend_.capabilities().name, ": ", e.what());
    }
    if (!orientation_.upright()) turn_upright(out);
  }

  // Moves the scaled picture, in coded orientation, into `out` in displayed orientation.
  void turn_upright(uint8_t* out) const {
    const int width = options_.width;
    const int height = options_.height;
    for (int y = 0; y < height; ++y) {
      const int v = orientation_.mirror_y ? height - 1 - y : y;
      for (int x = 0; x < width; ++x) {
        const int u = orientation_.mirror_x ? width - 1 - x : x;
        const int column = orientation_.transpose ? v : u;
        const int row = orientation_.transpose ? u : v;
        std::memcpy(out + (static_cast<size_t>(y) * width + x) * 3,
                    scaled_.data() + (static_cast<size_t>(row) * scaled_width_ + column) * 3, 3);
      }
    }
  }

  SwsContextPtr make_context(const Key& key, const AVPixFmtDescriptor& desc) const {
    constexpr int kFlags = SWS_BICUBIC | SWS_ACCURATE_RND | SWS_FULL_CHR_H_INT;
    SwsContextPtr context(sws_getContext(key.width, key.height, key.format, scaled_width_,
                                         scaled_height_, AV_PIX_FMT_RGB24, kFlags, nullptr, nullptr,
                                         nullptr));
    PC_MEDIA_CHECK(context != nullptr, FailureCategory::kUnsupported, file_.string(),
                   ": cannot convert pixel format ", av_get_pix_fmt_name(key.format),
                   " to RGB (sws_getContext)");

    // RGB sources (gbr: libx264rgb, VP9 and FFV1 RGB; packed RGB; palettes) have no matrix or
    // range to choose. libswscale scales them through its own YUV, converting in with its
    // rgb-to-yuv table and out with its yuv-to-rgb one; its defaults are one matrix both ways, so
    // colours come back as they were. Installing the frame's "matrix" would pair two different
    // ones: AVCOL_SPC_RGB is index 0 of sws_getCoefficients, BT.709, against BT.601 on the way
    // in, which turned pure green into (0, 215, 0).
    if (desc.flags & (AV_PIX_FMT_FLAG_RGB | AV_PIX_FMT_FLAG_PAL)) return context;

    // YUV and grey sources. Colour: the frame's matrix, BT.601 when it names none (as the
    // ffmpeg CLI assumes for untagged video). Range: the frame's when it states one; otherwise
    // libswscale's default for the format, which is limited except for yuvj* and grey formats
    // (full by definition). The output is full-range RGB.
    int* inv_table = nullptr;
    int* table = nullptr;
    int src_range = 0;
    int dst_range = 0;
    int brightness = 0;
    int contrast = 0;
    int saturation = 0;
    const int got = sws_getColorspaceDetails(context.get(), &inv_table, &src_range, &table,
                                             &dst_range, &brightness, &contrast, &saturation);
    PC_MEDIA_CHECK(got >= 0, FailureCategory::kUnsupported, file_.string(),
                   ": cannot read the colour set-up for ", av_get_pix_fmt_name(key.format),
                   " (sws_getColorspaceDetails)");
    if (key.range == AVCOL_RANGE_JPEG) src_range = 1;
    if (key.range == AVCOL_RANGE_MPEG) src_range = 0;
    const int* coefficients = sws_getCoefficients(swscale_colorspace(key.colorspace));
    const int set = sws_setColorspaceDetails(context.get(), coefficients, src_range, table,
                                             /*dstRange=*/1, brightness, contrast, saturation);
    PC_MEDIA_CHECK(set >= 0, FailureCategory::kUnsupported, file_.string(),
                   ": cannot set up colour conversion from ", av_get_pix_fmt_name(key.format),
                   " (sws_setColorspaceDetails)");
    return context;
  }

  const VideoDecodeOptions& options_;
  VideoDecoderBackend& backend_;
  const bool gpu_frames_;
  const Orientation orientation_;
  const int scaled_width_;  // the output size turned the coded way
  const int scaled_height_;
  const std::filesystem::path& file_;
  SwsContextPtr context_;
  Key key_;
  std::vector<uint8_t> scaled_;  // libswscale's output, when it still has to be turned
};

// A video file opened for sampling: its video stream, within the size and length limits, and
// its duration in the stream's time base from the stream's start (Note [Sampling frames]).
struct OpenedVideo {
  ffmpeg::InputFile input;
  const AVStream* stream;
  int64_t duration;
  double duration_s;
};

OpenedVideo open_video(const MediaSource& source, const VideoDecodeOptions& options,
                       const ffmpeg::Deadline& deadline) {
  const std::filesystem::path file(source.name());
  const ffmpeg::InputLimits limits{options.max_file_bytes, options.max_pixels};
  ffmpeg::InputFile input = ffmpeg::open_input(source, limits, deadline);
  const AVStream* stream = ffmpeg::find_stream(input.format(), AVMEDIA_TYPE_VIDEO, file);
  const int width = stream->codecpar->width;
  const int height = stream->codecpar->height;
  PC_MEDIA_CHECK(int64_t{width} * height <= options.max_pixels, FailureCategory::kTooLarge,
                 file.string(), ": the picture is ", width, "x", height, ", over the limit of ",
                 options.max_pixels, " pixels (video.max_pixels)");

  std::optional<int64_t> duration = ffmpeg::header_duration(input.format(), stream);
  if (!duration) {
    duration = measure_duration(input.format(), stream, deadline, file);
    // Reading from the start again: reopening works for every container, seeking does not.
    const int index = stream->index;
    input = ffmpeg::open_input(source, limits, deadline);
    PC_MEDIA_CHECK(index < static_cast<int>(input.format()->nb_streams),
                   FailureCategory::kDecodeError, file.string(),
                   ": the file changed while it was read");
    stream = input.format()->streams[index];
  }
  const double duration_s = static_cast<double>(*duration) * av_q2d(stream->time_base);
  PC_MEDIA_CHECK(duration_s <= options.max_duration_s, FailureCategory::kTooLong, file.string(),
                 ": the video lasts ", duration_s, " s, over the limit of ", options.max_duration_s,
                 " s (video.max_duration_s)");
  return OpenedVideo{std::move(input), stream, *duration, duration_s};
}

}  // namespace

VideoDecodeOptions video_decode_options(const VideoSection& section, const RunSection& run) {
  VideoDecodeOptions options;
  options.fps = section.fps;
  options.num_frames = section.num_frames;
  options.height = section.height;
  options.width = section.width;
  options.resize = section.resize;
  options.max_duration_s = section.max_duration_s;
  options.max_frames = section.max_frames;
  options.threads = section.decoder_threads;
  options.max_pixels = section.max_pixels;
  options.max_decoded_frames = section.max_decoded_frames;
  options.timeout_s = run.sample_timeout_s;
  options.max_file_bytes = run.max_file_bytes;
  options.autorotate = section.autorotate;
  options.seek = section.seek;
  return options;
}

VideoFrames decode_video(const MediaSource& source, const VideoDecodeOptions& options) {
  CpuDecoderBackend backend;
  return decode_video(source, options, backend);
}

VideoFrames decode_video(const MediaSource& source, const VideoDecodeOptions& options,
                         VideoDecoderBackend& backend) {
  const std::filesystem::path file(source.name());  // for messages
  PC_ASSERT((options.fps > 0) != (options.num_frames > 0),
            "exactly one of fps and num_frames must be set");
  PC_ASSERT(options.width > 0 && options.height > 0 && options.max_pixels > 0);

  const ffmpeg::Deadline deadline(options.timeout_s);
  // Where a file's time goes, at debug level: opening, the first frame, the rest.
  const auto started = std::chrono::steady_clock::now();
  const auto ms_since_start = [&] {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started)
        .count();
  };
  double opened_ms = 0.0;
  double first_frame_ms = -1.0;
  OpenedVideo opened = open_video(source, options, deadline);
  ffmpeg::InputFile& input = opened.input;
  const AVStream* const stream = opened.stream;
  const int64_t duration = opened.duration;
  const int width = stream->codecpar->width;
  const int height = stream->codecpar->height;
  // Read before any seek moves the demuxer (Note [Sample clock] in ffmpeg_common.hpp).
  const ffmpeg::SampleClock clock(input.format());
  const AVRational time_base = stream->time_base;
  const double duration_s = opened.duration_s;

  const std::vector<int64_t> offsets = sample_offsets(duration, time_base, options, file);
  const auto count = static_cast<int64_t>(offsets.size());
  const size_t frame_bytes = size_t{3} * options.width * options.height;

  VideoFrames out;
  out.num_frames = count;
  out.height = options.height;
  out.width = options.width;
  out.rgb.resize(frame_bytes * count);
  out.timestamps.resize(count);
  out.source_width = width;
  out.source_height = height;
  out.duration_s = duration_s;

  const DecoderCapabilities caps = backend.capabilities();
  backend.open(stream, options, file);
  AVCodecContext* const codec = backend.codec();
  AVBSFContext* const packet_filter = backend.packet_filter();
  RgbConverter converter(options, backend,
                         options.autorotate ? display_orientation(stream) : Orientation{}, file);
  opened_ms = ms_since_start();

  // A frame without a timestamp is put one frame period after the previous one.
  const AVRational frame_rate =
      av_guess_frame_rate(input.format(), const_cast<AVStream*>(stream), nullptr);
  const int64_t frame_period =
      frame_rate.num > 0 ? std::max<int64_t>(1, av_rescale_q(1, av_inv_q(frame_rate), time_base))
                         : 1;

  int64_t start = ffmpeg::stream_start(stream);  // AV_NOPTS_VALUE: the first frame's pts, once
                                                 // decoded
  FramePtr previous = ffmpeg::make_frame();
  int64_t previous_pts = AV_NOPTS_VALUE;
  int64_t frame_number = -1;      // of the previous frame, counting decoded frames from 0
  int64_t converted_number = -1;  // the frame in the last filled slot
  int64_t next = 0;               // the next target to fill
  int64_t decoded = 0;            // frames out of the decoder, for video.max_decoded_frames

  // Note [Seeking to what is sampled].
  AVStream* seekable = input.format()->streams[stream->index];
  bool seeking = options.seek;
  if (seeking && avformat_index_get_entries_count(seekable) <= 1 &&
      std::string_view(input.format()->iformat->name).find("matroska") != std::string_view::npos) {
    // Matroska reads its cues (the index) on the first seek; seeking to the start loads them
    // and leaves the demuxer where it was. (Other demuxers without an index, MPEG-TS among
    // them, seek by searching timestamps, which may not land on the first frame.)
    const int64_t at = stream->start_time != AV_NOPTS_VALUE ? stream->start_time : 0;
    // A demuxer that cannot even seek to the start is decoded forward.
    seeking = av_seek_frame(input.format(), stream->index, at, AVSEEK_FLAG_BACKWARD) >= 0;
  }
  seeking = seeking && avformat_index_get_entries_count(seekable) > 1;
  const int64_t reorder_margin = int64_t{stream->codecpar->video_delay + 1} * frame_period;
  bool awaiting_key = false;     // a seek was made; frames until a keyframe are dropped
  bool flush_unless_idr = false;  // a seek was made without a flush; the next packet decides
  bool undo_pending = false;     // the seek must be undone before the next read
  int64_t seek_target = 0;       // pts of the target the seek was for
  int64_t seeked_to = std::numeric_limits<int64_t>::min();  // index time of the last seek
  int64_t replay_until = AV_NOPTS_VALUE;  // after an undo: frames up to this pts were seen

  // Fills the next slot with `frame`, decoded as number `number` at `pts`.
  const auto fill = [&](const AVFrame& frame, int64_t number, int64_t pts) {
    uint8_t* slot = out.rgb.data() + frame_bytes * next;
    PC_ASSERT(number >= 0 && next < count, "filling slot ", next, " of ", count, " with frame ",
              number);
    if (number == converted_number) {
      std::memcpy(slot, slot - frame_bytes, frame_bytes);
    } else {
      if (frame.format == AV_PIX_FMT_CUDA) out.nvdec = true;
      const ffmpeg::TimeInto timed(ffmpeg::thread_decode_times().convert);
      converter.convert(frame, slot);
      converted_number = number;
    }
    out.timestamps[next] = clock.seconds(stream, pts, start);
    ++next;
  };

  // Note [Skipping frames nobody keeps]. Pts of frames read and sent without skipping, whose
  // next target is still to come; cleared when the demuxer moves (a seek, an undo).
  std::set<int64_t> shown;
  constexpr size_t kShownLimit = 64;  // well past any decoder's reorder depth (H.264: 16)
  // Frames between targets on average, from the header's frame rate; unknown counts as sparse.
  using Dropping = VideoDecodeOptions::FrameDropping;
  const double frames_per_target =
      frame_rate.num > 0 && frame_rate.den > 0
          ? duration_s * av_q2d(frame_rate) / static_cast<double>(count)
          : std::numeric_limits<double>::infinity();
  const bool skipping =
      options.seek && (options.drop_frames == Dropping::kAuto
                           ? frames_per_target >= caps.drops_frames_from_gap
                           : options.drop_frames == Dropping::kOn);
  const auto before_send = [&](const AVPacket& packet) {
    backend.before_packet(packet);
    if (flush_unless_idr) {
      flush_unless_idr = false;
      if (!ffmpeg::h264_packet_has_idr(packet, *stream->codecpar)) avcodec_flush_buffers(codec);
    }
    if (!skipping) return;
    codec->skip_frame = AVDISCARD_DEFAULT;
    const int64_t p = packet.pts;
    if (p == AV_NOPTS_VALUE || start == AV_NOPTS_VALUE || awaiting_key || undo_pending ||
        next >= count) {
      return;
    }
    // Frames already out of the decoder cannot follow a packet read now.
    while (!shown.empty() && previous_pts != AV_NOPTS_VALUE && *shown.begin() < previous_pts) {
      shown.erase(shown.begin());
    }
    const auto later = shown.upper_bound(p);
    if (later != shown.end()) {
      // The first target at or after p; none in [p, q) means nobody keeps p.
      const auto target = std::lower_bound(offsets.begin() + next, offsets.end(), p - start);
      if (target == offsets.end() || start + *target >= *later) {
        codec->skip_frame = AVDISCARD_NONREF;
        return;
      }
    }
    shown.insert(p);
    // A decoder that takes packets and returns no frames never trims the set; forgetting its
    // earliest entries only means fewer frames skipped, so it is kept short.
    if (shown.size() > kShownLimit) shown.erase(shown.begin());
  };

  const bool may_give_up = options.give_up && caps.may_give_up;
  const auto before_read = [&](int64_t last_dts) {
    if (may_give_up) {
      double done = 0.0;
      if (start != AV_NOPTS_VALUE && last_dts != AV_NOPTS_VALUE && duration > 0) {
        done = std::clamp(static_cast<double>(last_dts - start) / static_cast<double>(duration),
                          0.0, 1.0);
      }
      if (options.give_up(done, duration_s)) throw DecodeGivenUp(decoded, deadline.seconds_left());
    }
    const ffmpeg::TimeInto timed(ffmpeg::thread_decode_times().seek);
    if (undo_pending) {
      shown.clear();
      undo_pending = false;
      awaiting_key = false;
      seeking = false;
      replay_until = previous_pts;
      ++out.seeks_undone;
      // The first index entry is the first packet; the stream's start may lie before it.
      const AVIndexEntry* first = avformat_index_get_entry(seekable, 0);
      const int64_t to = first != nullptr ? std::min(start, first->timestamp) : start;
      const int back = av_seek_frame(input.format(), stream->index, to, AVSEEK_FLAG_BACKWARD);
      PC_MEDIA_CHECK(back >= 0, FailureCategory::kDecodeError, file.string(),
                     ": cannot go back to the start after a seek (av_seek_frame): ",
                     ffmpeg::error_text(back));
      avcodec_flush_buffers(codec);
      return;
    }
    if (!seeking || awaiting_key || next >= count || start == AV_NOPTS_VALUE ||
        last_dts == AV_NOPTS_VALUE) {
      return;
    }
    const int64_t target = start + offsets[next];
    // Index times are decode times in MP4 (the first one lies before the stream's start by the
    // reorder delay) and presentation times in Matroska; the first entry tells which.
    const AVIndexEntry* first = avformat_index_get_entry(seekable, 0);
    const int64_t index_shift = first != nullptr ? std::max<int64_t>(0, start - first->timestamp) : 0;
    const int found = av_index_search_timestamp(seekable, target - index_shift - reorder_margin,
                                                AVSEEK_FLAG_BACKWARD);
    if (found < 0) return;
    const AVIndexEntry* entry = avformat_index_get_entry(seekable, found);
    if (entry == nullptr || !(entry->flags & AVINDEX_KEYFRAME) || entry->timestamp <= last_dts ||
        entry->timestamp <= seeked_to) {
      return;
    }
    // Copied: a seek may grow the index, which moves its entries.
    const int64_t entry_time = entry->timestamp;
    // av_seek_frame takes a pts, which MP4's demuxer turns back into a decode time: the entry's
    // time plus the shift lands on that entry (or, were the shift overestimated, on an earlier
    // keyframe, which costs frames, never exactness).
    if (av_seek_frame(input.format(), stream->index, entry_time + index_shift,
                      AVSEEK_FLAG_BACKWARD) < 0) {
      seeking = false;  // the demuxer cannot: decode forward from where it is
      return;
    }
    seeked_to = entry_time;
    // Note [Seeking without a flush]: the backend flushes, or it is decided on the packet
    // landed on (before_send).
    flush_unless_idr = !backend.seek();
    shown.clear();
    awaiting_key = true;
    seek_target = target;
    ++out.seeks;
  };

  const auto sink = [&](AVFrame* frame) -> bool {
    // The previous file's last pictures, out of a kept decoder that was not flushed.
    if (caps.keeps_decoder && !backend.owns(*frame)) return true;
    if (first_frame_ms < 0) first_frame_ms = ms_since_start();
    PC_MEDIA_CHECK(++decoded <= options.max_decoded_frames, FailureCategory::kTooLong,
                   file.string(), ": decoded more than ", options.max_decoded_frames,
                   " frames, the limit per sample (video.max_decoded_frames)");
    PC_MEDIA_CHECK(int64_t{frame->width} * frame->height <= options.max_pixels,
                   FailureCategory::kTooLarge, file.string(), ": a frame is ", frame->width, "x",
                   frame->height, ", over the limit of ", options.max_pixels,
                   " pixels (video.max_pixels)");
    int64_t pts = frame->best_effort_timestamp;
    if (pts == AV_NOPTS_VALUE) {
      pts = previous_pts == AV_NOPTS_VALUE ? 0 : previous_pts + frame_period;
    }
    if (start == AV_NOPTS_VALUE) start = pts;
    if (undo_pending) return true;
    if (awaiting_key) {
      if (!frame->key_frame) {
        if (pts > seek_target) undo_pending = true;  // no keyframe where the index said
        return true;
      }
      awaiting_key = false;
      if (pts > seek_target || (previous_pts != AV_NOPTS_VALUE && pts <= previous_pts)) {
        undo_pending = true;
        return true;
      }
    }
    if (replay_until != AV_NOPTS_VALUE) {
      if (pts <= replay_until) return true;  // seen before the seek was undone
      replay_until = AV_NOPTS_VALUE;
    }
    const int64_t number = frame_number + 1;
    // Targets before this frame show the previous frame, or this one when it is the first.
    while (next < count && start + offsets[next] < pts) {
      if (frame_number >= 0) {
        fill(*previous, frame_number, previous_pts);
      } else {
        fill(*frame, number, pts);
      }
    }
    if (next == count) return false;
    av_frame_unref(previous.get());
    av_frame_move_ref(previous.get(), frame);
    previous_pts = pts;
    frame_number = number;
    return true;
  };
  bool drained = false;
  ffmpeg::decode_stream(input.format(), stream, codec, sink, deadline, file, before_read,
                        before_send, packet_filter, &drained);
  if ((awaiting_key || undo_pending) && next < count) {
    // The file ended before the keyframe a seek was for: undo it and decode on from the start.
    undo_pending = true;
    before_read(AV_NOPTS_VALUE);
    ffmpeg::decode_stream(input.format(), stream, codec, sink, deadline, file, before_read,
                          before_send, packet_filter, &drained);
  }
  // A kept decoder is left in a known state for the next file.
  backend.close(drained);
  out.decoded_frames = decoded;
  spdlog::debug("{}: {} in {:.1f} ms: opened after {:.1f} ms, first frame after {:.1f} ms, {} "
                "frames decoded, {} seek(s){}",
                file.string(), out.nvdec ? caps.name : std::string_view("CPU"), ms_since_start(),
                opened_ms, first_frame_ms, decoded, out.seeks, backend.describe_use());

  if (frame_number < 0) {
    // Not one frame kept, though frames were decoded (else decode_stream would have thrown): a
    // seek landed where the file could not be decoded from, and going back to the start found
    // nothing either (a fuzzed Matroska file did this). The frames must be those of a decode
    // without seeking, so that is what is done, in the time left.
    PC_MEDIA_CHECK(options.seek && out.seeks > 0, FailureCategory::kDecodeError, file.string(),
                   ": no frame could be decoded");
    VideoDecodeOptions forward = options;
    forward.seek = false;
    forward.timeout_s = std::max(1e-3, deadline.seconds_left());
    VideoFrames frames = decode_video(source, forward, backend);  // the backend opens again
    frames.seeks += out.seeks;
    frames.seeks_undone += out.seeks_undone + 1;
    frames.decoded_frames += decoded;
    return frames;
  }
  // Targets past the last frame show the last frame.
  while (next < count) fill(*previous, frame_number, previous_pts);
  return out;
}

}  // namespace precompute
