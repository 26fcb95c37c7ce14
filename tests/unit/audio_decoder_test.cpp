#include "pipeline/media/audio_decoder.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <optional>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/media/video_decoder.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using testing::run_ffmpeg;
using testing::shell_quote;
using testing::TempDir;

// FFmpeg's sine source has amplitude 1/8, so its RMS is 0.125 / sqrt(2).
const double kSineRms = 0.125 / std::sqrt(2.0);

std::string quoted(const std::filesystem::path& path) { return shell_quote(path.string()); }

// Copies the mono sine to both channels at full level (-ac 2 would scale each by 1/sqrt(2)).
constexpr const char* kToStereo = " -af 'pan=stereo|c0=c0|c1=c0' ";

// A 440 Hz sine of `seconds` at 44.1 kHz stereo, encoded with `encode` (ffmpeg output options).
void make_sine(const std::filesystem::path& path, double seconds, const std::string& encode) {
  run_ffmpeg("-f lavfi -i sine=frequency=440:sample_rate=44100:duration=" +
             std::to_string(seconds) + kToStereo + encode + " " + quoted(path));
}

double rms(const float* samples, int64_t count) {
  double sum = 0;
  for (int64_t i = 0; i < count; ++i) sum += double{samples[i]} * samples[i];
  return std::sqrt(sum / static_cast<double>(count));
}

// The dominant frequency from the number of sign changes: two per period.
double zero_crossing_frequency(const float* samples, int64_t count, int rate) {
  int64_t crossings = 0;
  for (int64_t i = 1; i < count; ++i) {
    if ((samples[i - 1] < 0) != (samples[i] < 0)) ++crossings;
  }
  return static_cast<double>(crossings) / 2.0 / (static_cast<double>(count) / rate);
}

AudioDecodeOptions window_options(double window_s, double hop_s) {
  AudioDecodeOptions options;
  options.sample_rate = 16000;
  options.window_s = window_s;
  options.hop_s = hop_s;
  return options;
}

using Outcome = testing::MediaOutcome;
Outcome outcome_of(const std::filesystem::path& file, const AudioDecodeOptions& options) {
  return testing::media_outcome([&] { decode_audio(file, options); });
}

// Checks a decoded 440 Hz sine of `seconds` at 16 kHz mono in one window.
void expect_sine(const AudioWindows& audio, double seconds) {
  ASSERT_EQ(audio.num_windows, 1);
  EXPECT_EQ(audio.sample_rate, 16000);
  const int64_t length = audio.window_samples;
  EXPECT_NEAR(static_cast<double>(length), seconds * 16000, seconds * 16000 * 0.01);
  ASSERT_EQ(audio.samples.size(), static_cast<size_t>(length));
  EXPECT_EQ(audio.valid_samples[0], length);
  EXPECT_NEAR(audio.timestamps[0], 0.0, 1e-3);
  // Away from the edges, where encoders fade in and out.
  const float* middle = audio.samples.data() + length / 10;
  const int64_t middle_count = length * 8 / 10;
  EXPECT_NEAR(rms(middle, middle_count), kSineRms, kSineRms * 0.02);
  EXPECT_NEAR(zero_crossing_frequency(middle, middle_count, 16000), 440.0, 440.0 * 0.01);
}

TEST(AudioDecoder, StereoAacSineBecomesMono16kHz) {
  TempDir dir;
  const auto path = dir / "sine.m4a";
  // AAC ends on a whole 1024-sample frame: up to 23 ms of encoder padding is decoded too, as
  // the ffmpeg CLI does.
  make_sine(path, 3.0, "-c:a aac -b:a 192k");
  const AudioWindows audio = decode_audio(path, window_options(0, 0));
  expect_sine(audio, 3.0);
  EXPECT_NEAR(audio.duration_s, 3.0, 0.03);
}

TEST(AudioDecoder, StereoWavSineBecomesMono16kHz) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 2.0, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(0, 0));
  expect_sine(audio, 2.0);
  EXPECT_EQ(audio.window_samples, 32000);  // 88200 samples at 44.1 kHz, exactly
}

