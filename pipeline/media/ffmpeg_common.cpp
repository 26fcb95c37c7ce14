#include "pipeline/media/ffmpeg_common.hpp"

extern "C" {
#include <libavutil/log.h>
#include <libavutil/mem.h>
#include <libavutil/pixdesc.h>
}

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cerrno>
#include <cstdarg>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <string_view>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/pause_clock.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/core/tar_header.hpp"

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

// Note [FFmpeg's largest allocation]
// Demuxers trust sizes in headers: a 1.7 KB WAV whose RIFF LIST chunk claimed 3.9 GB made the
// INFO reader allocate 1.8 GB per tag, 13 times, before reading a byte of it (the CI fuzzer's
// out-of-memory, tests/fuzz/regressions/media/wav_info_chunk_claims_gigabytes.wav). No limit of
// ours sees those allocations, so FFmpeg's own cap on one block (av_max_alloc, INT_MAX by
// default) is lowered to 1 GiB: well past the largest picture plane or packet a frame within
// video.max_pixels needs at its default (8192 x 8192 x 6 bytes of 16-bit RGB is 403 MB), so
// that such a header fails as an allocation error, a decode_error, instead.
constexpr size_t kMaxFfmpegAllocation = size_t{1} << 30;

void configure_ffmpeg_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    av_max_alloc(kMaxFfmpegAllocation);
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
// Media files come from users and the internet, so FFmpeg never opens a path itself. We stat the
// path first: a FIFO, device, socket or directory is refused before anything opens it (opening a
// FIFO blocks until a writer comes, reading /dev/zero never ends), and so is a file over
// run.max_file_bytes. A path that does not exist but reads as a URL or FFmpeg protocol
// ("http://...", "concat:a|b", "pipe:") is refused as such, with a message saying so rather than
// "no such file"; a file that exists is read whatever its name, colons included. We then open the
// file ourselves (O_NONBLOCK, so that a FIFO swapped in after the stat cannot block us either),
// check with fstat that the descriptor is the regular file we meant, and give FFmpeg an
// AVIOContext that reads only that descriptor, up to the size it had when opened. FFmpeg never
// parses the path as a URL, and its io_open callback refuses every other file or URL a demuxer
// asks for (playlists, references), on top of protocol_whitelist=file. Only the demuxers of the
// containers we support may probe it (an HLS playlist renamed .mp4 is otherwise probed and
// followed: docs/reliability.md). Probing is bounded in bytes, stream time and packets, and
// the probing decoders are held to the pixel cap, so that a hostile header cannot make them
// allocate huge pictures before our own checks run.
constexpr const char* kFormatWhitelist =
    "mov,mp4,m4a,3gp,3g2,mj2,"  // QuickTime / MP4 family (one demuxer)
    "matroska,webm,"            // Matroska / WebM (one demuxer)
    "avi,mpegts,mpeg,flv,asf,ogg,"
    "wav,w64,mp3,flac,aac,ac3,eac3,aiff,caf,wv,amr";
constexpr const char* kProbeSizeBytes = "10000000";
constexpr const char* kAnalyzeDurationMicroseconds = "10000000";
// Below FFmpeg's default of 2500: a stream that never yields codec parameters is given up after
// this many buffered packets (kProbeSizeBytes caps their bytes, this their count).
constexpr const char* kMaxProbePackets = "1000";
constexpr int kIoBufferBytes = 64 * 1024;

