#include "pipeline/media/ffmpeg_common.hpp"

extern "C" {
#include <libavutil/log.h>
}

#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>

#include "pipeline/core/error.hpp"

namespace precompute::ffmpeg {
namespace {

// Note [FFmpeg log level]
// FFmpeg logs from every thread, to stderr by default; over thousands of files that would bury
// our own log, and what matters of it (why a file failed) is already in the failure record. So
// FFmpeg's messages go through our logger at debug level (`--log-level debug` shows them, with
// the component that said them). PRECOMPUTE_FFMPEG_LOG=quiet|error|warning|info|debug sets which
// of FFmpeg's messages are passed on (default: warning). The callback and level are
// process-global, so they are set exactly once, before our first FFmpeg call.
void log_to_spdlog(void* component, int level, const char* format, va_list args) {
  if (level > av_log_get_level()) return;
  char line[1024];
  int print_prefix = 1;
  av_log_format_line2(component, level, format, args, line, sizeof(line), &print_prefix);
  std::string_view text(line);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.remove_suffix(1);
  if (!text.empty()) spdlog::debug("ffmpeg: {}", text);
}

void set_log_level_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    int level = AV_LOG_WARNING;
    if (const char* value = std::getenv("PRECOMPUTE_FFMPEG_LOG")) {
      const std::string_view name(value);
      if (name == "quiet") {
        level = AV_LOG_QUIET;
      } else if (name == "error") {
        level = AV_LOG_ERROR;
      } else if (name == "warning") {
        level = AV_LOG_WARNING;
      } else if (name == "info") {
        level = AV_LOG_INFO;
      } else if (name == "debug") {
        level = AV_LOG_DEBUG;
      } else {
        spdlog::warn(
            "PRECOMPUTE_FFMPEG_LOG={} is not one of quiet, error, warning, info, debug; "
            "using warning",
            name);
      }
    }
    av_log_set_level(level);
    av_log_set_callback(&log_to_spdlog);
  });
}

// Note [Opening untrusted files]
// Media files come from users and the internet. We check the path ourselves before FFmpeg sees
// it: a FIFO or device would block FFmpeg forever, and a directory gives an unhelpful error.
// FFmpeg then opens it through the `file:` protocol only (a name with ':' is never taken for a
// protocol, and a playlist inside cannot make FFmpeg open other files or URLs), and only with the
// demuxers of the containers we support (an HLS playlist renamed .mp4 is otherwise probed and
// followed, see RELIABILITY.md). Probing is bounded so that a hostile file cannot make it read
// without end.
constexpr const char* kFormatWhitelist =
    "mov,mp4,m4a,3gp,3g2,mj2,"  // QuickTime / MP4 family (one demuxer)
    "matroska,webm,"            // Matroska / WebM (one demuxer)
    "avi,mpegts,mpeg,flv,asf,ogg,"
    "wav,w64,mp3,flac,aac,ac3,eac3,aiff,caf,wv,amr";
constexpr const char* kProbeSizeBytes = "10000000";
constexpr const char* kAnalyzeDurationMicroseconds = "10000000";

void check_regular_readable(const std::filesystem::path& file) {
  struct stat info {};
  if (::stat(file.c_str(), &info) != 0) {
    const int error = errno;
    PC_MEDIA_CHECK(error != ENOENT && error != ENOTDIR, FailureCategory::kMissing, file.string(),
                   ": no such file");
    PC_MEDIA_THROW(FailureCategory::kUnreadable, file.string(),
                   ": cannot stat: ", std::strerror(error));
  }
  PC_MEDIA_CHECK(S_ISREG(info.st_mode), FailureCategory::kUnreadable, file.string(),
                 ": not a regular file (a directory, FIFO or device); only media files are read");
  PC_MEDIA_CHECK(::access(file.c_str(), R_OK) == 0, FailureCategory::kUnreadable, file.string(),
                 ": cannot read: ", std::strerror(errno));
}