TEST(AudioDecoder, WindowsWithHopCoverTheClip) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 3.5, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(1.0, 0.5));
  // 56000 samples: windows start every 8000, the last one at 40000 ends exactly at the end.
  ASSERT_EQ(audio.num_windows, 6);
  EXPECT_EQ(audio.window_samples, 16000);
  ASSERT_EQ(audio.samples.size(), 6u * 16000);
  ASSERT_EQ(audio.timestamps.size(), 6u);
  ASSERT_EQ(audio.valid_samples.size(), 6u);
  for (int k = 0; k < 6; ++k) {
    EXPECT_NEAR(audio.timestamps[k], 0.5 * k, 1e-9) << "window " << k;
    EXPECT_EQ(audio.valid_samples[k], 16000) << "window " << k;
    EXPECT_NEAR(rms(audio.samples.data() + k * 16000 + 1000, 14000), kSineRms, kSineRms * 0.02)
        << "window " << k;
  }
  // Overlapping windows hold the same samples where they overlap.
  EXPECT_EQ(audio.samples[8000 + 123], audio.samples[16000 + 123]);
  EXPECT_NEAR(audio.duration_s, 3.5, 1e-3);
}

TEST(AudioDecoder, LastWindowIsZeroPaddedPastTheEnd) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 3.2, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(1.0, 0.5));
  // 51200 samples: 6 windows, the last from 40000 holds 11200 real samples.
  ASSERT_EQ(audio.num_windows, 6);
  EXPECT_EQ(audio.valid_samples[5], 11200);
  EXPECT_NEAR(audio.timestamps[5], 2.5, 1e-9);
  const float* last = audio.samples.data() + 5 * 16000;
  EXPECT_NEAR(rms(last, 11000), kSineRms, kSineRms * 0.02);
  for (int64_t i = 11200; i < 16000; ++i) ASSERT_EQ(last[i], 0.0f) << "sample " << i;
}

TEST(AudioDecoder, WindowsWithoutHopDoNotOverlap) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 2.5, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(1.0, 0));
  ASSERT_EQ(audio.num_windows, 3);
  EXPECT_NEAR(audio.timestamps[1], 1.0, 1e-9);
  EXPECT_NEAR(audio.timestamps[2], 2.0, 1e-9);
  EXPECT_EQ(audio.valid_samples[2], 8000);
}

TEST(AudioDecoder, ClipShorterThanAWindowIsOnePaddedWindow) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 0.5, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(2.0, 1.0));
  ASSERT_EQ(audio.num_windows, 1);
  EXPECT_EQ(audio.window_samples, 32000);
  EXPECT_EQ(audio.valid_samples[0], 8000);
  EXPECT_EQ(audio.samples[31999], 0.0f);
}

TEST(AudioDecoder, WholeClipModeGivesOneWindow) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 3.5, "-c:a pcm_s16le");
  const AudioWindows audio = decode_audio(path, window_options(0, 0));
  ASSERT_EQ(audio.num_windows, 1);
  EXPECT_EQ(audio.window_samples, 56000);
  EXPECT_EQ(audio.valid_samples[0], 56000);
  EXPECT_EQ(audio.bytes(), 56000 * sizeof(float) + sizeof(double) + sizeof(int64_t));
}

TEST(AudioDecoder, VideoFileGivesItsAudioTrack) {
  TempDir dir;
  const auto path = dir / "clip.mp4";
  run_ffmpeg(std::string("-f lavfi -i color=c=red:s=64x48:r=25:d=3 ") +
             "-f lavfi -i sine=frequency=440:sample_rate=44100:duration=3 "
             "-c:v libx264 -pix_fmt yuv420p -c:a aac -b:a 192k" +
             kToStereo + quoted(path));
  expect_sine(decode_audio(path, window_options(0, 0)), 3.0);
}

