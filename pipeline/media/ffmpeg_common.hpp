#pragma once
// The FFmpeg plumbing shared by video_decoder and audio_decoder: one owner per FFmpeg object,
// FFmpeg's error text, opening an untrusted file (Note [Opening untrusted files] in
// ffmpeg_common.cpp) under a per-file deadline (Note [Sample deadline]), opening a decoder, and
// the send/receive decode loop. Only media/ includes this header; the rest of the pipeline never
// sees FFmpeg types.
//
// Thread-safety: free functions, no shared state apart from FFmpeg's global log level and largest
// allocation (Note [FFmpeg's largest allocation] in ffmpeg_common.cpp), which are
// set once (std::call_once) by the first open_input(). An InputFile or Deadline belongs to the
// one thread decoding that file.

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavcodec/bsf.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/frame.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "pipeline/core/media_source.hpp"

namespace precompute::ffmpeg {

// Every FFmpeg object is owned by one of these aliases; the deleter calls the matching free
// function. FFmpeg's `free(T**)` functions also null the pointer, which the owner does anyway.
template <class T, void (*Free)(T**)>
struct FreeAddress {
  void operator()(T* p) const { Free(&p); }
};
template <class T, void (*Free)(T*)>
struct FreeValue {
  void operator()(T* p) const { Free(p); }
};

using FormatContextPtr =
    std::unique_ptr<AVFormatContext, FreeAddress<AVFormatContext, avformat_close_input>>;
using CodecContextPtr =
    std::unique_ptr<AVCodecContext, FreeAddress<AVCodecContext, avcodec_free_context>>;
using FramePtr = std::unique_ptr<AVFrame, FreeAddress<AVFrame, av_frame_free>>;
using PacketPtr = std::unique_ptr<AVPacket, FreeAddress<AVPacket, av_packet_free>>;
using BsfContextPtr = std::unique_ptr<AVBSFContext, FreeAddress<AVBSFContext, av_bsf_free>>;
using CodecParametersPtr =
    std::unique_ptr<AVCodecParameters, FreeAddress<AVCodecParameters, avcodec_parameters_free>>;
using DictionaryPtr = std::unique_ptr<AVDictionary, FreeAddress<AVDictionary, av_dict_free>>;
using SwsContextPtr = std::unique_ptr<SwsContext, FreeValue<SwsContext, sws_freeContext>>;
using SwrContextPtr = std::unique_ptr<SwrContext, FreeAddress<SwrContext, swr_free>>;
// A custom AVIOContext and its buffer (FFmpeg may have replaced the buffer we gave it).
void free_io_context(AVIOContext* io);
using IoContextPtr = std::unique_ptr<AVIOContext, FreeValue<AVIOContext, free_io_context>>;

// A new frame or packet; throws std::bad_alloc when FFmpeg cannot allocate one.
FramePtr make_frame();
PacketPtr make_packet();

// A read loop's scope guard: unreferences the one packet the loop reuses at the end of each
// iteration, however the iteration ends.
class PacketUnref {
 public:
  explicit PacketUnref(AVPacket* packet) : packet_(packet) {}
  ~PacketUnref() { av_packet_unref(packet_); }
  PacketUnref(const PacketUnref&) = delete;
  PacketUnref& operator=(const PacketUnref&) = delete;

 private:
  AVPacket* packet_;
};

// FFmpeg's text for an AVERROR code.
std::string error_text(int errnum);

// Note [Sample deadline]
// Each decode of a file gets `run.sample_timeout_s` from its start, covering opening, probing,
// reading packets and decoding. FFmpeg polls it through the AVFormatContext's interrupt callback
// and our AVIOContext's reads; decode_stream also checks it between packets, so slow decoding
// counts too. What it cannot stop is one decoder call that never returns: only a process that
// can be killed (the run's supervisor) bounds that (docs/reliability.md). A stop request counts
// as the deadline passed, so that a stop does not wait for the decodes under way (Note [A stop
// drops the samples in flight] in pipeline/graph.cpp).
class Deadline {
 public:
  // `seconds` from now; > 0.
  explicit Deadline(double seconds);
  // Counted from the later of the start and the last resume of a stopped process (Note [Paused
  // runs] in pipeline/core/pause_clock.cpp): time spent stopped is not the file's.
  bool passed() const;
  // Seconds until it passes, on the same clock (0 once passed; `seconds` when it never does).
  double seconds_left() const;
  // Throws MediaError kTimeout naming `file`, `stage` and run.sample_timeout_s once passed.
  void check(const std::filesystem::path& file, const char* stage) const;

