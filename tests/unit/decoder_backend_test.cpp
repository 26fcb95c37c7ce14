// The decoder backends (pipeline/media/decoder_backend.hpp) under decode_video, on real FFmpeg
// with clips made by the ffmpeg CLI: the CPU backend gives the frames and timestamps that
// sampling asks for, seeks as Note [Seeking to what is sampled] says, can be used for file after
// file, and is called as the interface promises; the NVDEC backend without a session is the
// kept-decoder path on the CPU.
#include "pipeline/media/decoder_backend.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/media/cpu_decoder_backend.hpp"
#include "pipeline/media/kept_decoder.hpp"
#include "pipeline/media/nvdec_decoder_backend.hpp"
#include "pipeline/media/video_decoder.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using testing::run_ffmpeg;
using testing::shell_quote;
using testing::TempDir;

constexpr int kRate = 25;  // frames per second of the test clips

std::string quoted(const std::filesystem::path& path) { return shell_quote(path.string()); }

// Eight seconds of a moving pattern at 25 fps, a keyframe every 25 frames (so that sparse
// sampling seeks), H.264 in MP4 with B-frames.
std::filesystem::path make_clip(const TempDir& dir, const std::string& name = "clip.mp4") {
  const auto clip = dir / name;
  run_ffmpeg("-f lavfi -i testsrc2=s=160x120:r=25:d=8 -c:v libx264 -pix_fmt yuv420p "
             "-x264-params keyint=25:min-keyint=25:scenecut=0 " +
             quoted(clip));
  return clip;
}

VideoDecodeOptions fps_options(double fps) {
  VideoDecodeOptions options;
  options.fps = fps;
  options.num_frames = 0;
  options.width = 48;
  options.height = 48;
  return options;
}

VideoDecodeOptions num_frames_options(int n) {
  VideoDecodeOptions options;
  options.fps = 0;
  options.num_frames = n;
  options.width = 48;
  options.height = 48;
  return options;
}

// Note [Sampling frames]: target k lies at the centre of interval k, and the frame on screen
// there starts at the last frame time at or before it.
std::vector<double> expected_timestamps(const VideoDecodeOptions& options, double duration_s) {
  const int64_t count = options.fps > 0
                            ? static_cast<int64_t>(std::ceil(duration_s * options.fps - 1e-9))
                            : options.num_frames;
  std::vector<double> times;
  for (int64_t k = 0; k < count; ++k) {
    const double target = options.fps > 0 ? (k + 0.5) / options.fps
                                           : (k + 0.5) * duration_s / static_cast<double>(count);
    const double frame = std::floor(target * kRate + 1e-9) / kRate;
    times.push_back(std::min(frame, duration_s - 1.0 / kRate));
  }
  return times;
}

void expect_same_frames(const VideoFrames& got, const VideoFrames& expected,
                        const std::string& what) {
  ASSERT_EQ(got.num_frames, expected.num_frames) << what;
  EXPECT_EQ(got.timestamps, expected.timestamps) << what;
  EXPECT_TRUE(got.rgb == expected.rgb) << what << ": pixels differ";
}

// A backend that hands every call to a CPU backend and counts them.
class CountingBackend final : public VideoDecoderBackend {
 public:
  DecoderCapabilities capabilities() const override {
    DecoderCapabilities caps = cpu_.capabilities();
    caps.drops_frames_from_gap = drops_frames_from_gap;
    return caps;
  }
  void open(const AVStream* stream, const VideoDecodeOptions& options,
            const std::filesystem::path& file) override {
    ++opens;
    cpu_.open(stream, options, file);
  }
  AVCodecContext* codec() const override { return cpu_.codec(); }
  bool seek() override {
    ++seeks;
    return cpu_.seek();
  }
  void before_packet(const AVPacket& packet) override {
    ++packets;
    cpu_.before_packet(packet);
  }
  void close(bool drained) override {
    ++closes;
    cpu_.close(drained);
  }

  double drops_frames_from_gap = 0.0;  // the CPU's: always
  int opens = 0;
  int closes = 0;
  int64_t seeks = 0;
  int64_t packets = 0;

 private:
  CpuDecoderBackend cpu_;
};