// A video's audio track that starts 2.5 s after its picture keeps that offset: window times and
// frame times are on the container's clock, which the video starts.
void expect_late_audio_on_the_video_clock(const std::filesystem::path& path) {
  const AudioWindows audio = decode_audio(path, window_options(1.0, 0));
  // Two seconds of sine, and the codec's padding past them.
  ASSERT_GE(audio.num_windows, 2);
  // AAC's encoder delay moves the track's start up to 1024 samples (23 ms) earlier.
  EXPECT_NEAR(audio.timestamps[0], 2.5, 0.03);
  EXPECT_NEAR(audio.timestamps[1] - audio.timestamps[0], 1.0, 1e-9);
  VideoDecodeOptions video;
  video.num_frames = 2;
  video.width = 16;
  video.height = 16;
  const VideoFrames frames = decode_video(path, video);
  // Frames on screen at 1.25 s and 3.75 s of the 5 s picture.
  EXPECT_NEAR(frames.timestamps[0], 1.24, 1e-6);
  EXPECT_NEAR(frames.timestamps[1], 3.72, 1e-6);
}

TEST(AudioDecoder, WindowTimestampsAreOnTheContainersClock) {
  TempDir dir;
  const std::pair<const char*, const char*> files[] = {
      {"late.mp4", "-c:v libx264 -pix_fmt yuv420p -c:a aac"},
      {"late.ts", "-c:v libx264 -pix_fmt yuv420p -c:a mp2"},  // the clock starts at 1.4 s here
  };
  for (const auto& [name, encode] : files) {
    SCOPED_TRACE(name);
    const auto path = dir / name;
    run_ffmpeg(std::string("-f lavfi -i color=c=red:s=64x48:r=25:d=5 -itsoffset 2.5 ") +
               "-f lavfi -i sine=frequency=440:sample_rate=44100:duration=2 " + encode + " " +
               quoted(path));
    expect_late_audio_on_the_video_clock(path);
  }
}

// Note [Sample clock] in ffmpeg_common.hpp: the same coded audio gives the same windows, stamped
// 0, 1, 2, ... in every container, whether the file starts at 0 or 1.5 s in. An Opus decoder
// drops the stream's pre-skip (6.5 ms) before its first sample: Ogg starts the stream at that
// sample, while FFmpeg puts a Matroska stream's start at its first packet, pre-skip included;
// taken as the origin, that would stamp every window of the WebM and MKV 7 ms late.
struct AudioContainerCase {
  const char* name;
  const char* encode;                   // ffmpeg output options of the coded audio
  const char* first;                    // the file it is coded into
  std::vector<const char*> containers;  // the files it is copied into
};

void PrintTo(const AudioContainerCase& c, std::ostream* out) { *out << c.name; }

class AudioDecoderContainers : public ::testing::TestWithParam<AudioContainerCase> {};

