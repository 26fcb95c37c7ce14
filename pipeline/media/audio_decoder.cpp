#include "pipeline/media/audio_decoder.hpp"

extern "C" {
#include <libavutil/channel_layout.h>
#include <libavutil/opt.h>
}

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/media/ffmpeg_common.hpp"

namespace precompute {
namespace {

// The highest audio sample rate in use (DXD, 8x 96 kHz); anything above is a broken header.
constexpr int kMaxInputSampleRate = 768000;

using ffmpeg::CodecContextPtr;
using ffmpeg::SwrContextPtr;

// Downmixes and resamples decoded frames to mono float samples at the output rate. The
// libswresample context is made from the first frame and made again when a frame arrives with
// another sample format, rate or channel layout (streams may change parameters mid-way).
class MonoResampler {
 public:
  MonoResampler(int rate, const std::filesystem::path& file) : rate_(rate), file_(file) {}
  ~MonoResampler() { av_channel_layout_uninit(&layout_); }
  MonoResampler(const MonoResampler&) = delete;
  MonoResampler& operator=(const MonoResampler&) = delete;

  // Appends the samples `frame` yields to `out`.
  void push(const AVFrame& frame, std::vector<float>& out) {
    const auto format = static_cast<AVSampleFormat>(frame.format);
    if (!context_ || format != format_ || frame.sample_rate != input_rate_ ||
        av_channel_layout_compare(&frame.ch_layout, &layout_) != 0) {
      flush(out);
      reset(frame);
    }
    convert(frame.extended_data, frame.nb_samples, out);
  }

  // Appends the samples still held in the resampler's filter to `out`.
  void flush(std::vector<float>& out) {
    if (context_) convert(nullptr, 0, out);
  }

 private:
  void reset(const AVFrame& frame) {
    format_ = static_cast<AVSampleFormat>(frame.format);
    input_rate_ = frame.sample_rate;
    // A forged header's rate makes swr_init build filters for minutes, where no deadline
    // reaches (found by tests/fuzz/media_fuzzer: 536,878,912 Hz took 28 s and 1.35 GB).
    PC_MEDIA_CHECK(input_rate_ > 0 && input_rate_ <= kMaxInputSampleRate,
                   FailureCategory::kDecodeError, file_.string(), ": the audio claims ",
                   input_rate_, " samples per second; rates up to ", kMaxInputSampleRate,
                   " are accepted");
    av_channel_layout_uninit(&layout_);
    const int copied = av_channel_layout_copy(&layout_, &frame.ch_layout);
    PC_MEDIA_CHECK(copied >= 0, FailureCategory::kDecodeError, file_.string(),
                   ": cannot copy the channel layout: ", ffmpeg::error_text(copied));

    // Some containers give only a channel count; assume that count's usual layout.
    AVChannelLayout input{};
    if (frame.ch_layout.order == AV_CHANNEL_ORDER_UNSPEC) {
      av_channel_layout_default(&input, frame.ch_layout.nb_channels);
    } else {
      av_channel_layout_copy(&input, &frame.ch_layout);
    }
    AVChannelLayout mono = AV_CHANNEL_LAYOUT_MONO;
    SwrContext* raw = nullptr;
    // swr_alloc_set_opts2 frees the context itself when it fails.
    const int allocated = swr_alloc_set_opts2(&raw, &mono, AV_SAMPLE_FMT_FLT, rate_, &input,
                                              format_, input_rate_, 0, nullptr);
    av_channel_layout_uninit(&input);
    context_.reset(raw);
    PC_MEDIA_CHECK(allocated >= 0, FailureCategory::kDecodeError, file_.string(),
                   ": cannot set up resampling from ", input_rate_, " Hz ",
                   frame.ch_layout.nb_channels,
                   " channels (swr_alloc_set_opts2): ", ffmpeg::error_text(allocated));
    // With float output libswresample does not normalise its downmix matrix, so stereo would
    // come out as 0.707 * (L + R) and could exceed 1. Capping the matrix's gain at 1 makes the
    // mono signal a weighted mean of the channels, as audio models expect.
    av_opt_set_double(context_.get(), "rematrix_maxval", 1.0, 0);
    const int initialised = swr_init(context_.get());
    PC_MEDIA_CHECK(initialised >= 0, FailureCategory::kDecodeError, file_.string(),
                   ": cannot set up resampling from ", input_rate_, " Hz ",
                   frame.ch_layout.nb_channels,
                   " channels (swr_init): ", ffmpeg::error_text(initialised));
  }

  // Converts `count` input samples (none: drain the filter) and appends the output.
  void convert(const uint8_t* const* input, int count, std::vector<float>& out) {
    while (true) {
      const int capacity = swr_get_out_samples(context_.get(), count);  // an upper bound
      if (capacity <= 0) return;
      const size_t size = out.size();
      out.resize(size + capacity);
      auto* dst = reinterpret_cast<uint8_t*>(out.data() + size);
      const int converted =
          swr_convert(context_.get(), &dst, capacity, const_cast<const uint8_t**>(input), count);
      PC_MEDIA_CHECK(converted >= 0, FailureCategory::kDecodeError, file_.string(),
                     ": cannot resample (swr_convert): ", ffmpeg::error_text(converted));
      out.resize(size + converted);
      // Input is consumed by one call; draining repeats until the filter is empty.
      if (input != nullptr || converted == 0) return;
    }
  }