TEST(DecoderBackend, CpuBackendGivesTheSampledFramesAndTimestamps) {
  TempDir dir;
  const auto clip = make_clip(dir);
  for (const VideoDecodeOptions& sampling :
       {fps_options(1.0), fps_options(2.5), fps_options(0.5), num_frames_options(4),
        num_frames_options(7), num_frames_options(1)}) {
    for (const bool seek : {false, true}) {
      VideoDecodeOptions options = sampling;
      options.seek = seek;
      const std::string what = "fps " + std::to_string(sampling.fps) + " num_frames " +
                               std::to_string(sampling.num_frames) + " seek " +
                               std::to_string(seek);
      CpuDecoderBackend cpu;
      const VideoFrames got = decode_video(clip, options, cpu);
      EXPECT_FALSE(got.nvdec) << what;
      EXPECT_NEAR(got.duration_s, 8.0, 1e-6) << what;
      const std::vector<double> expected = expected_timestamps(options, got.duration_s);
      ASSERT_EQ(got.timestamps.size(), expected.size()) << what;
      for (size_t k = 0; k < expected.size(); ++k) {
        EXPECT_NEAR(got.timestamps[k], expected[k], 1e-6) << what << " frame " << k;
      }
      // The same frames as the decode that picks its backend from the options.
      expect_same_frames(got, decode_video(clip, options), what);
    }
  }
}

TEST(DecoderBackend, SeekingKeepsTheFramesOfAFullDecodeWithOrWithoutAFlush) {
  TempDir dir;
  const auto clip = make_clip(dir);
  for (const VideoDecodeOptions& sampling : {fps_options(0.5), num_frames_options(3)}) {
    VideoDecodeOptions full = sampling;
    full.seek = false;
    CpuDecoderBackend forward;
    const VideoFrames expected = decode_video(clip, full, forward);
    EXPECT_EQ(expected.seeks, 0);
    for (const bool flush : {true, false}) {
      VideoDecodeOptions seeking = sampling;
      seeking.flush_on_seek = flush;
      CountingBackend counting;
      const VideoFrames got = decode_video(clip, seeking, counting);
      const std::string what = "fps " + std::to_string(sampling.fps) + " flush " +
                               std::to_string(flush);
      expect_same_frames(got, expected, what);
      EXPECT_GT(got.seeks, 0) << what << ": nothing was skipped, so seeking was not tested";
      EXPECT_LT(got.decoded_frames, expected.decoded_frames) << what;
      // Every seek of the decode goes through the backend, once.
      EXPECT_EQ(counting.seeks, got.seeks) << what;
    }
  }
}

// Note [NVDEC drops frames only at sparse sampling]: a backend that drops frames only where
// targets lie 15 frames apart decodes every frame at 5 a second on 25-fps video (5 apart) and
// drops at 1 every 2 seconds (50 apart), and the frames kept are the same either way.
TEST(DecoderBackend, ABackendDropsFramesOnlyWhereTargetsLieAsFarApartAsItSays) {
  TempDir dir;
  const auto clip = make_clip(dir);
  using Dropping = VideoDecodeOptions::FrameDropping;
  const auto decode = [&](double fps, double from_gap, Dropping dropping) {
    VideoDecodeOptions options = fps_options(fps);
    options.drop_frames = dropping;
    CountingBackend backend;
    backend.drops_frames_from_gap = from_gap;
    return decode_video(clip, options, backend);
  };
  // Dense: the frames no target keeps are dropped only by a backend that always drops.
  const VideoFrames dense_dropped = decode(5.0, 0.0, Dropping::kAuto);
  const VideoFrames dense_kept = decode(5.0, 15.0, Dropping::kAuto);
  const VideoFrames dense_never = decode(5.0, 0.0, Dropping::kOff);
  expect_same_frames(dense_kept, dense_dropped, "fps 5");
  // Every frame up to the one past the last target, where decoding stops.
  EXPECT_GE(dense_never.decoded_frames, 8 * kRate - 1);
  EXPECT_EQ(dense_kept.decoded_frames, dense_never.decoded_frames);
  EXPECT_LT(dense_dropped.decoded_frames, dense_kept.decoded_frames);
  // The options override the backend, both ways.
  EXPECT_EQ(decode(5.0, 15.0, Dropping::kOn).decoded_frames, dense_dropped.decoded_frames);
  // Sparse: both backends drop.
  const VideoFrames sparse_always = decode(0.5, 0.0, Dropping::kAuto);
  const VideoFrames sparse_from_15 = decode(0.5, 15.0, Dropping::kAuto);
  expect_same_frames(sparse_from_15, sparse_always, "fps 0.5");
  EXPECT_EQ(sparse_from_15.decoded_frames, sparse_always.decoded_frames);
  EXPECT_LT(sparse_from_15.decoded_frames, decode(0.5, 0.0, Dropping::kOff).decoded_frames);
}