 private:
  int64_t started_ns_ = 0;  // steady clock
  int64_t limit_ns_ = 0;    // < 0: never
  double seconds_;
};

// Caps applied while opening one file.
struct InputLimits {
  int64_t max_file_bytes = 0;  // larger files: kTooLarge (run.max_file_bytes); 0: no cap
  int64_t max_pixels = 0;      // video pictures in the header over this: kTooLarge
                               // (video.max_pixels), and the probing decoders' cap; 0: none
};

// A media file opened by us and demuxed by FFmpeg through an AVIOContext that reads only that
// descriptor (Note [Opening untrusted files] in ffmpeg_common.cpp). Owns, in the order they are
// released: the AVFormatContext, the AVIOContext, the descriptor.
class InputFile {
 public:
  struct Source;  // the descriptor and what the read callbacks need

  InputFile(InputFile&&) noexcept;
  InputFile& operator=(InputFile&&) noexcept;
  ~InputFile();

  AVFormatContext* format() const { return format_.get(); }

 private:
  friend InputFile open_input(const MediaSource&, const InputLimits&, const Deadline&);
  InputFile();

  // Declared in release order reversed: members are destroyed bottom-up.
  std::unique_ptr<Source> source_;
  IoContextPtr io_;
  FormatContextPtr format_;
};

// Opens `source` for demuxing, a whole file or a tar member read only within its byte range,
// and reads its stream information, under `deadline` (which must outlive the InputFile). Throws
// MediaError: kMissing when the file does not exist; kUnreadable when it is not a readable
// regular file (a directory, FIFO, device or socket), is a URL or FFmpeg protocol rather than a
// local path, or is a tar that no longer holds the member's range (it changed since it was
// indexed); kTooLarge over limits.max_file_bytes (a member: its own size); kTimeout when the
// deadline passes; kDecodeError when FFmpeg cannot open or probe it (including containers we do
// not accept).
InputFile open_input(const MediaSource& source, const InputLimits& limits,
                     const Deadline& deadline);

// The stream of `type` FFmpeg picks as best. Throws MediaError kNoStream ("<file>: no video
// stream") when there is none; an attached picture (cover art) is not a video stream.
AVStream* find_stream(AVFormatContext* format, AVMediaType type, const std::filesystem::path& file);

// An opened decoder for `stream`. `threads` is the decoder's thread count (0: FFmpeg's choice);
// pictures well over `max_pixels` (its padded rows included) are refused by the decoder itself
// (0: FFmpeg's default cap).
// With `hw_device` (FFmpeg's CUDA device of an NVDEC session) the decoder asks for CUDA
// frames, decoded by NVDEC into device memory, one thread; where FFmpeg cannot set NVDEC up for
// the stream (codec, profile, bit depth, chroma format or size beyond the engine) the frames
// come out in a software format instead, decoded on the CPU (Note [NVDEC through FFmpeg] in
// nvdec.cpp).
// Throws MediaError kUnsupported when this build has no decoder for the codec, kDecodeError
// when it cannot be opened.
CodecContextPtr open_decoder(const AVStream* stream, int threads, int64_t max_pixels,
                             const std::filesystem::path& file, AVBufferRef* hw_device = nullptr);
// The same for a stream described by `parameters` in `time_base` (a decoder opened without the
// stream's extradata: Note [Keeping NVDEC decoders across files] in kept_decoder.cpp).
CodecContextPtr open_decoder(const AVCodecParameters& parameters, AVRational time_base,
                             int threads, int64_t max_pixels, const std::filesystem::path& file,
                             AVBufferRef* hw_device);

// Where `stream` starts, in its time base: its first frame shown, or its first sample played
// (Note [Sample clock]); AV_NOPTS_VALUE when the file does not say.
int64_t stream_start(const AVStream* stream);

// The stream's duration in its own time base, counted from its start: its own header's, else
// the container's, less the stream's start (Note [Stream durations] in ffmpeg_common.cpp);
// nullopt when neither has one, when FFmpeg only guessed it from the bit rate, or when the
// container's ends before the stream starts.
std::optional<int64_t> header_duration(const AVFormatContext* format, const AVStream* stream);

// Note [Sample clock]
// The timestamps of a sample's video frames and audio windows are seconds on one clock, the
// file's: from the earliest start of its video and audio streams, so that an audio track that
// starts 2.5 s into the video is stamped 2.5 s, where a player plays it, and a frame and a
// window with the same stamp are on screen and heard together. Where no stream states a start,
// nothing relates them, and each stream's own start is the origin. Only the stamps use this
// clock: what is sampled is decided relative to the stream's own start and duration.
// A stream starts where it is first seen or heard, which is not always where FFmpeg puts it, so
// the origin is worked out here rather than taken from the container's start_time:
// - An audio encoder's delay, the samples a decoder drops before its first one (Opus's pre-skip,
//   6.5 ms; AAC's priming), is not part of the stream: where the container marks it (Ogg's granule
//   positions, MP4's edit lists) FFmpeg's start_time is already past the first packet. FFmpeg 5.1
//   puts a Matroska stream's start (and an MP4 one's without an edit list) at its first packet, the
//   delay included, though the decoder drops it: the same Opus audio would start 7 ms before its
//   first sample in WebM and at it in Ogg, and every WebM window would be stamped 7 ms late. So
//   where the start is the first packet's (the first entry of the stream's index) and the stream
//   declares such a delay (initial_padding, from Matroska's CodecDelay or MP4's Opus header), the
//   start is moved past it: to the time FFmpeg gives the decoder's first sample, to the tick.
// - Only video and audio streams count: a subtitle or data stream does not start the file, nor
//   does a cover picture.
// The starts come from the headers alone, so that the video and the audio decoders of one file,
// each reading only its own stream, find the same origin. A decoder that drops more than the
// stream declares (FFmpeg's Vorbis decoder drops the samples of a Matroska stream's first
// packet, which Ogg counts before the start) stamps its first window that much later.
class SampleClock {
 public:
  // The clock of `format`, from its streams' starts as opened, before any seek.
  explicit SampleClock(const AVFormatContext* format);

