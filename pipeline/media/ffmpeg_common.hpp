#pragma once
// The FFmpeg plumbing shared by video_decoder and audio_decoder: one owner per FFmpeg object,
// FFmpeg's error text, opening an untrusted file (Note [Opening untrusted files] in
// ffmpeg_common.cpp), opening a decoder, and the send/receive decode loop. Only media/ includes
// this header; the rest of the pipeline never sees FFmpeg types.
//
// Thread-safety: free functions, no shared state apart from FFmpeg's global log level, which is
// set once (std::call_once) by the first open_input().

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/dict.h>
#include <libavutil/frame.h>
#include <libswresample/swresample.h>
#include <libswscale/swscale.h>
}

#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <optional>
#include <string>

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
using DictionaryPtr = std::unique_ptr<AVDictionary, FreeAddress<AVDictionary, av_dict_free>>;
using SwsContextPtr = std::unique_ptr<SwsContext, FreeValue<SwsContext, sws_freeContext>>;
using SwrContextPtr = std::unique_ptr<SwrContext, FreeAddress<SwrContext, swr_free>>;

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

// Opens `file` for demuxing and reads its stream information. Throws MediaError: kMissing when
// it does not exist, kUnreadable when it is not a readable regular file, kDecodeError when
// FFmpeg cannot open or probe it (including containers we do not accept).
FormatContextPtr open_input(const std::filesystem::path& file);

// The stream of `type` FFmpeg picks as best. Throws MediaError kNoStream ("<file>: no video
// stream") when there is none; an attached picture (cover art) is not a video stream.
AVStream* find_stream(AVFormatContext* format, AVMediaType type, const std::filesystem::path& file);

// An opened decoder for `stream`. `threads` is the decoder's thread count (0: FFmpeg's choice);
// pictures over `max_pixels` are refused by the decoder itself (0: FFmpeg's default cap).
// Throws MediaError kUnsupported when this build has no decoder for the codec, kDecodeError
// when it cannot be opened.
CodecContextPtr open_decoder(const AVStream* stream, int threads, int64_t max_pixels,
                             const std::filesystem::path& file);

// The stream's duration in its own time base, from the stream's header, else the container's;
// nullopt when neither has one, or when FFmpeg only guessed it from the bit rate.
std::optional<int64_t> header_duration(const AVFormatContext* format, const AVStream* stream);

// Called with each decoded frame in presentation order. The callee may take the frame's buffers
// (av_frame_move_ref); whatever it leaves is unreferenced after it returns. Returning false
// stops decoding.
using FrameSink = std::function<bool(AVFrame* frame)>;

// Runs FFmpeg's send/receive state machine over `stream` from the current read position to the
// end (or until `sink` returns false). Corrupt packets and read errors in the middle are
// tolerated, counted and logged at debug level; when not a single frame could be decoded it
// throws MediaError kDecodeError naming the file and FFmpeg's last error. Returns the number of
// frames given to `sink`.
int64_t decode_stream(AVFormatContext* format, const AVStream* stream, AVCodecContext* codec,
                      const FrameSink& sink, const std::filesystem::path& file);

}  // namespace precompute::ffmpeg