TEST(DecoderBackend, DecodeVideoOpensAndClosesTheBackendOnceAndShowsItEveryPacket) {
  TempDir dir;
  const auto clip = make_clip(dir);
  VideoDecodeOptions options = fps_options(kRate);  // every frame: every packet is read
  options.seek = false;
  CountingBackend counting;
  const VideoFrames frames = decode_video(clip, options, counting);
  EXPECT_EQ(counting.opens, 1);
  EXPECT_EQ(counting.closes, 1);
  EXPECT_EQ(counting.seeks, 0);
  EXPECT_EQ(counting.packets, 8 * kRate);  // one packet a frame
  EXPECT_EQ(frames.decoded_frames, 8 * kRate);
}

TEST(DecoderBackend, ABackendDecodesFileAfterFile) {
  TempDir dir;
  const auto first = make_clip(dir, "first.mp4");
  const auto second = dir / "second.webm";
  run_ffmpeg("-f lavfi -i testsrc=s=96x64:r=25:d=3 -c:v libvpx-vp9 -b:v 200k " + quoted(second));
  const VideoDecodeOptions options = num_frames_options(5);
  CpuDecoderBackend reused;
  for (const auto& file : {first, second, first, second}) {
    CpuDecoderBackend fresh;
    expect_same_frames(decode_video(file, options, reused), decode_video(file, options, fresh),
                       file.string());
  }
}

TEST(DecoderBackend, CapabilitiesSayWhatEachBackendDoes) {
  const CpuDecoderBackend cpu;
  const DecoderCapabilities on_cpu = cpu.capabilities();
  EXPECT_EQ(on_cpu.name, "CPU");
  EXPECT_FALSE(on_cpu.gpu_frames);
  EXPECT_TRUE(on_cpu.may_give_up);
  EXPECT_FALSE(on_cpu.keeps_decoder);
  EXPECT_EQ(on_cpu.drops_frames_from_gap, 0.0);

  // Without a session the NVDEC backend decodes on the CPU, through a kept decoder if given one.
  const NvdecDecoderBackend plain(nullptr, nullptr);
  EXPECT_EQ(plain.capabilities().name, "CPU");
  EXPECT_FALSE(plain.capabilities().gpu_frames);
  EXPECT_FALSE(plain.capabilities().keeps_decoder);
  EXPECT_EQ(plain.capabilities().drops_frames_from_gap, 0.0);  // dropping pays on the CPU
  KeptDecoder kept(/*hw_device=*/nullptr);
  const NvdecDecoderBackend through_kept(nullptr, &kept);
  EXPECT_TRUE(through_kept.capabilities().keeps_decoder);
  EXPECT_TRUE(through_kept.capabilities().may_give_up);
}

TEST(DecoderBackend, TheCpuBackendMayGiveAFileUp) {
  TempDir dir;
  const auto clip = make_clip(dir);
  VideoDecodeOptions options = fps_options(kRate);
  options.give_up = [](double done, double) { return done >= 0.5; };
  CpuDecoderBackend cpu;
  try {
    (void)decode_video(clip, options, cpu);
    FAIL() << "the decode was not given up";
  } catch (const DecodeGivenUp& given_up) {
    EXPECT_GT(given_up.decoded_frames(), 0);
  }
  // The backend is usable for the next file after a decode that was given up.
  options.give_up = {};
  CpuDecoderBackend fresh;
  expect_same_frames(decode_video(clip, options, cpu), decode_video(clip, options, fresh),
                     "after giving up");
}

TEST(DecoderBackend, TheKeptDecoderPathGivesTheCpuFramesFileAfterFile) {
  TempDir dir;
  const auto first = make_clip(dir, "first.mp4");
  const auto second = dir / "second.mp4";
  run_ffmpeg("-f lavfi -i testsrc=s=96x64:r=25:d=3 -c:v libx264 -pix_fmt yuv420p " +
             quoted(second));
  KeptDecoder kept(/*hw_device=*/nullptr);
  NvdecDecoderBackend through_kept(nullptr, &kept);
  for (const VideoDecodeOptions& options : {num_frames_options(4), fps_options(1.0)}) {
    for (const auto& file : {first, second, first}) {
      CpuDecoderBackend cpu;
      expect_same_frames(decode_video(file, options, through_kept),
                         decode_video(file, options, cpu), file.string());
    }
  }
  EXPECT_GE(kept.reuses(), 4) << "the decoder was not kept, so nothing was tested";
  EXPECT_NE(through_kept.describe_use().find("decoder kept"), std::string::npos);
}

}  // namespace
}  // namespace precompute