const char* file_type_name(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

// The URL scheme or FFmpeg protocol `name` starts with ("http" for "http:", "concat" for
// "concat:a.mp4|b.mp4"), or nullopt. A bare "scheme:" is what the manifest's path normalisation
// leaves of "scheme://host"; anything else must name one of FFmpeg's protocols.
std::optional<std::string> protocol_prefix(const std::string& name) {
  const size_t colon = name.find(':');
  if (colon == std::string::npos || colon == 0) return std::nullopt;
  std::string scheme = name.substr(0, colon);
  for (char& c : scheme) {
    const auto u = static_cast<unsigned char>(c);
    if (!std::isalnum(u) && c != '+' && c != '-' && c != '.') return std::nullopt;
    c = static_cast<char>(std::tolower(u));
  }
  if (!std::isalpha(static_cast<unsigned char>(scheme[0]))) return std::nullopt;
  if (colon + 1 == name.size()) return scheme;
  for (const int output : {0, 1}) {
    void* iterator = nullptr;
    while (const char* protocol = avio_enum_protocols(&iterator, output)) {
      if (scheme == protocol) return scheme;
    }
  }
  return std::nullopt;
}

// For a path that does not exist: the protocol its first missing component starts with. Only
// that component is judged, so an existing folder named "a:b" above it changes nothing.
std::optional<std::string> missing_path_protocol(const std::filesystem::path& file) {
  std::filesystem::path prefix;
  for (const auto& component : file) {
    prefix /= component;
    struct stat info {};
    if (::lstat(prefix.c_str(), &info) == 0) continue;
    return protocol_prefix(component.string());
  }
  return std::nullopt;
}

// Throws unless `info` describes a regular file within the size cap.
void check_regular_within_cap(const struct stat& info, const std::filesystem::path& file,
                              const InputLimits& limits) {
  PC_MEDIA_CHECK(S_ISREG(info.st_mode), FailureCategory::kUnreadable, file.string(), ": ",
                 file_type_name(info.st_mode), ", not a regular file; only media files are read");
  PC_MEDIA_CHECK(limits.max_file_bytes <= 0 || info.st_size <= limits.max_file_bytes,
                 FailureCategory::kTooLarge, file.string(), ": the file is ", info.st_size,
                 " bytes, over the limit of ", limits.max_file_bytes,
                 " bytes (run.max_file_bytes); raise it to read this file");
}

// Stats `file` without opening it; throws MediaError for anything FFmpeg must not be given.
void check_path(const std::filesystem::path& file, const InputLimits& limits) {
  struct stat info {};
  if (::stat(file.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT || error == ENOTDIR) {
      if (const auto protocol = missing_path_protocol(file)) {
        PC_MEDIA_THROW(FailureCategory::kUnreadable, file.string(), ": '", *protocol,
                       ":' is a URL or FFmpeg protocol, not a local file; precompute reads only "
                       "local files: download it and list its path");
      }
      PC_MEDIA_THROW(FailureCategory::kMissing, file.string(), ": no such file");
    }
    PC_MEDIA_THROW(FailureCategory::kUnreadable, file.string(),
                   ": cannot stat: ", std::strerror(error));
  }
  check_regular_within_cap(info, file, limits);
}

DictionaryPtr open_options() {
  AVDictionary* options = nullptr;
  av_dict_set(&options, "protocol_whitelist", "file", 0);
  av_dict_set(&options, "format_whitelist", kFormatWhitelist, 0);
  av_dict_set(&options, "probesize", kProbeSizeBytes, 0);
  av_dict_set(&options, "analyzeduration", kAnalyzeDurationMicroseconds, 0);
  av_dict_set(&options, "max_probe_packets", kMaxProbePackets, 0);
  return DictionaryPtr(options);
}

// The decoder's own cap counts rows padded to its stride alignment (up to 64 pixels wider),
// hence the headroom over the exact limit, which we check on headers and frames ourselves.
int64_t decoder_pixel_cap(int64_t max_pixels) {
  return max_pixels > INT64_MAX / 2 ? INT64_MAX : 2 * max_pixels;
}

int interrupted(void* opaque) { return static_cast<const Deadline*>(opaque)->passed() ? 1 : 0; }

int refuse_nested_open(AVFormatContext* format, AVIOContext** /*pb*/, const char* url,
                       int /*flags*/, AVDictionary** /*options*/) {
  av_log(format, AV_LOG_WARNING, "refused to open '%s' from inside a media file\n", url);
  return AVERROR(EPERM);
}

}  // namespace