TEST_P(AudioDecoderContainers, SameWindowsAndTimestampsInEveryContainerAndStart) {
  const AudioContainerCase& c = GetParam();
  TempDir dir;
  const auto coded = dir / c.first;
  make_sine(coded, 3.5, c.encode);
  std::optional<AudioWindows> reference;
  std::string reference_name;
  for (const char* container : c.containers) {
    for (const double start : {0.0, 1.5}) {
      const auto file = dir / (std::to_string(start) + "." + container);
      // FLAC in MP4 is "experimental" to FFmpeg 5.1's muxer.
      run_ffmpeg("-i " + quoted(coded) + " -c copy -strict -2 -output_ts_offset " +
                 std::to_string(start) + " " + quoted(file));
      const std::string name = file.filename().string();
      const AudioWindows audio = decode_audio(file, window_options(1.0, 0));
      ASSERT_EQ(audio.num_windows, 4) << name;
      for (int k = 0; k < 4; ++k) {
        if (std::abs(audio.timestamps[k] - k) > 1e-9) {
          ADD_FAILURE() << name << ": windows start at "
                        << ::testing::PrintToString(audio.timestamps) << ", expected 0, 1, 2, 3";
          break;
        }
      }
      if (!reference) {
        reference = audio;
        reference_name = name;
        continue;
      }
      EXPECT_EQ(audio.valid_samples, reference->valid_samples)
          << name << " against " << reference_name;
      EXPECT_TRUE(audio.samples == reference->samples)
          << name << " against " << reference_name << ": the samples differ";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, AudioDecoderContainers,
    ::testing::Values(
        AudioContainerCase{"opus", "-c:a libopus", "coded.ogg", {"ogg", "webm", "mkv"}},
        AudioContainerCase{"flac", "-c:a flac", "coded.flac", {"flac", "ogg", "mkv", "mp4"}}),
    [](const ::testing::TestParamInfo<AudioContainerCase>& info) {
      return std::string(info.param.name);
    });

// Note [Sample clock]: in a file whose Opus audio starts it, the clock starts at the audio's
// first sample, for the video's frames too, not at its first packet, 7 ms earlier in Matroska
// (which would stamp every window and frame of the WebM and MKV 7 ms late).
TEST(AudioDecoder, OpusAudioStartsTheClockOfTheVideoAfterIt) {
  TempDir dir;
  const auto opus = dir / "sine.ogg";
  make_sine(opus, 3.0, "-c:a libopus");
  const auto video = dir / "red.webm";
  run_ffmpeg(
      "-f lavfi -i color=c=red:s=64x48:r=10:d=4 -c:v libvpx-vp9 -deadline realtime "
      "-cpu-used 8 " +
      quoted(video));
  for (const char* container : {"mp4", "webm", "mkv"}) {
    const auto path = dir / (std::string("late.") + container);
    run_ffmpeg("-i " + quoted(opus) + " -itsoffset 1.5 -i " + quoted(video) +
               " -map 0:a -map 1:v -c copy " + quoted(path));
    const AudioWindows audio = decode_audio(path, window_options(1.0, 0));
    ASSERT_GE(audio.num_windows, 3) << container;
    EXPECT_NEAR(audio.timestamps[0], 0.0, 1e-9) << container;
    EXPECT_NEAR(audio.timestamps[2], 2.0, 1e-9) << container;
    VideoDecodeOptions sampling;
    sampling.num_frames = 2;
    sampling.width = 16;
    sampling.height = 16;
    const VideoFrames frames = decode_video(path, sampling);
    ASSERT_EQ(frames.num_frames, 2) << container;
    // The frames on screen 1 s and 3 s into the video's 4 s, 1.5 s after the audio's first
    // sample. FFmpeg's Matroska muxer moves every stream 6.5 ms later, to keep the Opus
    // stream's first packet (at -6.5 ms: its pre-skip) from going below 0, and its reader moves
    // the Opus stream back by its CodecDelay: in the WebM and MKV the video does start up to
    // 7 ms past 1.5 s.
    for (int k = 0; k < 2; ++k) {
      const double expected = 1.5 + 1.0 + 2.0 * k;
      EXPECT_GE(frames.timestamps[k], expected - 1e-9) << container << ", frame " << k;
      EXPECT_LE(frames.timestamps[k], expected + 0.007 + 1e-9) << container << ", frame " << k;
    }
  }
}

TEST(AudioDecoder, VideoWithoutAudioHasNoAudioStream) {
  TempDir dir;
  const auto path = dir / "silent.mp4";
  run_ffmpeg("-f lavfi -i color=c=red:s=64x48:r=25:d=1 -c:v libx264 -pix_fmt yuv420p " +
             quoted(path));
  const Outcome outcome = outcome_of(path, window_options(0, 0));
  EXPECT_EQ(outcome.category, "no_stream");
  EXPECT_NE(outcome.message.find("no audio stream"), std::string::npos) << outcome.message;
}

TEST(AudioDecoder, SixChannelInputDownmixesToMono) {
  TempDir dir;
  const auto path = dir / "surround.wav";
  // The same sine on all six channels of 5.1: the mean of the channels is that sine again (LFE
  // is left out of a downmix).
  run_ffmpeg(
      "-f lavfi -i sine=frequency=440:sample_rate=48000:duration=2 "
      "-af 'pan=5.1|c0=c0|c1=c0|c2=c0|c3=c0|c4=c0|c5=c0' -c:a pcm_f32le " +
      quoted(path));
  expect_sine(decode_audio(path, window_options(0, 0)), 2.0);
}

// The mono signal's gain for a sine on channel `channel` alone of `layout` (others silent).
double channel_weight(const std::string& layout, int channels, int channel) {
  TempDir dir;
  const auto path = dir / "one_channel.wav";
  std::string pan = "pan=" + layout;
  for (int c = 0; c < channels; ++c) {
    pan += "|c" + std::to_string(c) + (c == channel ? "=c0" : "=0*c0");
  }
  run_ffmpeg("-f lavfi -i sine=frequency=440:sample_rate=48000:duration=1 -af '" + pan +
             "' -c:a pcm_f32le " + quoted(path));
  const AudioWindows audio = decode_audio(path, window_options(0, 0));
  const int64_t length = audio.window_samples;
  return rms(audio.samples.data() + length / 10, length * 8 / 10) / kSineRms;
}

// What the downmix is: libswresample's matrix (FFmpeg's standard downmix), with its gain capped
// at 1 (audio_decoder.cpp). Stereo is the mean of left and right; in 5.1 the centre counts
// fully, front and back pairs less, and LFE not at all, so it is not the mean of the channels.
// A test that sends one signal to every channel cannot tell these apart; one channel at a time
// can.
TEST(AudioDecoder, DownmixWeightsAreLibswresamplesMatrix) {
  EXPECT_NEAR(channel_weight("stereo", 2, 0), 0.5, 0.01);
  EXPECT_NEAR(channel_weight("stereo", 2, 1), 0.5, 0.01);
  // 5.1: FL FR FC LFE BL BR.
  const double fl = channel_weight("5.1", 6, 0);
  const double fc = channel_weight("5.1", 6, 2);
  const double lfe = channel_weight("5.1", 6, 3);
  const double bl = channel_weight("5.1", 6, 4);
  EXPECT_NEAR(fl, channel_weight("5.1", 6, 1), 0.01);
  EXPECT_NEAR(bl, channel_weight("5.1", 6, 5), 0.01);
  EXPECT_LT(lfe, 0.01);
  EXPECT_GT(fc, fl + 0.05);
  EXPECT_GT(fl, bl + 0.05);
  EXPECT_NEAR(fc + 2 * fl + 2 * bl, 1.0, 0.02);  // the gain cap: the weights sum to 1
  std::printf("5.1 downmix weights: FC %.3f, FL/FR %.3f, BL/BR %.3f, LFE %.3f\n", fc, fl, bl,
              lfe);
}

TEST(AudioDecoder, SampleRateChangeMidStream) {
  TempDir dir;
  const auto first = dir / "first.ts";
  const auto second = dir / "second.ts";
  const auto joined = dir / "joined.ts";
  run_ffmpeg("-f lavfi -i sine=frequency=440:sample_rate=44100:duration=1 -ac 2 -c:a mp2 " +
             quoted(first));
  run_ffmpeg(
      "-f lavfi -i sine=frequency=440:sample_rate=22050:duration=1 -ac 1 -c:a mp2 "
      "-output_ts_offset 1 " +
      quoted(second));
  ASSERT_EQ(
      std::system(("cat " + quoted(first) + " " + quoted(second) + " > " + quoted(joined)).c_str()),
      0);
  const AudioWindows audio = decode_audio(joined, window_options(0, 0));
  // Both halves come out at 16 kHz: about two seconds of the same tone.
  EXPECT_NEAR(static_cast<double>(audio.window_samples), 32000, 32000 * 0.05);
  const float* tail = audio.samples.data() + audio.window_samples - 12000;
  EXPECT_NEAR(rms(tail, 8000), kSineRms, kSineRms * 0.05);
  EXPECT_NEAR(zero_crossing_frequency(tail, 8000, 16000), 440.0, 440.0 * 0.02);
}

TEST(AudioDecoder, AudioOverMaxDurationIsTooLong) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 3.0, "-c:a pcm_s16le");
  AudioDecodeOptions options = window_options(0, 0);
  options.max_duration_s = 2.0;
  const Outcome outcome = outcome_of(path, options);
  EXPECT_EQ(outcome.category, "too_long");
  EXPECT_NE(outcome.message.find("audio.max_duration_s"), std::string::npos) << outcome.message;
}