  // `pts` (in `stream`'s time base) in seconds on this clock. `start` is where the caller counts
  // the stream's start from (stream_start(), or a stand-in when it has none). Computed as an
  // offset from `start`, so that the first frame of the earliest stream comes out as exactly 0.
  double seconds(const AVStream* stream, int64_t pts, int64_t start) const;

 private:
  int64_t origin_us_ = AV_NOPTS_VALUE;  // in AV_TIME_BASE; AV_NOPTS_VALUE: no stream said
};

// Seconds the calling thread has spent in the decode loop's FFmpeg calls and in the conversion,
// summed over its files: where a decoder's time goes (tools/bench/decode_bench --phases). A few
// clock reads per packet, always on.
struct DecodeTimes {
  double read = 0.0;     // av_read_frame
  double send = 0.0;     // avcodec_send_packet (and the packet filter)
  double receive = 0.0;  // avcodec_receive_frame
  double seek = 0.0;     // av_seek_frame and avcodec_flush_buffers
  double convert = 0.0;  // a decoded picture to the encoder's RGB
};
DecodeTimes& thread_decode_times();

// Adds the time from its construction to its destruction to `seconds`.
class TimeInto {
 public:
  explicit TimeInto(double& seconds) : seconds_(seconds), start_(std::chrono::steady_clock::now()) {}
  ~TimeInto() {
    seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  }
  TimeInto(const TimeInto&) = delete;
  TimeInto& operator=(const TimeInto&) = delete;

 private:
  double& seconds_;
  std::chrono::steady_clock::time_point start_;
};

// Whether an H.264 packet holds an IDR slice (NAL unit type 5), in either packaging: length-
// prefixed (MP4 and Matroska, the length's size in the avcC extradata of `parameters`) or Annex
// B start codes. Anything it cannot read counts as no IDR, which only costs a flush (Note
// [Seeking without a flush] in video_decoder.cpp). False for other codecs.
bool h264_packet_has_idr(const AVPacket& packet, const AVCodecParameters& parameters);

// Called with each decoded frame in presentation order. The callee may take the frame's buffers
// (av_frame_move_ref); whatever it leaves is unreferenced after it returns. Returning false
// stops decoding.
using FrameSink = std::function<bool(AVFrame* frame)>;

// Called before each packet is read, with the decode timestamp of the last packet of the stream
// read so far (AV_NOPTS_VALUE before the first): the caller may seek the demuxer there (and must
// then flush the decoder) to skip what it does not need (Note [Seeking to what is sampled] in
// video_decoder.cpp).
using BeforeRead = std::function<void(int64_t last_dts)>;

// Called with each packet of the stream before it goes to the decoder: the caller may set the
// decoder's skip_frame for it (Note [Skipping frames nobody keeps] in video_decoder.cpp).
using BeforeSend = std::function<void(const AVPacket& packet)>;

// Runs FFmpeg's send/receive state machine over `stream` from the current read position to the
// end (or until `sink` returns false). Corrupt packets and read errors in the middle are
// tolerated, counted and logged at debug level; when not a single frame could be decoded it
// throws MediaError kDecodeError naming the file and FFmpeg's last error, and kTimeout once
// `deadline` has passed. Returns the number of frames given to `sink`.
// With `filter`, a bitstream filter that makes one packet of each (the Annex B conversion of a
// kept decoder), packets pass through it on their way to the decoder; `before_send` still sees
// the packet as read.
// With `drained`, it is told whether the decoder was put in draining mode (the end of the input
// reached, a null packet sent): such a decoder takes no packets until it is flushed, while one
// that `sink` stopped early takes the next packets as they come (a kept decoder's next file).
int64_t decode_stream(AVFormatContext* format, const AVStream* stream, AVCodecContext* codec,
                      const FrameSink& sink, const Deadline& deadline,
                      const std::filesystem::path& file, const BeforeRead& before_read = {},
                      const BeforeSend& before_send = {}, AVBSFContext* filter = nullptr,
                      bool* drained = nullptr);

}  // namespace precompute::ffmpeg