DictionaryPtr open_options() {
  AVDictionary* options = nullptr;
  av_dict_set(&options, "protocol_whitelist", "file", 0);
  av_dict_set(&options, "format_whitelist", kFormatWhitelist, 0);
  av_dict_set(&options, "probesize", kProbeSizeBytes, 0);
  av_dict_set(&options, "analyzeduration", kAnalyzeDurationMicroseconds, 0);
  return DictionaryPtr(options);
}

}  // namespace

FramePtr make_frame() {
  FramePtr frame(av_frame_alloc());
  if (!frame) throw std::bad_alloc();
  return frame;
}

PacketPtr make_packet() {
  PacketPtr packet(av_packet_alloc());
  if (!packet) throw std::bad_alloc();
  return packet;
}

std::string error_text(int errnum) {
  char buffer[AV_ERROR_MAX_STRING_SIZE] = {};
  if (av_strerror(errnum, buffer, sizeof(buffer)) < 0) {
    return "FFmpeg error " + std::to_string(errnum);
  }
  return buffer;
}

FormatContextPtr open_input(const std::filesystem::path& file) {
  set_log_level_once();
  check_regular_readable(file);

  DictionaryPtr options = open_options();
  AVDictionary* unused_options = options.release();
  // avformat_open_input frees the context itself when it fails, so it opens into a raw pointer
  // that an owner takes only on success.
  AVFormatContext* raw = nullptr;
  const std::string url = "file:" + file.string();
  const int opened = avformat_open_input(&raw, url.c_str(), nullptr, &unused_options);
  options.reset(unused_options);  // FFmpeg hands back the options it did not use
  PC_MEDIA_CHECK(opened >= 0, FailureCategory::kDecodeError, file.string(),
                 ": cannot open (avformat_open_input): ", error_text(opened));
  FormatContextPtr format(raw);

  const int probed = avformat_find_stream_info(format.get(), nullptr);
  PC_MEDIA_CHECK(
      probed >= 0, FailureCategory::kDecodeError, file.string(),
      ": cannot read stream information (avformat_find_stream_info): ", error_text(probed));
  return format;
}

AVStream* find_stream(AVFormatContext* format, AVMediaType type,
                      const std::filesystem::path& file) {
  const char* kind = av_get_media_type_string(type);
  const int index = av_find_best_stream(format, type, -1, -1, nullptr, 0);
  PC_MEDIA_CHECK(index != AVERROR_STREAM_NOT_FOUND, FailureCategory::kNoStream, file.string(),
                 ": no ", kind, " stream");
  PC_MEDIA_CHECK(index >= 0, FailureCategory::kDecodeError, file.string(), ": cannot pick the ",
                 kind, " stream (av_find_best_stream): ", error_text(index));
  AVStream* stream = format->streams[index];
  // An audio file's cover art is a one-picture video stream; it is not a video.
  PC_MEDIA_CHECK(!(stream->disposition & AV_DISPOSITION_ATTACHED_PIC), FailureCategory::kNoStream,
                 file.string(), ": no ", kind, " stream (only an attached picture)");
  return stream;
}

CodecContextPtr open_decoder(const AVStream* stream, int threads, int64_t max_pixels,
                             const std::filesystem::path& file) {
  const AVCodecID codec_id = stream->codecpar->codec_id;
  const AVCodec* decoder = avcodec_find_decoder(codec_id);
  PC_MEDIA_CHECK(decoder != nullptr, FailureCategory::kUnsupported, file.string(),
                 ": this FFmpeg build has no decoder for codec ", avcodec_get_name(codec_id));

  CodecContextPtr codec(avcodec_alloc_context3(decoder));
  if (!codec) throw std::bad_alloc();
  const int copied = avcodec_parameters_to_context(codec.get(), stream->codecpar);
  PC_MEDIA_CHECK(copied >= 0, FailureCategory::kDecodeError, file.string(), ": cannot set up the ",
                 decoder->name, " decoder (avcodec_parameters_to_context): ", error_text(copied));
  codec->pkt_timebase = stream->time_base;
  codec->thread_count = threads;
  if (max_pixels > 0) codec->max_pixels = max_pixels;
  const int opened = avcodec_open2(codec.get(), decoder, nullptr);
  PC_MEDIA_CHECK(opened >= 0, FailureCategory::kDecodeError, file.string(), ": cannot open the ",
                 decoder->name, " decoder (avcodec_open2): ", error_text(opened));
  return codec;
}