  int rate_;
  const std::filesystem::path& file_;
  SwrContextPtr context_;
  AVSampleFormat format_ = AV_SAMPLE_FMT_NONE;
  int input_rate_ = 0;
  AVChannelLayout layout_{};
};

// Note [Audio windows]
// The decoded clip is L mono samples at `rate`. With window_s == 0 it is one window of L
// samples, all valid. Otherwise windows are W = round(window_s * rate) samples long and start
// H = round(hop_s * rate) apart (H = W when hop_s == 0), and there are
//   n = 1                       when L <= W,
//   n = ceil((L - W) / H) + 1   otherwise,
// so that the whole clip is covered (with H > W, windows would otherwise start past the end;
// n stops at the last window that starts inside the clip). Every window holds W samples, zeros
// past the end of the clip; valid_samples[k] = min(W, L - k*H) says how many are real. Window k
// starts at start + k*H/rate seconds, where start is the first decoded frame's time on the
// sample clock (Note [Sample clock] in ffmpeg_common.hpp): usually 0, but an audio track that
// begins later than its video keeps that offset.
AudioWindows cut_windows(std::vector<float> samples, double start_s,
                         const AudioDecodeOptions& options) {
  const auto length = static_cast<int64_t>(samples.size());
  const int rate = options.sample_rate;
  AudioWindows out;
  out.sample_rate = rate;
  out.duration_s = static_cast<double>(length) / rate;
  if (options.window_s == 0) {
    out.window_samples = length;
    out.num_windows = 1;
    out.samples = std::move(samples);
    out.timestamps = {start_s};
    out.valid_samples = {length};
    return out;
  }
  const int64_t window = std::max<int64_t>(1, std::llround(options.window_s * rate));
  const int64_t hop =
      options.hop_s > 0 ? std::max<int64_t>(1, std::llround(options.hop_s * rate)) : window;
  const int64_t count =
      length <= window ? 1
                       : std::min((length - window + hop - 1) / hop + 1, (length - 1) / hop + 1);
  out.window_samples = window;
  out.num_windows = count;
  out.samples.assign(static_cast<size_t>(window * count), 0.0f);
  out.timestamps.resize(count);
  out.valid_samples.resize(count);
  for (int64_t k = 0; k < count; ++k) {
    const int64_t valid = std::min(window, length - k * hop);
    std::copy_n(samples.begin() + k * hop, valid, out.samples.begin() + k * window);
    out.valid_samples[k] = valid;
    out.timestamps[k] = start_s + static_cast<double>(k * hop) / rate;
  }
  return out;
}

}  // namespace

AudioDecodeOptions audio_decode_options(const AudioSection& section, const RunSection& run) {
  AudioDecodeOptions options;
  options.sample_rate = section.sample_rate;
  options.window_s = section.window_s;
  options.hop_s = section.hop_s;
  options.max_duration_s = section.max_duration_s;
  options.timeout_s = run.sample_timeout_s;
  options.max_file_bytes = run.max_file_bytes;
  return options;
}

AudioWindows decode_audio(const MediaSource& source, const AudioDecodeOptions& options) {
  const std::filesystem::path file(source.name());  // for messages
  PC_ASSERT(options.sample_rate > 0 && options.window_s >= 0 && options.hop_s >= 0);

  const ffmpeg::Deadline deadline(options.timeout_s);
  // A video's own pictures are not ours to cap here (video.max_pixels): FFmpeg's default holds.
  const ffmpeg::InputLimits limits{options.max_file_bytes, /*max_pixels=*/0};
  const ffmpeg::InputFile input = ffmpeg::open_input(source, limits, deadline);
  const AVStream* stream = ffmpeg::find_stream(input.format(), AVMEDIA_TYPE_AUDIO, file);
  const ffmpeg::SampleClock clock(input.format());
  const AVRational time_base = stream->time_base;
  const double max_samples = options.max_duration_s * options.sample_rate;
  std::vector<float> samples;
  if (const std::optional<int64_t> duration = ffmpeg::header_duration(input.format(), stream)) {
    const double duration_s = static_cast<double>(*duration) * av_q2d(time_base);
    PC_MEDIA_CHECK(duration_s <= options.max_duration_s, FailureCategory::kTooLong, file.string(),
                   ": the audio lasts ", duration_s, " s, over the limit of ",
                   options.max_duration_s, " s (audio.max_duration_s)");
    samples.reserve(static_cast<size_t>(duration_s * options.sample_rate) + 4096);
  }

  CodecContextPtr codec = ffmpeg::open_decoder(stream, /*threads=*/1, /*max_pixels=*/0, file);
  MonoResampler resampler(options.sample_rate, file);
  int64_t first_pts = AV_NOPTS_VALUE;
  const auto sink = [&](AVFrame* frame) -> bool {
    if (first_pts == AV_NOPTS_VALUE) first_pts = frame->best_effort_timestamp;
    resampler.push(*frame, samples);
    // Headers can understate the duration; what is decoded is what counts.
    PC_MEDIA_CHECK(static_cast<double>(samples.size()) <= max_samples, FailureCategory::kTooLong,
                   file.string(), ": the decoded audio is longer than the limit of ",
                   options.max_duration_s, " s (audio.max_duration_s)");
    return true;
  };
  ffmpeg::decode_stream(input.format(), stream, codec.get(), sink, deadline, file);
  resampler.flush(samples);
  PC_MEDIA_CHECK(!samples.empty(), FailureCategory::kDecodeError, file.string(),
                 ": the audio stream decoded to no samples");

  // As for video, a stream without a start in its headers starts at its first frame.
  int64_t start = ffmpeg::stream_start(stream);
  if (start == AV_NOPTS_VALUE) start = first_pts != AV_NOPTS_VALUE ? first_pts : 0;
  const double start_s =
      clock.seconds(stream, first_pts != AV_NOPTS_VALUE ? first_pts : start, start);
  return cut_windows(std::move(samples), start_s, options);
}

}  // namespace precompute