TEST(AudioDecoder, AudioLongerThanItsHeaderSaysIsTooLong) {
  TempDir dir;
  const auto path = dir / "streamed.mka";
  // Matroska written to a pipe has no duration in its header: only decoding can tell.
  run_ffmpeg(
      "-f lavfi -i sine=frequency=440:sample_rate=44100:duration=3 -c:a pcm_s16le "
      "-f matroska pipe:1 > " +
      quoted(path));
  AudioDecodeOptions options = window_options(0, 0);
  options.max_duration_s = 2.0;
  EXPECT_EQ(outcome_of(path, options).category, "too_long");
  options.max_duration_s = 3.5;
  EXPECT_NEAR(decode_audio(path, options).duration_s, 3.0, 0.01);
}

TEST(AudioDecoder, MissingFileIsMissing) {
  TempDir dir;
  EXPECT_EQ(outcome_of(dir / "nope.wav", window_options(0, 0)).category, "missing");
}

TEST(AudioDecoder, FileOverMaxFileBytesIsTooLarge) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 1.0, "-c:a pcm_s16le");
  const auto size = static_cast<int64_t>(std::filesystem::file_size(path));
  AudioDecodeOptions options = window_options(0, 0);
  options.max_file_bytes = size - 1;
  const Outcome outcome = outcome_of(path, options);
  EXPECT_EQ(outcome.category, "too_large");
  EXPECT_NE(outcome.message.find("run.max_file_bytes"), std::string::npos) << outcome.message;
  options.max_file_bytes = size;
  expect_sine(decode_audio(path, options), 1.0);
}