// What the AVIOContext's callbacks read from. Reads go through pread at our own position, so
// nothing else shares the descriptor's offset, and stop at the size fstat gave at open: a file
// that grows while we read it cannot make us read without end. A tar member is the range
// [base, base + size) of its tar: positions are the member's own, so FFmpeg sees a file of the
// member's size and neither a seek nor a read can reach a byte outside it.
struct InputFile::Source {
  int fd = -1;
  int64_t base = 0;  // the member's first byte in the tar; 0 for a whole file
  int64_t size = 0;
  int64_t position = 0;
  const Deadline* deadline = nullptr;

  Source() = default;
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  ~Source() {
    if (fd >= 0) ::close(fd);
  }

  static int read(void* opaque, uint8_t* buffer, int size) {
    auto* self = static_cast<Source*>(opaque);
    if (self->deadline->passed()) return AVERROR_EXIT;
    const int64_t left = self->size - self->position;
    if (left <= 0) return AVERROR_EOF;
    const auto count = static_cast<size_t>(std::min<int64_t>(size, left));
    ssize_t got = 0;
    do {
      got = ::pread(self->fd, buffer, count, self->base + self->position);
    } while (got < 0 && errno == EINTR);
    if (got < 0) return AVERROR(errno);
    if (got == 0) return AVERROR_EOF;  // the file shrank since it was opened
    self->position += got;
    return static_cast<int>(got);
  }

  static int64_t seek(void* opaque, int64_t offset, int whence) {
    auto* self = static_cast<Source*>(opaque);
    int64_t target = 0;
    switch (whence & ~AVSEEK_FORCE) {
      case AVSEEK_SIZE:
        return self->size;
      case SEEK_SET:
        target = offset;
        break;
      case SEEK_CUR:
        target = self->position + offset;
        break;
      case SEEK_END:
        target = self->size + offset;
        break;
      default:
        return AVERROR(EINVAL);
    }
    if (target < 0) return AVERROR(EINVAL);
    self->position = target;
    return target;
  }
};

void free_io_context(AVIOContext* io) {
  av_freep(&io->buffer);
  avio_context_free(&io);
}

Deadline::Deadline(double seconds) : started_ns_(steady_now_ns()), seconds_(seconds) {
  // Beyond a century the deadline is "never"; converting it would overflow the clock.
  constexpr double kNeverSeconds = 100.0 * 365 * 24 * 3600;
  limit_ns_ = !(seconds < kNeverSeconds) ? -1 : static_cast<int64_t>(std::max(0.0, seconds) * 1e9);
}

bool Deadline::passed() const {
  // Note [A stop drops the samples in flight]; a run that drops its early decodes likewise.
  if (stop_requested() || decodes_cut_short()) return true;
  if (limit_ns_ < 0) return false;
  const int64_t from = std::max(started_ns_, last_resume_ns());
  return steady_now_ns() - from >= limit_ns_;
}

double Deadline::seconds_left() const {
  if (limit_ns_ < 0) return seconds_;
  const int64_t from = std::max(started_ns_, last_resume_ns());
  return static_cast<double>(std::max<int64_t>(0, limit_ns_ - (steady_now_ns() - from))) / 1e9;
}

void Deadline::check(const std::filesystem::path& file, const char* stage) const {
  // Never recorded: the graph drops a sample whose decode a stop cut short.
  PC_MEDIA_CHECK(!stop_requested() && !decodes_cut_short(), FailureCategory::kTimeout,
                 file.string(), ": ", stage, " cut short by a stop request or the run's end");
  PC_MEDIA_CHECK(!passed(), FailureCategory::kTimeout, file.string(), ": still ", stage,
                 " after the limit of ", seconds_,
                 " s per file (run.sample_timeout_s); raise it for very long or slow files");
}

InputFile::InputFile() = default;
InputFile::InputFile(InputFile&&) noexcept = default;
InputFile::~InputFile() = default;