std::optional<int64_t> header_duration(const AVFormatContext* format, const AVStream* stream) {
  // A duration guessed from file size / bit rate can be far off (FFmpeg itself warns that it
  // "may be inaccurate"); the caller measures instead.
  if (format->duration_estimation_method == AVFMT_DURATION_FROM_BITRATE) return std::nullopt;
  if (stream->duration != AV_NOPTS_VALUE && stream->duration > 0) return stream->duration;
  if (format->duration != AV_NOPTS_VALUE && format->duration > 0) {
    return av_rescale_q(format->duration, AV_TIME_BASE_Q, stream->time_base);
  }
  return std::nullopt;
}

int64_t decode_stream(AVFormatContext* format, const AVStream* stream, AVCodecContext* codec,
                      const FrameSink& sink, const std::filesystem::path& file) {
  PacketPtr packet = make_packet();
  FramePtr frame = make_frame();
  int64_t frames = 0;
  int64_t errors = 0;
  int last_error = 0;
  const auto tolerate = [&](const char* operation, int error) {
    ++errors;
    last_error = error;
    spdlog::debug("{}: {} failed, going on: {}", file.string(), operation, error_text(error));
  };

  // Takes every frame the decoder has ready. An error here belongs to one frame: while packets
  // remain we go and feed the next one; while draining we keep receiving, but a decoder that
  // fails on every call must not hold us forever.
  constexpr int kMaxDrainErrors = 16;
  const auto receive = [&](bool draining) -> bool {
    int drain_errors = 0;
    while (true) {
      const int received = avcodec_receive_frame(codec, frame.get());
      if (received == AVERROR(EAGAIN) || received == AVERROR_EOF) return true;
      if (received < 0) {
        tolerate("avcodec_receive_frame", received);
        if (!draining || ++drain_errors >= kMaxDrainErrors) return true;
        continue;
      }
      ++frames;
      const bool more = sink(frame.get());
      av_frame_unref(frame.get());
      if (!more) return false;
    }
  };

  while (true) {
    const int read = av_read_frame(format, packet.get());
    const PacketUnref unref(packet.get());
    if (read == AVERROR_EOF) break;
    if (read < 0) {
      // A damaged or truncated file: decode what came before, as the ffmpeg CLI does.
      tolerate("av_read_frame", read);
      break;
    }
    if (packet->stream_index != stream->index) continue;
    // Every packet is followed by receiving all the frames it made, so the decoder never answers
    // EAGAIN here; other errors are a corrupt packet, skipped.
    const int sent = avcodec_send_packet(codec, packet.get());
    if (sent < 0) {
      tolerate("avcodec_send_packet", sent);
      continue;
    }
    if (!receive(/*draining=*/false)) return frames;
  }

  // End of input: a null packet puts the decoder in draining mode to return its delayed frames;
  // receive then ends with AVERROR_EOF, the normal end.
  const int flushed = avcodec_send_packet(codec, nullptr);
  if (flushed < 0) {
    tolerate("avcodec_send_packet (flush)", flushed);
  } else {
    receive(/*draining=*/true);
  }

  PC_MEDIA_CHECK(frames > 0, FailureCategory::kDecodeError, file.string(),
                 ": no frame could be decoded", last_error != 0 ? ": " : "",
                 last_error != 0 ? error_text(last_error) : std::string());
  if (errors > 0) {
    spdlog::debug("{}: decoded {} frames, {} decode errors tolerated", file.string(), frames,
                  errors);
  }
  return frames;
}

}  // namespace precompute::ffmpeg