TEST(AudioDecoder, PassedDeadlineIsATimeout) {
  TempDir dir;
  const auto path = dir / "sine.wav";
  make_sine(path, 1.0, "-c:a pcm_s16le");
  AudioDecodeOptions options = window_options(0, 0);
  options.timeout_s = 1e-9;
  const Outcome outcome = outcome_of(path, options);
  EXPECT_EQ(outcome.category, "timeout") << outcome.message;
  EXPECT_NE(outcome.message.find("run.sample_timeout_s"), std::string::npos) << outcome.message;
}

TEST(AudioDecoder, SpecialFilesAndUrlsAreUnreadable) {
  TempDir dir;
  std::filesystem::create_directory(dir / "folder.wav");
  ASSERT_EQ(::mkfifo((dir / "pipe.wav").c_str(), 0600), 0);
  for (const auto& path : {dir / "folder.wav", dir / "pipe.wav", std::filesystem::path("/dev/zero"),
                           dir / "http:" / "example.com" / "a.wav", dir / "concat:a.wav|b.wav"}) {
    EXPECT_EQ(outcome_of(path, window_options(0, 0)).category, "unreadable") << path;
  }
}

TEST(AudioDecoder, OptionsCopyTheConfigSection) {
  AudioSection section;
  section.sample_rate = 48000;
  section.window_s = 10;
  section.hop_s = 5;
  section.max_duration_s = 600;
  RunSection run;
  run.sample_timeout_s = 8.5;
  run.max_file_bytes = 999;
  const AudioDecodeOptions options = audio_decode_options(section, run);
  EXPECT_EQ(options.sample_rate, 48000);
  EXPECT_EQ(options.window_s, 10);
  EXPECT_EQ(options.hop_s, 5);
  EXPECT_EQ(options.max_duration_s, 600);
  EXPECT_EQ(options.timeout_s, 8.5);
  EXPECT_EQ(options.max_file_bytes, 999);
}

}  // namespace
}  // namespace precompute