InputFile& InputFile::operator=(InputFile&& other) noexcept {
  // Released in the destructor's order: the demuxer may still use its AVIOContext and
  // descriptor while it closes.
  format_ = std::move(other.format_);
  io_ = std::move(other.io_);
  source_ = std::move(other.source_);
  return *this;
}

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

InputFile open_input(const MediaSource& media, const InputLimits& limits,
                     const Deadline& deadline) {
  configure_ffmpeg_once();
  PC_MEDIA_CHECK(media.refusal.empty(), FailureCategory::kUnreadable, media.name(), ": ",
                 media.refusal);
  const std::filesystem::path& file = media.file;
  // A member's cap is its own size; the tar it is in may be as large as it likes.
  const InputLimits file_limits{media.is_member() ? 0 : limits.max_file_bytes, limits.max_pixels};
  check_path(file, file_limits);

  InputFile input;
  input.source_ = std::make_unique<InputFile::Source>();
  InputFile::Source& source = *input.source_;
  source.deadline = &deadline;
  source.fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (source.fd < 0) {
    const int error = errno;
    PC_MEDIA_CHECK(error != ENOENT, FailureCategory::kMissing, file.string(), ": no such file");
    PC_MEDIA_THROW(FailureCategory::kUnreadable, file.string(),
                   ": cannot open: ", std::strerror(error));
  }
  // The path may have been replaced since the stat: what counts is what we opened.
  struct stat info {};
  PC_MEDIA_CHECK(::fstat(source.fd, &info) == 0, FailureCategory::kUnreadable, file.string(),
                 ": cannot stat: ", std::strerror(errno));
  check_regular_within_cap(info, file, file_limits);
  source.size = info.st_size;
  if (media.is_member()) {
    PC_MEDIA_CHECK(media.offset >= 0 && media.size >= 0 &&
                       media.offset <= info.st_size - media.size,
                   FailureCategory::kUnreadable, media.name(), ": the member's bytes ",
                   media.offset, "+", media.size, " lie past the end of the tar (", info.st_size,
                   " bytes): the tar changed since it was indexed; run again on the tar as it is");
    PC_MEDIA_CHECK(limits.max_file_bytes <= 0 || media.size <= limits.max_file_bytes,
                   FailureCategory::kTooLarge, media.name(), ": the member is ", media.size,
                   " bytes, over the limit of ", limits.max_file_bytes,
                   " bytes (run.max_file_bytes); raise it to read this member");
    // Note [A member's header is read again before its bytes] in pipeline/core/tar_header.cpp.
    std::array<unsigned char, kTarBlock> header{};
    std::string mismatch = "no tar header precedes its bytes";
    if (media.offset >= kTarBlock) {
      const ssize_t got =
          ::pread(source.fd, header.data(), header.size(), media.offset - kTarBlock);
      mismatch = got == kTarBlock ? member_header_mismatch(header.data(), media.member, media.size)
                 : got < 0 ? std::string("its header cannot be read: ") + std::strerror(errno)
                           : "its header cannot be read";
    }
    PC_MEDIA_CHECK(mismatch.empty(), FailureCategory::kUnreadable, media.name(), ": ", mismatch,
                   ": the tar changed since it was indexed; run again on the tar as it is");
    source.base = media.offset;
    source.size = media.size;
  }
  const std::filesystem::path name(media.name());  // for messages; its extension guides probing

  auto* buffer = static_cast<unsigned char*>(av_malloc(kIoBufferBytes));
  if (buffer == nullptr) throw std::bad_alloc();
  input.io_.reset(avio_alloc_context(buffer, kIoBufferBytes, /*write_flag=*/0, &source,
                                     &InputFile::Source::read, nullptr, &InputFile::Source::seek));
  if (!input.io_) {
    av_free(buffer);
    throw std::bad_alloc();
  }

  // avformat_open_input frees the context itself when it fails, so it opens into a raw pointer
  // that an owner takes only on success. AVFMT_FLAG_CUSTOM_IO is set before the call: FFmpeg
  // sets it too, but only after steps that can fail, and without it a failure closes our pb.
  AVFormatContext* raw = avformat_alloc_context();
  if (raw == nullptr) throw std::bad_alloc();
  raw->pb = input.io_.get();
  raw->flags |= AVFMT_FLAG_CUSTOM_IO;
  raw->interrupt_callback = AVIOInterruptCB{&interrupted, const_cast<Deadline*>(&deadline)};
  raw->io_open = &refuse_nested_open;

  DictionaryPtr options = open_options();
  AVDictionary* unused_options = options.release();
  const int opened = avformat_open_input(&raw, name.c_str(), nullptr, &unused_options);
  options.reset(unused_options);  // FFmpeg hands back the options it did not use
  if (opened < 0) deadline.check(name, "opening");
  PC_MEDIA_CHECK(opened >= 0, FailureCategory::kDecodeError, name.string(),
                 ": cannot open (avformat_open_input): ", error_text(opened));
  input.format_.reset(raw);

  // Checked on the container's header, before probing: a probing decoder that refuses a
  // picture leaves its stream 0x0, which would hide the reason. Streams whose size only
  // probing finds (MPEG-TS) are checked by the caller.
  const AVFormatContext* format = input.format_.get();
  for (unsigned i = 0; limits.max_pixels > 0 && i < format->nb_streams; ++i) {
    const AVCodecParameters* codecpar = format->streams[i]->codecpar;
    if (codecpar->codec_type != AVMEDIA_TYPE_VIDEO) continue;
    PC_MEDIA_CHECK(int64_t{codecpar->width} * codecpar->height <= limits.max_pixels,
                   FailureCategory::kTooLarge, name.string(), ": the picture is ", codecpar->width,
                   "x", codecpar->height, ", over the limit of ", limits.max_pixels,
                   " pixels (video.max_pixels)");
  }

  // One option set per stream, read by the decoders avformat_find_stream_info opens; it
  // replaces each with the options it did not use, which we free. Their cap has the same
  // headroom as open_decoder's.
  std::vector<AVDictionary*> stream_options(format->nb_streams, nullptr);
  if (limits.max_pixels > 0) {
    for (AVDictionary*& stream : stream_options) {
      av_dict_set_int(&stream, "max_pixels", decoder_pixel_cap(limits.max_pixels), 0);
    }
  }
  const int probed = avformat_find_stream_info(
      input.format_.get(), stream_options.empty() ? nullptr : stream_options.data());
  for (AVDictionary*& stream : stream_options) av_dict_free(&stream);
  if (probed < 0) deadline.check(name, "reading stream information");
  PC_MEDIA_CHECK(
      probed >= 0, FailureCategory::kDecodeError, name.string(),
      ": cannot read stream information (avformat_find_stream_info): ", error_text(probed));
  return input;
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

namespace {

// get_format of a decoder with a CUDA device: CUDA frames when FFmpeg offers them. FFmpeg drops
// CUDA from the list and asks again when NVDEC cannot take the stream; then the first software
// format, FFmpeg's own preference.
AVPixelFormat pick_cuda_format(AVCodecContext* /*codec*/, const AVPixelFormat* formats) {
  for (const AVPixelFormat* f = formats; *f != AV_PIX_FMT_NONE; ++f) {
    if (*f == AV_PIX_FMT_CUDA) return *f;
  }
  for (const AVPixelFormat* f = formats; *f != AV_PIX_FMT_NONE; ++f) {
    const AVPixFmtDescriptor* desc = av_pix_fmt_desc_get(*f);
    if (desc != nullptr && !(desc->flags & AV_PIX_FMT_FLAG_HWACCEL)) return *f;
  }
  return AV_PIX_FMT_NONE;
}

}  // namespace

CodecContextPtr open_decoder(const AVStream* stream, int threads, int64_t max_pixels,
                             const std::filesystem::path& file, AVBufferRef* hw_device) {
  return open_decoder(*stream->codecpar, stream->time_base, threads, max_pixels, file, hw_device);
}

CodecContextPtr open_decoder(const AVCodecParameters& parameters, AVRational time_base,
                             int threads, int64_t max_pixels, const std::filesystem::path& file,
                             AVBufferRef* hw_device) {
  max_pixels = max_pixels > 0 ? decoder_pixel_cap(max_pixels) : 0;
  const AVCodecID codec_id = parameters.codec_id;
  const AVCodec* decoder = avcodec_find_decoder(codec_id);
  PC_MEDIA_CHECK(decoder != nullptr, FailureCategory::kUnsupported, file.string(),
                 ": this FFmpeg build has no decoder for codec ", avcodec_get_name(codec_id));

  CodecContextPtr codec(avcodec_alloc_context3(decoder));
  if (!codec) throw std::bad_alloc();
  const int copied = avcodec_parameters_to_context(codec.get(), &parameters);
  PC_MEDIA_CHECK(copied >= 0, FailureCategory::kDecodeError, file.string(), ": cannot set up the ",
                 decoder->name, " decoder (avcodec_parameters_to_context): ", error_text(copied));
  codec->pkt_timebase = time_base;
  codec->thread_count = threads;
  if (max_pixels > 0) codec->max_pixels = max_pixels;
  if (hw_device != nullptr) {
    codec->hw_device_ctx = av_buffer_ref(hw_device);
    if (codec->hw_device_ctx == nullptr) throw std::bad_alloc();
    codec->get_format = pick_cuda_format;
    // NVDEC decodes; more CPU threads would only hold more pictures.
    codec->thread_count = 1;
    // The frame sink holds the previous picture while the next is mapped.
    codec->extra_hw_frames = 2;
  }
  const int opened = avcodec_open2(codec.get(), decoder, nullptr);
  PC_MEDIA_CHECK(opened >= 0, FailureCategory::kDecodeError, file.string(), ": cannot open the ",
                 decoder->name, " decoder (avcodec_open2): ", error_text(opened));
  return codec;
}

int64_t stream_start(const AVStream* stream) {
  int64_t start = stream->start_time;
  const AVCodecParameters& parameters = *stream->codecpar;
  if (start == AV_NOPTS_VALUE || parameters.codec_type != AVMEDIA_TYPE_AUDIO ||
      parameters.initial_padding <= 0 || parameters.sample_rate <= 0) {
    return start;
  }
  // Note [Sample clock]: a start at the first packet still holds the encoder's delay. The
  // index is only read here (the getter takes a mutable stream).
  const AVIndexEntry* first = avformat_index_get_entry(const_cast<AVStream*>(stream), 0);
  if (first == nullptr || first->timestamp != start) return start;
  // Rounded as FFmpeg rounds the decoder's first frame's time past the samples it drops.
  return start + av_rescale_q(parameters.initial_padding, AVRational{1, parameters.sample_rate},
                              stream->time_base);
}

// Note [Stream durations]
// What is sampled is a stream's own span, from its start (Note [Sample clock] in
// ffmpeg_common.hpp) to its end, so its duration must count from its start too. A container
// with a duration per stream gives it so (MP4's tracks; Ogg and MPEG-TS, whose durations FFmpeg
// measures from the streams' last timestamps). Others give only the container's, and what that
// counts from depends on the container:
// - Matroska/WebM's is its Segment's, which is where the Segment ends on its timeline from time
//   0, the origin of its streams' timestamps, not its length from its first frame: a Matroska
//   file whose only stream starts 1.5 s in and lasts 4 s says 5.5 s. Taken as the stream's
//   duration, that would sample 5.5 s from the stream's start: the wrong frames for num_frames,
//   and for fps 2 three targets past the end, all given the last frame. So the stream's
//   duration is the Segment's end less the stream's start.
// - Any other is taken as FFmpeg counts the durations it makes from its streams': from the
//   container's start, its earliest stream's. FLV's (its metadata's) runs from its first
//   packet's decode time, at or before that start, as does one that runs from time 0 in a file
//   that starts at or after 0: read this way, either puts the end a little later than it is,
//   which gives a few more targets the last frame, but leaves no content out. (Read from time
//   0, the FLV metadata of a file whose timestamps start 1.5 s in would cut its last 1.5 s.)
// The container's end is the latest end of its streams: a video in Matroska whose audio goes on
// past it is sampled up to the audio's end, its last frame taking the targets past its own. A
// duration FFmpeg only guessed from the bit rate is not used at all; the caller measures.
std::optional<int64_t> header_duration(const AVFormatContext* format, const AVStream* stream) {
  // A duration guessed from file size / bit rate can be far off (FFmpeg itself warns that it
  // "may be inaccurate"); the caller measures instead.
  if (format->duration_estimation_method == AVFMT_DURATION_FROM_BITRATE) return std::nullopt;
  if (stream->duration != AV_NOPTS_VALUE && stream->duration > 0) return stream->duration;
  if (format->duration == AV_NOPTS_VALUE || format->duration <= 0) return std::nullopt;
  const bool from_time_zero =
      std::string_view(format->iformat->name).find("matroska") != std::string_view::npos;
  int64_t end_us = format->duration;
  if (!from_time_zero && format->start_time != AV_NOPTS_VALUE) end_us += format->start_time;
  int64_t start = stream_start(stream);
  if (start == AV_NOPTS_VALUE) {
    // Nothing says where this stream starts; the container's first stream is the best guess.
    start = format->start_time != AV_NOPTS_VALUE
                ? av_rescale_q(format->start_time, AV_TIME_BASE_Q, stream->time_base)
                : 0;
  }
  const int64_t duration = av_rescale_q(end_us, AV_TIME_BASE_Q, stream->time_base) - start;
  if (duration <= 0) return std::nullopt;
  return duration;
}

SampleClock::SampleClock(const AVFormatContext* format) {
  for (unsigned i = 0; i < format->nb_streams; ++i) {
    const AVStream* stream = format->streams[i];
    const AVMediaType type = stream->codecpar->codec_type;
    if (type != AVMEDIA_TYPE_VIDEO && type != AVMEDIA_TYPE_AUDIO) continue;
    if (stream->disposition & AV_DISPOSITION_ATTACHED_PIC) continue;
    const int64_t start = stream_start(stream);
    if (start == AV_NOPTS_VALUE) continue;
    // Whole microseconds, as FFmpeg counts the container's start: exactly 0 below for the
    // stream that starts first.
    const int64_t start_us = av_rescale_q(start, stream->time_base, AV_TIME_BASE_Q);
    if (origin_us_ == AV_NOPTS_VALUE || start_us < origin_us_) origin_us_ = start_us;
  }
}

double SampleClock::seconds(const AVStream* stream, int64_t pts, int64_t start) const {
  double seconds = static_cast<double>(pts - start) * av_q2d(stream->time_base);
  if (origin_us_ != AV_NOPTS_VALUE) {
    const int64_t offset_us = av_rescale_q(start, stream->time_base, AV_TIME_BASE_Q) - origin_us_;
    seconds += static_cast<double>(offset_us) / AV_TIME_BASE;
  }
  return seconds;
}

DecodeTimes& thread_decode_times() {
  thread_local DecodeTimes times;
  return times;
}

int64_t decode_stream(AVFormatContext* format, const AVStream* stream, AVCodecContext* codec,
                      const FrameSink& sink, const Deadline& deadline,
                      const std::filesystem::path& file, const BeforeRead& before_read,
                      const BeforeSend& before_send, AVBSFContext* filter, bool* drained) {
  if (drained != nullptr) *drained = false;
  int64_t last_dts = AV_NOPTS_VALUE;
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
  DecodeTimes& times = thread_decode_times();
  const auto receive = [&](bool draining) -> bool {
    int drain_errors = 0;
    while (true) {
      int received = 0;
      {
        const TimeInto timed(times.receive);
        received = avcodec_receive_frame(codec, frame.get());
      }
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
    deadline.check(file, "decoding");
    if (before_read) before_read(last_dts);
    int read = 0;
    {
      const TimeInto timed(times.read);
      read = av_read_frame(format, packet.get());
    }
    const PacketUnref unref(packet.get());
    // Reads fail once the deadline passes, and a demuxer may report that as the end of the
    // file: either is a timeout, not the end or damage.
    if (read < 0) deadline.check(file, "reading packets");
    if (read == AVERROR_EOF) break;
    if (read < 0) {
      // A damaged or truncated file: decode what came before, as the ffmpeg CLI does.
      tolerate("av_read_frame", read);
      break;
    }
    if (packet->stream_index != stream->index) continue;
    if (packet->dts != AV_NOPTS_VALUE) last_dts = packet->dts;
    if (before_send) before_send(*packet);
    if (filter != nullptr) {
      // One packet in, one out (the Annex B conversion); a packet it refuses is a corrupt one.
      std::optional<TimeInto> timed(times.send);
      const int filtered = av_bsf_send_packet(filter, packet.get());
      if (filtered < 0) {
        tolerate("av_bsf_send_packet", filtered);
        continue;
      }
      bool more = true;
      while (more) {
        const int out = av_bsf_receive_packet(filter, packet.get());
        if (out == AVERROR(EAGAIN) || out == AVERROR_EOF) break;
        if (out < 0) {
          tolerate("av_bsf_receive_packet", out);
          break;
        }
        const PacketUnref unref_filtered(packet.get());
        const int sent = avcodec_send_packet(codec, packet.get());
        if (sent < 0) {
          tolerate("avcodec_send_packet", sent);
          continue;
        }
        timed.reset();
        more = receive(/*draining=*/false);
      }
      if (!more) return frames;
      continue;
    }
    // Every packet is followed by receiving all the frames it made, so the decoder never answers
    // EAGAIN here; other errors are a corrupt packet, skipped.
    int sent = 0;
    {
      const TimeInto timed(times.send);
      sent = avcodec_send_packet(codec, packet.get());
    }
    if (sent < 0) {
      tolerate("avcodec_send_packet", sent);
      continue;
    }
    if (!receive(/*draining=*/false)) return frames;
  }

  // End of input: a null packet puts the decoder in draining mode to return its delayed frames;
  // receive then ends with AVERROR_EOF, the normal end.
  const int flushed = avcodec_send_packet(codec, nullptr);
  if (drained != nullptr) *drained = true;
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

bool h264_packet_has_idr(const AVPacket& packet, const AVCodecParameters& parameters) {
  if (parameters.codec_id != AV_CODEC_ID_H264 || packet.data == nullptr || packet.size <= 0) {
    return false;
  }
  const uint8_t* data = packet.data;
  const size_t size = static_cast<size_t>(packet.size);
  constexpr int kIdr = 5;
  const bool avcc = parameters.extradata_size >= 7 && parameters.extradata[0] == 1;
  if (avcc) {
    const size_t length_size = static_cast<size_t>((parameters.extradata[4] & 3) + 1);
    size_t at = 0;
    while (at + length_size < size) {
      size_t length = 0;
      for (size_t i = 0; i < length_size; ++i) length = (length << 8) | data[at + i];
      at += length_size;
      if (length == 0 || length > size - at) return false;
      if ((data[at] & 0x1F) == kIdr) return true;
      at += length;
    }
    return false;
  }
  for (size_t at = 0; at + 3 < size; ++at) {
    if (data[at] == 0 && data[at + 1] == 0 && data[at + 2] == 1 && (data[at + 3] & 0x1F) == kIdr) {
      return true;
    }
  }
  return false;
}

}  // namespace precompute::ffmpeg
