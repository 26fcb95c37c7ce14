#include "pipeline/media/video_decoder.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <iterator>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/pause_clock.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/media/ffmpeg_common.hpp"
#include "pipeline/media/kept_decoder.hpp"
#include "pipeline/media/nvdec_decoder_backend.hpp"
#include "pipeline/media/nvdec.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using testing::run_ffmpeg;
using testing::shell_quote;
using testing::TempDir;

constexpr double kColourTolerance = 8.0;  // levels of 255: codec and YUV round trip
constexpr double kFramePeriod = 1.0 / 25;

std::string quoted(const std::filesystem::path& path) { return shell_quote(path.string()); }

// ffmpeg inputs for four seconds at 25 fps, one solid colour per second: red, green, blue,
// white.
std::string colour_clip_inputs() {
  std::string inputs;
  for (const char* colour : {"0xFF0000", "0x00FF00", "0x0000FF", "0xFFFFFF"}) {
    inputs += std::string(" -f lavfi -i color=c=") + colour + ":s=160x120:r=25:d=1";
  }
  return inputs + " -filter_complex '[0][1][2][3]concat=n=4:v=1:a=0'";
}

// The colour clip; `encode` is the ffmpeg output options, e.g. "-c:v libx264 -pix_fmt yuv420p".
void make_colour_clip(const std::filesystem::path& path, const std::string& encode) {
  run_ffmpeg(colour_clip_inputs() + " " + encode + " " + quoted(path));
}

struct Rgb {
  double r = 0;
  double g = 0;
  double b = 0;
};
const Rgb kRed{255, 0, 0};
const Rgb kGreen{0, 255, 0};
const Rgb kBlue{0, 0, 255};
const Rgb kWhite{255, 255, 255};
const Rgb kBlack{0, 0, 0};
const Rgb kSecondColours[] = {kRed, kGreen, kBlue, kWhite};

// Mean colour of the box [x0, x1) x [y0, y1) of a packed RGB24 picture `width` pixels wide.
Rgb mean_rgb_box(const uint8_t* picture, int width, int x0, int y0, int x1, int y1) {
  Rgb sum;
  for (int y = y0; y < y1; ++y) {
    for (int x = x0; x < x1; ++x) {
      const uint8_t* px = picture + (static_cast<size_t>(y) * width + x) * 3;
      sum.r += px[0];
      sum.g += px[1];
      sum.b += px[2];
    }
  }
  const double n = static_cast<double>(x1 - x0) * (y1 - y0);
  return {sum.r / n, sum.g / n, sum.b / n};
}

const uint8_t* frame_pixels(const VideoFrames& frames, int64_t index) {
  return frames.rgb.data() + index * frames.height * frames.width * 3;
}

// Mean colour of frame `index` over columns [x0, x1) (all columns by default).
Rgb mean_rgb(const VideoFrames& frames, int64_t index, int x0 = 0, int x1 = -1) {
  if (x1 < 0) x1 = frames.width;
  return mean_rgb_box(frame_pixels(frames, index), frames.width, x0, 0, x1, frames.height);
}

// Mean colour of rows [y0, y1) of frame `index`.
Rgb mean_rgb_rows(const VideoFrames& frames, int64_t index, int y0, int y1) {
  return mean_rgb_box(frame_pixels(frames, index), frames.width, 0, y0, frames.width, y1);
}

::testing::AssertionResult near_colour(const Rgb& actual, const Rgb& expected) {
  if (std::abs(actual.r - expected.r) <= kColourTolerance &&
      std::abs(actual.g - expected.g) <= kColourTolerance &&
      std::abs(actual.b - expected.b) <= kColourTolerance) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << "mean RGB (" << actual.r << ", " << actual.g << ", " << actual.b << "), expected ("
         << expected.r << ", " << expected.g << ", " << expected.b << ") within "
         << kColourTolerance;
}

VideoDecodeOptions fps_options(double fps, int size = 32) {
  VideoDecodeOptions options;
  options.fps = fps;
  options.width = size;
  options.height = size;
  return options;
}

VideoDecodeOptions num_frames_options(int num_frames, int size = 32) {
  VideoDecodeOptions options;
  options.num_frames = num_frames;
  options.width = size;
  options.height = size;
  return options;
}

using Outcome = testing::MediaOutcome;
Outcome outcome_of(const std::filesystem::path& file, const VideoDecodeOptions& options) {
  return testing::media_outcome([&] { decode_video(file, options); });
}

// The colour clip decoded at 1 fps, checked second by second.
void expect_one_frame_per_colour(const std::filesystem::path& clip) {
  const VideoFrames frames = decode_video(clip, fps_options(1.0));
  ASSERT_EQ(frames.num_frames, 4);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kSecondColours[k])) << "frame " << k;
    EXPECT_NEAR(frames.timestamps[k], k + 0.5, kFramePeriod) << "frame " << k;
  }
}

TEST(VideoDecoder, FpsSamplingTakesTheFrameOnScreenAtEachIntervalCentre) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const VideoFrames frames = decode_video(clip, fps_options(1.0));
  ASSERT_EQ(frames.num_frames, 4);
  EXPECT_EQ(frames.timestamps.size(), 4u);
  EXPECT_NEAR(frames.duration_s, 4.0, 1e-6);
  EXPECT_EQ(frames.source_width, 160);
  EXPECT_EQ(frames.source_height, 120);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kSecondColours[k])) << "frame " << k;
    // The frame on screen at t = k + 0.5 starts at most one frame period earlier.
    EXPECT_LE(frames.timestamps[k], k + 0.5) << "frame " << k;
    EXPECT_GT(frames.timestamps[k], k + 0.5 - kFramePeriod) << "frame " << k;
  }
}

TEST(VideoDecoder, FpsSamplingAtTwoFramesPerSecondGivesTwoFramesPerColour) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const VideoFrames frames = decode_video(clip, fps_options(2.0));
  ASSERT_EQ(frames.num_frames, 8);
  for (int k = 0; k < 8; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kSecondColours[k / 2])) << "frame " << k;
    EXPECT_NEAR(frames.timestamps[k], (k + 0.5) * 0.5, kFramePeriod) << "frame " << k;
  }
}

TEST(VideoDecoder, NumFramesSpreadsFramesEvenlyOverTheClip) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const VideoFrames frames = decode_video(clip, num_frames_options(8));
  ASSERT_EQ(frames.num_frames, 8);
  ASSERT_EQ(frames.rgb.size(), 8u * 32 * 32 * 3);
  for (int k = 0; k < 8; ++k) {
    EXPECT_NEAR(frames.timestamps[k], (k + 0.5) * 0.5, kFramePeriod) << "frame " << k;
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kSecondColours[k / 2])) << "frame " << k;
  }
}

TEST(VideoDecoder, ShortClipRepeatsFramesToGiveNumFrames) {
  TempDir dir;
  const auto clip = dir / "three.mp4";
  run_ffmpeg(
      "-f lavfi -i color=c=0x00FF00:s=64x48:r=25 -frames:v 3 -c:v libx264 -pix_fmt yuv420p " +
      quoted(clip));
  const VideoFrames frames = decode_video(clip, num_frames_options(8));
  ASSERT_EQ(frames.num_frames, 8);
  // Frames at 0, 0.04 and 0.08 s; targets every 0.015 s from 0.0075 s.
  const double expected[8] = {0, 0, 0, 0.04, 0.04, 0.08, 0.08, 0.08};
  for (int k = 0; k < 8; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kGreen)) << "frame " << k;
    EXPECT_NEAR(frames.timestamps[k], expected[k], 1e-9) << "frame " << k;
  }
}

TEST(VideoDecoder, OneFrameVideoGivesCopiesOfItsFrame) {
  TempDir dir;
  const auto clip = dir / "one.mp4";
  run_ffmpeg(
      "-f lavfi -i color=c=0x0000FF:s=64x48:r=25 -frames:v 1 -c:v libx264 -pix_fmt yuv420p " +
      quoted(clip));
  const VideoFrames by_count = decode_video(clip, num_frames_options(4));
  ASSERT_EQ(by_count.num_frames, 4);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(by_count, k), kBlue)) << "frame " << k;
    EXPECT_DOUBLE_EQ(by_count.timestamps[k], 0.0);
  }
  const VideoFrames by_rate = decode_video(clip, fps_options(1.0));
  ASSERT_EQ(by_rate.num_frames, 1);
  EXPECT_TRUE(near_colour(mean_rgb(by_rate, 0), kBlue));
}

// A black picture with white bands over its first and last quarter along its long side.
void make_banded_picture(const std::filesystem::path& path, bool portrait) {
  const std::string bands = portrait ? "drawbox=x=0:y=0:w=240:h=160:color=white:t=fill,"
                                       "drawbox=x=0:y=480:w=240:h=160:color=white:t=fill"
                                     : "drawbox=x=0:y=0:w=160:h=240:color=white:t=fill,"
                                       "drawbox=x=480:y=0:w=160:h=240:color=white:t=fill";
  run_ffmpeg(std::string("-f lavfi -i color=c=black:s=") + (portrait ? "240x640" : "640x240") +
             ":r=25:d=0.2 -vf " + bands + " -c:v libx264 -pix_fmt yuv420p " + quoted(path));
}

TEST(VideoDecoder, ShorterSideCropKeepsOnlyTheCentreOfALandscapePicture) {
  TempDir dir;
  const auto clip = dir / "landscape.mp4";
  make_banded_picture(clip, /*portrait=*/false);
  VideoDecodeOptions options = num_frames_options(1, 64);
  options.resize = ResizeMode::kShorterSideCrop;
  const VideoFrames frames = decode_video(clip, options);
  // The centred 240x240 square lies between the bands.
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0, 0, 4), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0, 60, 64), kBlack));
}

TEST(VideoDecoder, StretchKeepsTheWholeLandscapePicture) {
  TempDir dir;
  const auto clip = dir / "landscape.mp4";
  make_banded_picture(clip, /*portrait=*/false);
  VideoDecodeOptions options = num_frames_options(1, 64);
  options.resize = ResizeMode::kStretch;
  const VideoFrames frames = decode_video(clip, options);
  // Each band becomes the outer 16 columns; away from the band edges they are white.
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0, 0, 12), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0, 52, 64), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0, 20, 44), kBlack));
}

TEST(VideoDecoder, CropAndStretchOfAPortraitPicture) {
  TempDir dir;
  const auto clip = dir / "portrait.mp4";
  make_banded_picture(clip, /*portrait=*/true);
  VideoDecodeOptions options = num_frames_options(1, 64);
  options.resize = ResizeMode::kShorterSideCrop;
  const VideoFrames cropped = decode_video(clip, options);
  EXPECT_TRUE(near_colour(mean_rgb(cropped, 0), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb_rows(cropped, 0, 0, 4), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb_rows(cropped, 0, 60, 64), kBlack));

  options.resize = ResizeMode::kStretch;
  const VideoFrames stretched = decode_video(clip, options);
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 0, 12), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 52, 64), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 20, 44), kBlack));
}

TEST(VideoDecoder, HdSourceScalesTo224Square) {
  TempDir dir;
  const auto clip = dir / "hd.mp4";
  run_ffmpeg("-f lavfi -i testsrc2=s=1280x720:r=25:d=0.5 -c:v libx264 -pix_fmt yuv420p " +
             quoted(clip));
  const VideoFrames frames = decode_video(clip, num_frames_options(3, 224));
  EXPECT_EQ(frames.num_frames, 3);
  EXPECT_EQ(frames.width, 224);
  EXPECT_EQ(frames.height, 224);
  EXPECT_EQ(frames.rgb.size(), 3u * 224 * 224 * 3);
  EXPECT_EQ(frames.source_width, 1280);
  EXPECT_EQ(frames.source_height, 720);
  EXPECT_EQ(frames.bytes(), frames.rgb.size() + 3 * sizeof(double));
}

TEST(VideoDecoder, OddSourceAndOutputSizes) {
  TempDir dir;
  const auto clip = dir / "odd.mp4";
  // 4:4:4, since 4:2:0 H.264 cannot have odd sizes.
  run_ffmpeg(
      "-f lavfi -i 'color=c=0x0000FF:s=320x240:r=25:d=0.2,scale=333:201,format=yuv444p' "
      "-c:v libx264 " +
      quoted(clip));
  for (const ResizeMode mode : {ResizeMode::kShorterSideCrop, ResizeMode::kStretch}) {
    VideoDecodeOptions options = num_frames_options(2);
    options.width = 97;
    options.height = 55;
    options.resize = mode;
    const VideoFrames frames = decode_video(clip, options);
    EXPECT_EQ(frames.source_width, 333);
    EXPECT_EQ(frames.source_height, 201);
    EXPECT_EQ(frames.width, 97);
    EXPECT_EQ(frames.height, 55);
    ASSERT_EQ(frames.rgb.size(), 2u * 97 * 55 * 3);
    EXPECT_TRUE(near_colour(mean_rgb(frames, 1), kBlue));
  }
}

TEST(VideoDecoder, DecodesH264) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  expect_one_frame_per_colour(clip);
}

TEST(VideoDecoder, DecodesVp9InWebm) {
  TempDir dir;
  const auto clip = dir / "colours.webm";
  make_colour_clip(clip, "-c:v libvpx-vp9 -pix_fmt yuv420p -deadline realtime -cpu-used 8");
  expect_one_frame_per_colour(clip);
}

TEST(VideoDecoder, DecodesMpeg4Part2InAvi) {
  TempDir dir;
  const auto clip = dir / "colours.avi";
  make_colour_clip(clip, "-c:v mpeg4 -q:v 2");
  expect_one_frame_per_colour(clip);
}

TEST(VideoDecoder, DecodesMpegTs) {
  TempDir dir;
  const auto clip = dir / "colours.ts";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  expect_one_frame_per_colour(clip);
}

// A mid-tone whose RGB values move by far more than the tolerance when a decoder's range is
// misread: (48, 112, 176).
const Rgb kMidTone{48, 112, 176};
constexpr const char* kMidToneSource = "-f lavfi -i color=c=0x3070B0:s=64x48:r=25:d=0.2";

TEST(VideoDecoder, LimitedRangeSourceGivesTheRightColours) {
  TempDir dir;
  const auto clip = dir / "limited.mp4";
  run_ffmpeg(std::string(kMidToneSource) + " -c:v libx264 -pix_fmt yuv420p -color_range tv " +
             quoted(clip));
  EXPECT_TRUE(near_colour(mean_rgb(decode_video(clip, num_frames_options(1)), 0), kMidTone));
}

TEST(VideoDecoder, FullRangeMjpegGivesTheRightColours) {
  TempDir dir;
  const auto clip = dir / "full.avi";
  run_ffmpeg(std::string(kMidToneSource) + " -c:v mjpeg -pix_fmt yuvj420p -q:v 2 " + quoted(clip));
  EXPECT_TRUE(near_colour(mean_rgb(decode_video(clip, num_frames_options(1)), 0), kMidTone));
}

TEST(VideoDecoder, FullRangeTaggedYuv420pGivesTheRightColours) {
  TempDir dir;
  const auto clip = dir / "full.webm";
  // VP9 keeps the format yuv420p and tags the frames full range.
  run_ffmpeg(std::string(kMidToneSource) +
             " -vf scale=out_range=full,format=yuv420p -color_range pc -c:v libvpx-vp9 "
             "-deadline realtime " +
             quoted(clip));
  EXPECT_TRUE(near_colour(mean_rgb(decode_video(clip, num_frames_options(1)), 0), kMidTone));
}

TEST(VideoDecoder, FrameSizeChangeMidStream) {
  TempDir dir;
  const auto first = dir / "first.ts";
  const auto second = dir / "second.ts";
  const auto joined = dir / "joined.ts";
  run_ffmpeg("-f lavfi -i color=c=0xFF0000:s=320x240:r=25:d=1 -c:v libx264 -pix_fmt yuv420p " +
             quoted(first));
  run_ffmpeg(
      "-f lavfi -i color=c=0x0000FF:s=160x200:r=25:d=1 -c:v libx264 -pix_fmt yuv420p "
      "-output_ts_offset 1 " +
      quoted(second));
  ASSERT_EQ(
      std::system(("cat " + quoted(first) + " " + quoted(second) + " > " + quoted(joined)).c_str()),
      0);
  const VideoFrames frames = decode_video(joined, num_frames_options(2));
  ASSERT_EQ(frames.num_frames, 2);
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0), kRed));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 1), kBlue));
}

TEST(VideoDecoder, DurationIsMeasuredWhenTheHeadersHaveNone) {
  TempDir dir;
  const auto clip = dir / "streamed.mkv";
  // Matroska written to a pipe has no duration in its header.
  run_ffmpeg(colour_clip_inputs() + " -c:v libx264 -pix_fmt yuv420p -f matroska pipe:1 > " +
             quoted(clip));
  expect_one_frame_per_colour(clip);
  EXPECT_NEAR(decode_video(clip, fps_options(1.0)).duration_s, 4.0, 2 * kFramePeriod);
}

TEST(VideoDecoder, TruncatedFileGivesTheFramesThatAreThere) {
  TempDir dir;
  const auto clip = dir / "pattern.mp4";
  run_ffmpeg(
      "-f lavfi -i testsrc2=s=320x240:r=25:d=4 -c:v libx264 -pix_fmt yuv420p "
      "-movflags +faststart " +
      quoted(clip));
  std::filesystem::resize_file(clip, std::filesystem::file_size(clip) / 2);
  // The header still says 4 s; targets past the cut repeat the last frame that decoded.
  const VideoFrames frames = decode_video(clip, num_frames_options(8));
  ASSERT_EQ(frames.num_frames, 8);
  EXPECT_NEAR(frames.timestamps[0], 0.25, kFramePeriod);
  EXPECT_LT(frames.timestamps[7], 3.0);
  EXPECT_EQ(frames.timestamps[7], frames.timestamps[6]);
}

TEST(VideoDecoder, CorruptBytesInTheMiddleAreTolerated) {
  TempDir dir;
  const auto clip = dir / "colours.ts";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  {
    std::fstream file(clip, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(static_cast<std::streamoff>(std::filesystem::file_size(clip) / 2));
    const std::string garbage(2000, '\x5a');
    file.write(garbage.data(), static_cast<std::streamsize>(garbage.size()));
  }
  const VideoFrames frames = decode_video(clip, fps_options(1.0));
  ASSERT_EQ(frames.num_frames, 4);
  EXPECT_TRUE(near_colour(mean_rgb(frames, 0), kRed));
  EXPECT_TRUE(near_colour(mean_rgb(frames, 3), kWhite));
}

TEST(VideoDecoder, DecoderThreadCountDoesNotChangeTheFrames) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  VideoDecodeOptions options = num_frames_options(8);
  options.threads = 1;
  const VideoFrames single = decode_video(clip, options);
  options.threads = 4;
  const VideoFrames threaded = decode_video(clip, options);
  EXPECT_EQ(single.rgb, threaded.rgb);
  EXPECT_EQ(single.timestamps, threaded.timestamps);
}

TEST(VideoDecoder, ConcurrentDecodesGiveTheSameFrames) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const VideoFrames expected = decode_video(clip, num_frames_options(8));
  std::vector<std::future<VideoFrames>> decodes;
  for (int i = 0; i < 4; ++i) {
    decodes.push_back(
        std::async(std::launch::async, [&] { return decode_video(clip, num_frames_options(8)); }));
  }
  for (auto& decode : decodes) EXPECT_EQ(decode.get().rgb, expected.rgb);
}

// The hook SamplePreparer hands files over to NVDEC with (Note [Handing a file over to NVDEC] in
// pipeline/stages/nvdec_handover.cpp): asked with how far the decode has read, it may give the
// file up, which is not a failure of the file.
TEST(VideoDecoder, GiveUpHookSeesTheDecodeAdvanceAndStopsItWhenAsked) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const VideoFrames expected = decode_video(clip, num_frames_options(8));

  // Never giving up: asked with a share of the file that only grows, within [0, 1], and the
  // clip's length; the frames are those of a decode without the hook.
  std::vector<double> asked;
  double asked_duration = -1.0;
  VideoDecodeOptions options = num_frames_options(8);
  options.give_up = [&](double done, double duration_s) {
    asked.push_back(done);
    asked_duration = duration_s;
    return false;
  };
  const VideoFrames kept_on = decode_video(clip, options);
  EXPECT_EQ(kept_on.rgb, expected.rgb);
  EXPECT_EQ(kept_on.timestamps, expected.timestamps);
  ASSERT_GT(asked.size(), 10u);
  EXPECT_TRUE(std::is_sorted(asked.begin(), asked.end()));
  EXPECT_GE(asked.front(), 0.0);
  EXPECT_LE(asked.back(), 1.0);
  EXPECT_GT(asked.back(), 0.5);
  EXPECT_NEAR(asked_duration, expected.duration_s, 1e-9);

  // Giving up halfway: DecodeGivenUp with the frames decoded until then, no MediaError.
  options.give_up = [](double done, double) { return done >= 0.5; };
  options.timeout_s = 100.0;
  int64_t decoded_before = -1;
  double seconds_left = -1.0;
  try {
    decode_video(clip, options);
    ADD_FAILURE() << "the decode went on after the hook gave it up";
  } catch (const DecodeGivenUp& given_up) {
    decoded_before = given_up.decoded_frames();
    seconds_left = given_up.seconds_left();  // of the file's limit, for the decode after
  }
  EXPECT_GT(decoded_before, 0);
  EXPECT_LT(decoded_before, expected.decoded_frames);
  EXPECT_LT(seconds_left, 100.0);
  EXPECT_GT(seconds_left, 90.0);

  // Giving up at once, before a frame.
  options.give_up = [](double, double) { return true; };
  EXPECT_THROW(decode_video(clip, options), DecodeGivenUp);
}

TEST(VideoDecoder, NameWithSpacesAndColonDecodes) {
  TempDir dir;
  const auto clip = dir / "my clip: take 1.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  expect_one_frame_per_colour(clip);
}

TEST(VideoDecoder, NamesThatLookLikeProtocolsDecodeWhenTheyAreFiles) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  for (const char* name : {"concat:colours.mp4", "file:x.mp4", "http:", "a:b.mp4", "été ✓.mp4"}) {
    std::filesystem::copy_file(clip, dir / name);
    expect_one_frame_per_colour(dir / name);
  }
}

// Entries as the manifest reader hands them over: resolved against its folder and normalised
// ("http://host/x" becomes "DIR/http:/host/x").
TEST(VideoDecoder, UrlsAndProtocolsAreRefusedAsSuch) {
  TempDir dir;
  make_colour_clip(dir / "a.mp4", "-c:v libx264 -pix_fmt yuv420p");
  const std::filesystem::path entries[] = {
      dir / "http:" / "example.com" / "a.mp4",
      dir / "https:" / "example.com" / "a.mp4",
      dir / "s3:" / "bucket" / "a.mp4",
      dir / "concat:a.mp4|a.mp4",
      dir / "file:a.mp4",
      dir / "pipe:",
      dir / "pipe:0",
      dir / "subfile:,start,0,end,0,:a.mp4",
  };
  for (const auto& entry : entries) {
    const Outcome outcome = outcome_of(entry, fps_options(1.0));
    EXPECT_EQ(outcome.category, "unreadable") << entry;
    EXPECT_NE(outcome.message.find("is a URL or FFmpeg protocol"), std::string::npos)
        << outcome.message;
  }
  // A missing file with a colon that names no protocol is just missing.
  EXPECT_EQ(outcome_of(dir / "take:2.mp4", fps_options(1.0)).category, "missing");
  EXPECT_EQ(outcome_of(dir / "no" / "http:x.mp4", fps_options(1.0)).category, "missing");
}

// Note [A member's header is read again before its bytes]: a member whose range no longer
// follows its own header (the tar was made again after it was indexed) is not decoded.
TEST(VideoDecoder, ATarMemberIsReadOnlyBehindItsOwnHeader) {
  TempDir dir;
  make_colour_clip(dir / "a.mp4", "-c:v libx264 -pix_fmt yuv420p");
  make_colour_clip(dir / "b.mp4", "-c:v libx264 -pix_fmt yuv420p -crf 40");
  const auto tar = dir / "t.tar";
  const std::string command = "cd " + testing::shell_quote(dir.path().string()) +
                              " && tar --format=ustar -cf t.tar a.mp4 b.mp4";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  const auto a_bytes = static_cast<int64_t>(std::filesystem::file_size(dir / "a.mp4"));
  const auto b_bytes = static_cast<int64_t>(std::filesystem::file_size(dir / "b.mp4"));
  ASSERT_NE(a_bytes, b_bytes);
  const int64_t a_at = 512;
  const int64_t b_at = a_at + (a_bytes + 511) / 512 * 512 + 512;

  // Where the index found it: decoded.
  const VideoFrames frames =
      decode_video(MediaSource(tar, "a.mp4", a_at, a_bytes), fps_options(1.0));
  EXPECT_EQ(frames.num_frames, 4);
  EXPECT_EQ(decode_video(MediaSource(tar, "b.mp4", b_at, b_bytes), fps_options(1.0)).num_frames,
            4);

  const auto refused = [&](int64_t at, int64_t bytes, const std::string& why) {
    const Outcome outcome = testing::media_outcome(
        [&] { decode_video(MediaSource(tar, "a.mp4", at, bytes), fps_options(1.0)); });
    EXPECT_EQ(outcome.category, "unreadable") << why;
    EXPECT_NE(outcome.message.find(why), std::string::npos) << outcome.message;
    EXPECT_NE(outcome.message.find("the tar changed since it was indexed"), std::string::npos)
        << outcome.message;
  };
  refused(b_at, b_bytes, "names another member");    // another member is there now
  refused(a_at, a_bytes - 1, "gives another size");  // a member of another size is there
  refused(a_at + 512, a_bytes - 512, "no valid tar header precedes its bytes");  // mid-data
  refused(0, a_bytes, "no tar header precedes its bytes");  // before the first header
}

TEST(VideoDecoder, MissingFileIsMissing) {
  TempDir dir;
  const auto path = dir / "nope.mp4";
  const Outcome outcome = outcome_of(path, fps_options(1.0));
  EXPECT_EQ(outcome.category, "missing");
  EXPECT_NE(outcome.message.find(path.string()), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, DirectoryIsUnreadable) {
  TempDir dir;
  std::filesystem::create_directory(dir / "folder.mp4");
  const Outcome outcome = outcome_of(dir / "folder.mp4", fps_options(1.0));
  EXPECT_EQ(outcome.category, "unreadable");
  EXPECT_NE(outcome.message.find("a directory"), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, DevZeroIsUnreadableWithoutReading) {
  auto outcome =
      std::async(std::launch::async, [] { return outcome_of("/dev/zero", fps_options(1.0)); });
  ASSERT_EQ(outcome.wait_for(std::chrono::seconds(20)), std::future_status::ready)
      << "decode_video read /dev/zero";
  const Outcome result = outcome.get();
  EXPECT_EQ(result.category, "unreadable");
  EXPECT_NE(result.message.find("a character device"), std::string::npos) << result.message;
}

TEST(VideoDecoder, SymlinkToDevZeroIsUnreadable) {
  TempDir dir;
  std::filesystem::create_symlink("/dev/zero", dir / "zero.mp4");
  EXPECT_EQ(outcome_of(dir / "zero.mp4", fps_options(1.0)).category, "unreadable");
}

TEST(VideoDecoder, SymlinkToAClipDecodes) {
  TempDir dir;
  make_colour_clip(dir / "colours.mp4", "-c:v libx264 -pix_fmt yuv420p");
  std::filesystem::create_symlink(dir / "colours.mp4", dir / "link.mp4");
  expect_one_frame_per_colour(dir / "link.mp4");
}

TEST(VideoDecoder, SocketIsUnreadable) {
  TempDir dir;
  const auto path = dir / "socket.mp4";
  const int fd = ::socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  ASSERT_LT(path.string().size(), sizeof(address.sun_path));
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  const Outcome outcome = outcome_of(path, fps_options(1.0));
  ::close(fd);
  EXPECT_EQ(outcome.category, "unreadable");
  EXPECT_NE(outcome.message.find("a socket"), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, FileOverMaxFileBytesIsTooLarge) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  const auto size = static_cast<int64_t>(std::filesystem::file_size(clip));
  VideoDecodeOptions options = fps_options(1.0);
  options.max_file_bytes = size - 1;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "too_large");
  for (const std::string& part : {clip.string(), std::to_string(size), std::to_string(size - 1),
                                  std::string("run.max_file_bytes")}) {
    EXPECT_NE(outcome.message.find(part), std::string::npos) << part << ": " << outcome.message;
  }
  options.max_file_bytes = size;
  EXPECT_EQ(decode_video(clip, options).num_frames, 4);
}

TEST(VideoDecoder, PassedDeadlineIsATimeout) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  VideoDecodeOptions options = fps_options(1.0);
  // Over before FFmpeg reads its first byte: the read and interrupt callbacks stop it.
  options.timeout_s = 1e-9;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "timeout") << outcome.message;
  EXPECT_NE(outcome.message.find(clip.string()), std::string::npos) << outcome.message;
  EXPECT_NE(outcome.message.find("run.sample_timeout_s"), std::string::npos) << outcome.message;
  options.timeout_s = 1e300;  // "never", without overflowing the clock
  EXPECT_EQ(decode_video(clip, options).num_frames, 4);
}

// 20 s of 320x240 at 25 fps (500 frames): decoding it takes far longer than opening it.
std::filesystem::path long_clip(const TempDir& dir) {
  const auto clip = dir / "long.mp4";
  run_ffmpeg("-f lavfi -i testsrc2=s=320x240:r=25:d=20 -c:v libx264 -preset ultrafast " +
             quoted(clip));
  return clip;
}

TEST(VideoDecoder, DeadlineStopsALongDecode) {
  TempDir dir;
  const auto clip = long_clip(dir);
  VideoDecodeOptions options = num_frames_options(8);
  // Opening takes a few milliseconds and decoding 500 frames far longer, so the deadline
  // passes while packets are being read or decoded (or, on a very slow machine, while opening:
  // a timeout either way).
  options.timeout_s = 0.02;
  const auto start = std::chrono::steady_clock::now();
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "timeout") << outcome.message;
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));
}

// A run that drops its early decodes (Note [Decoding while the encoders load]) cuts every decode
// under way short at its next check, whatever its own limit. In a child process: the cut is for
// the rest of the process.
TEST(VideoDecoder, DecodesCutShortEndAtTheNextCheck) {
  TempDir dir;
  const auto clip = long_clip(dir);
  VideoDecodeOptions options = num_frames_options(8);
  options.timeout_s = 1e300;  // never
  EXPECT_EXIT(
      {
        std::thread cut([] {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          cut_decodes_short();
        });
        const Outcome outcome = outcome_of(clip, options);
        cut.join();
        const bool ok = outcome.category == "timeout" &&
                        outcome.message.find("the run's end") != std::string::npos;
        std::_Exit(ok ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "");
}

// Note [Paused runs]: a deadline counts from the last resume of a stopped process, so time
// spent stopped never turns into a timeout; a real hang is still caught one limit later.
TEST(Deadline, CountsFromTheLastResume) {
  const ffmpeg::Deadline deadline(0.05);
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_TRUE(deadline.passed());
  mark_resume(steady_now_ns());  // what the SIGCONT handler does
  EXPECT_FALSE(deadline.passed());
  std::this_thread::sleep_for(std::chrono::milliseconds(80));
  EXPECT_TRUE(deadline.passed());
}

TEST(Deadline, AWatchdogTickFarPastItsPeriodIsAResume) {
  const int64_t period = 200'000'000;
  const int64_t stall = 3'000'000'000;
  int64_t previous = 0;
  // In the past, so that the resumes it marks change no other test's deadlines.
  const int64_t start = steady_now_ns() - 60'000'000'000;
  EXPECT_FALSE(note_tick(start, previous, period, stall));  // the first tick
  EXPECT_FALSE(note_tick(start + 2'000'000'000, previous, period, stall));  // a busy machine
  EXPECT_TRUE(note_tick(start + 10'000'000'000, previous, period, stall));  // stopped for 8 s
  EXPECT_EQ(previous, start + 10'000'000'000);
  EXPECT_FALSE(note_tick(start + 10'200'000'000, previous, period, stall));
}

TEST(VideoDecoder, DecodingOverMaxDecodedFramesIsTooLong) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  // The last target is at 3.5 s: frames are decoded up to the first one past it, the 89th.
  VideoDecodeOptions options = fps_options(1.0);
  options.seek = false;  // every frame through the decoder (each colour change is a keyframe)
  options.max_decoded_frames = 80;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "too_long");
  EXPECT_NE(outcome.message.find("video.max_decoded_frames"), std::string::npos) << outcome.message;
  options.max_decoded_frames = 100;
  EXPECT_EQ(decode_video(clip, options).num_frames, 4);
}

TEST(VideoDecoder, FifoIsUnreadableWithoutBlocking) {
  TempDir dir;
  const auto fifo = dir / "pipe.mp4";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  auto outcome = std::async(std::launch::async, [&] { return outcome_of(fifo, fps_options(1.0)); });
  if (outcome.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    // Unblock the reader so that the test ends, then fail.
    const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
    if (fd >= 0) ::close(fd);
    ADD_FAILURE() << "decode_video blocked on a FIFO";
  }
  const Outcome result = outcome.get();
  EXPECT_EQ(result.category, "unreadable");
  EXPECT_NE(result.message.find("FIFO"), std::string::npos) << result.message;
}

TEST(VideoDecoder, UnreadableFileIsUnreadable) {
  if (::geteuid() == 0) GTEST_SKIP() << "root reads files whatever their permissions";
  TempDir dir;
  const auto clip = dir / "locked.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  std::filesystem::permissions(clip, std::filesystem::perms::none);
  EXPECT_EQ(outcome_of(clip, fps_options(1.0)).category, "unreadable");
}

TEST(VideoDecoder, GarbageBytesAreADecodeError) {
  TempDir dir;
  const auto path = dir / "garbage.mp4";
  {
    std::mt19937 random(12345);
    std::ofstream out(path, std::ios::binary);
    for (int i = 0; i < 64 * 1024; ++i) out.put(static_cast<char>(random() & 0xFF));
  }
  const Outcome outcome = outcome_of(path, fps_options(1.0));
  EXPECT_EQ(outcome.category, "decode_error") << outcome.message;
  EXPECT_NE(outcome.message.find(path.string()), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, PlaylistRenamedMp4IsNotFollowed) {
  TempDir dir;
  make_colour_clip(dir / "target.ts", "-c:v libx264 -pix_fmt yuv420p");
  const auto playlist = dir / "playlist.mp4";
  {
    std::ofstream out(playlist);
    out << "#EXTM3U\n#EXT-X-VERSION:3\n#EXT-X-TARGETDURATION:4\n#EXTINF:4.0,\n"
        << (dir / "target.ts").string() << "\n#EXT-X-ENDLIST\n";
  }
  EXPECT_EQ(outcome_of(playlist, fps_options(1.0)).category, "decode_error");
}

TEST(VideoDecoder, AudioOnlyFileHasNoVideoStream) {
  TempDir dir;
  const auto path = dir / "sine.m4a";
  run_ffmpeg("-f lavfi -i sine=frequency=440:duration=1 -c:a aac " + quoted(path));
  const Outcome outcome = outcome_of(path, fps_options(1.0));
  EXPECT_EQ(outcome.category, "no_stream");
  EXPECT_NE(outcome.message.find("no video stream"), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, CoverArtIsNotAVideo) {
  TempDir dir;
  const auto path = dir / "song.mp3";
  run_ffmpeg(
      "-f lavfi -i sine=frequency=440:duration=1 -f lavfi -i color=c=red:s=64x64:d=1 "
      "-map 0:a -map 1:v -frames:v 1 -c:v png -disposition:v attached_pic -c:a libmp3lame " +
      quoted(path));
  EXPECT_EQ(outcome_of(path, fps_options(1.0)).category, "no_stream");
}

TEST(VideoDecoder, ClipOverMaxDurationIsTooLong) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  VideoDecodeOptions options = fps_options(1.0);
  options.max_duration_s = 2.0;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "too_long");
  EXPECT_NE(outcome.message.find("video.max_duration_s"), std::string::npos) << outcome.message;
}

TEST(VideoDecoder, FpsSamplingOverMaxFramesIsTooLong) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  VideoDecodeOptions options = fps_options(10.0);
  options.max_frames = 39;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "too_long");
  EXPECT_NE(outcome.message.find("video.max_frames"), std::string::npos) << outcome.message;
  options.max_frames = 40;
  EXPECT_EQ(decode_video(clip, options).num_frames, 40);
}

TEST(VideoDecoder, PictureOverMaxPixelsIsTooLarge) {
  TempDir dir;
  const auto clip = dir / "colours.mp4";
  make_colour_clip(clip, "-c:v libx264 -pix_fmt yuv420p");
  VideoDecodeOptions options = fps_options(1.0);
  options.max_pixels = 160 * 120 - 1;
  const Outcome outcome = outcome_of(clip, options);
  EXPECT_EQ(outcome.category, "too_large");
  EXPECT_NE(outcome.message.find("video.max_pixels"), std::string::npos) << outcome.message;
  options.max_pixels = 160 * 120;
  EXPECT_EQ(decode_video(clip, options).num_frames, 4);
}

// The ffmpeg CLI's own decode of `clip` to packed RGB24, all frames, after `filters` when given.
std::vector<uint8_t> cli_rgb24(const std::filesystem::path& clip, const std::string& filters = "") {
  const auto raw = clip.parent_path() / (clip.filename().string() + ".rgb");
  run_ffmpeg("-i " + quoted(clip) + (filters.empty() ? "" : " -vf " + filters) +
             " -pix_fmt rgb24 -f rawvideo " + quoted(raw));
  std::ifstream in(raw, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// One second at 25 fps of 64x48 solid colours, 0.2 s each: red, green, blue, white, grey.
void make_rgb_colour_clip(const std::filesystem::path& path, const std::string& encode) {
  std::string inputs;
  for (const char* colour : {"0xFF0000", "0x00FF00", "0x0000FF", "0xFFFFFF", "0x808080"}) {
    inputs += std::string(" -f lavfi -i color=c=") + colour + ":s=64x48:r=25:d=0.2";
  }
  run_ffmpeg(inputs + " -filter_complex '[0][1][2][3][4]concat=n=5:v=1:a=0' " + encode + " " +
             quoted(path));
}

// The clip's five colours, scaled (so that libswscale converts through its internal YUV), match
// what the ffmpeg CLI decodes the same frames to, within rounding.
void expect_cli_colours(const std::filesystem::path& clip) {
  constexpr int kWidth = 64;
  constexpr int kHeight = 48;
  constexpr size_t kFrameBytes = size_t{3} * kWidth * kHeight;
  const std::vector<uint8_t> reference = cli_rgb24(clip);
  ASSERT_EQ(reference.size(), 25 * kFrameBytes);
  const VideoFrames frames = decode_video(clip, num_frames_options(5));
  ASSERT_EQ(frames.num_frames, 5);
  for (int k = 0; k < 5; ++k) {
    const auto number = static_cast<size_t>(std::lround(frames.timestamps[k] * 25));
    ASSERT_LT(number, 25u) << "frame " << k;
    const Rgb expected =
        mean_rgb_box(reference.data() + number * kFrameBytes, kWidth, 0, 0, kWidth, kHeight);
    const Rgb actual = mean_rgb(frames, k);
    EXPECT_NEAR(actual.r, expected.r, 2.0) << "frame " << k;
    EXPECT_NEAR(actual.g, expected.g, 2.0) << "frame " << k;
    EXPECT_NEAR(actual.b, expected.b, 2.0) << "frame " << k;
  }
  // Pure green is the colour a YUV matrix mix-up moves most.
  EXPECT_GE(mean_rgb(frames, 1).g, 250.0);
}

TEST(VideoDecoder, Ffv1RgbGivesTheColoursTheFfmpegCliGives) {
  TempDir dir;
  const auto clip = dir / "rgb.mkv";
  make_rgb_colour_clip(clip, "-c:v ffv1 -pix_fmt gbrp");
  expect_cli_colours(clip);
}

TEST(VideoDecoder, X264RgbGivesTheColoursTheFfmpegCliGives) {
  TempDir dir;
  const auto clip = dir / "rgb.mkv";
  make_rgb_colour_clip(clip, "-c:v libx264rgb -pix_fmt gbrp");
  expect_cli_colours(clip);
}

TEST(VideoDecoder, Vp9GbrpGivesTheColoursTheFfmpegCliGives) {
  TempDir dir;
  const auto clip = dir / "rgb.webm";
  make_rgb_colour_clip(clip, "-c:v libvpx-vp9 -pix_fmt gbrp -deadline realtime -cpu-used 8");
  expect_cli_colours(clip);
}

TEST(VideoDecoder, PalettedVideoGivesTheColoursTheFfmpegCliGives) {
  TempDir dir;
  const auto clip = dir / "pal8.mkv";
  make_rgb_colour_clip(clip, "-c:v png -pix_fmt pal8");
  expect_cli_colours(clip);
}

// Copies the MP4 `from` to `to`, tagged to be shown turned by `degrees`. The ffmpeg 5.1 CLI
// honours the rotate tag only when copying the stream, and writes it as a display matrix turning
// that many degrees counterclockwise (ffprobe: rotation=N).
void tag_rotation(const std::filesystem::path& from, const std::filesystem::path& to, int degrees) {
  run_ffmpeg("-i " + quoted(from) + " -c copy -metadata:s:v:0 rotate=" + std::to_string(degrees) +
             " " + quoted(to));
}

// A 64x48 picture in four quadrants, as MP4: red top left, green top right, blue bottom left,
// white bottom right. Every quarter turn and mirror of it is different.
void make_quadrant_clip(const std::filesystem::path& path) {
  run_ffmpeg(
      "-f lavfi -i 'color=c=red:s=64x48:r=25:d=0.2,"
      "drawbox=x=32:y=0:w=32:h=24:color=0x00FF00:t=fill,"
      "drawbox=x=0:y=24:w=32:h=24:color=blue:t=fill,"
      "drawbox=x=32:y=24:w=32:h=24:color=white:t=fill' "
      "-c:v libx264 -pix_fmt yuv444p " +
      quoted(path));
}

// The colours of the four quadrants of a width x height RGB24 picture, as "TL TR/BL BR" letters
// (R, G, B, W; ? for anything else), each read away from the quadrant's edges.
std::string quadrant_letters(const uint8_t* picture, int width, int height) {
  std::string letters;
  for (int qy = 0; qy < 2; ++qy) {
    if (qy == 1) letters += '/';
    for (int qx = 0; qx < 2; ++qx) {
      const int x0 = qx * width / 2;
      const int y0 = qy * height / 2;
      const Rgb mean = mean_rgb_box(picture, width, x0 + width / 8, y0 + height / 8,
                                    x0 + 3 * width / 8, y0 + 3 * height / 8);
      const bool r = mean.r > 200;
      const bool g = mean.g > 200;
      const bool b = mean.b > 200;
      const bool dark_r = mean.r < 55;
      const bool dark_g = mean.g < 55;
      const bool dark_b = mean.b < 55;
      char letter = '?';
      if (r && dark_g && dark_b) letter = 'R';
      if (dark_r && g && dark_b) letter = 'G';
      if (dark_r && dark_g && b) letter = 'B';
      if (r && g && b) letter = 'W';
      letters += letter;
    }
  }
  return letters;
}

std::string quadrant_letters(const VideoFrames& frames, int64_t index = 0) {
  return quadrant_letters(frame_pixels(frames, index), frames.width, frames.height);
}

// The quadrants as the ffmpeg CLI shows the clip: it applies the display matrix itself.
std::string cli_quadrant_letters(const std::filesystem::path& clip) {
  const std::vector<uint8_t> picture = cli_rgb24(clip, "scale=32:32");
  if (picture.size() < size_t{32} * 32 * 3) return "(no picture)";
  return quadrant_letters(picture.data(), 32, 32);
}

// Writes the display matrix of the first track of an MP4 made by FFmpeg: its 2x2 part (a, b; c,
// d) as whole numbers, no translation. The ffmpeg 5.1 CLI can only tag turns (rotate=N), not
// mirrors; the matrix lives at a fixed place in a version-0 'tkhd' box.
void set_mp4_display_matrix(const std::filesystem::path& path, int a, int b, int c, int d) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  std::string bytes{std::istreambuf_iterator<char>(file), std::istreambuf_iterator<char>()};
  const size_t box = bytes.find("tkhd");
  ASSERT_NE(box, std::string::npos);
  ASSERT_EQ(bytes[box + 4], '\0') << "not a version-0 tkhd";
  // After the type: version and flags, creation and modification times, track id, reserved,
  // duration, 8 reserved, layer, alternate group, volume, reserved: 44 bytes.
  const int32_t matrix[9] = {a << 16, b << 16, 0, c << 16, d << 16, 0, 0, 0, 1 << 30};
  std::string encoded;
  for (const int32_t value : matrix) {
    const auto u = static_cast<uint32_t>(value);
    for (int shift = 24; shift >= 0; shift -= 8) encoded += static_cast<char>((u >> shift) & 0xFF);
  }
  file.clear();
  file.seekp(static_cast<std::streamoff>(box + 44));
  file.write(encoded.data(), static_cast<std::streamsize>(encoded.size()));
  ASSERT_TRUE(file.good());
}

VideoDecodeOptions stretch_options(int size = 32) {
  VideoDecodeOptions options = num_frames_options(1, size);
  options.resize = ResizeMode::kStretch;
  return options;
}

TEST(VideoDecoder, QuarterTurnsOfTheDisplayMatrixAreApplied) {
  TempDir dir;
  const auto plain = dir / "plain.mp4";
  make_quadrant_clip(plain);
  // Counterclockwise turns.
  const std::pair<int, const char*> turns[] = {{90, "GW/RB"}, {180, "WB/GR"}, {270, "BR/WG"}};
  for (const auto& [degrees, expected] : turns) {
    const auto clip = dir / ("turned" + std::to_string(degrees) + ".mp4");
    tag_rotation(plain, clip, degrees);
    const VideoFrames frames = decode_video(clip, stretch_options());
    EXPECT_EQ(quadrant_letters(frames), expected) << degrees << " degrees";
    EXPECT_EQ(quadrant_letters(frames), cli_quadrant_letters(clip)) << degrees << " degrees";
    EXPECT_EQ(frames.source_width, 64);  // the coded size, for records
    EXPECT_EQ(frames.source_height, 48);
  }
}

TEST(VideoDecoder, MirrorsInTheDisplayMatrixAreApplied) {
  TempDir dir;
  const auto plain = dir / "plain.mp4";
  make_quadrant_clip(plain);
  struct Case {
    int a, b, c, d;
    const char* expected;
  };
  const Case cases[] = {
      {-1, 0, 0, 1, "GR/WB"},   // mirrored left to right
      {1, 0, 0, -1, "BW/RG"},   // mirrored top to bottom
      {0, 1, 1, 0, "RB/GW"},    // transposed: a quarter turn and a mirror
      {0, -1, -1, 0, "WG/BR"},  // the other diagonal
  };
  int n = 0;
  for (const Case& m : cases) {
    const auto clip = dir / ("mirrored" + std::to_string(n++) + ".mp4");
    std::filesystem::copy_file(plain, clip);
    set_mp4_display_matrix(clip, m.a, m.b, m.c, m.d);
    const VideoFrames frames = decode_video(clip, stretch_options());
    const std::string label = std::to_string(m.a) + " " + std::to_string(m.b) + " " +
                              std::to_string(m.c) + " " + std::to_string(m.d);
    EXPECT_EQ(quadrant_letters(frames), m.expected) << label;
    EXPECT_EQ(quadrant_letters(frames), cli_quadrant_letters(clip)) << label;
  }
}

TEST(VideoDecoder, AutorotateOffKeepsTheCodedOrientation) {
  TempDir dir;
  const auto plain = dir / "plain.mp4";
  const auto clip = dir / "turned.mp4";
  make_quadrant_clip(plain);
  tag_rotation(plain, clip, 90);
  VideoDecodeOptions options = stretch_options();
  options.autorotate = false;
  EXPECT_EQ(quadrant_letters(decode_video(clip, options)), "RG/BW");
  options.autorotate = true;
  EXPECT_EQ(quadrant_letters(decode_video(clip, options)), "GW/RB");
}

TEST(VideoDecoder, CropIsTakenFromTheDisplayedPicture) {
  TempDir dir;
  const auto plain = dir / "plain.mp4";
  const auto clip = dir / "turned.mp4";
  // Coded 640x240 with white bands over its left and right quarters; shown 240x640, the bands
  // at the top and bottom.
  make_banded_picture(plain, /*portrait=*/false);
  tag_rotation(plain, clip, 90);
  VideoDecodeOptions options = num_frames_options(1);
  options.width = 32;
  options.height = 64;
  options.resize = ResizeMode::kShorterSideCrop;
  const VideoFrames frames = decode_video(clip, options);
  ASSERT_EQ(frames.rgb.size(), 64u * 32 * 3);
  // The centred 240x480 of the displayed picture: rows 80 to 560, the bands' inner 80 rows at
  // either end, about 10.7 output rows each.
  EXPECT_TRUE(near_colour(mean_rgb_rows(frames, 0, 0, 8), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb_rows(frames, 0, 14, 50), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb_rows(frames, 0, 56, 64), kWhite));

  options.resize = ResizeMode::kStretch;
  const VideoFrames stretched = decode_video(clip, options);
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 0, 12), kWhite));
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 20, 44), kBlack));
  EXPECT_TRUE(near_colour(mean_rgb_rows(stretched, 0, 52, 64), kWhite));
}

TEST(VideoDecoder, TimestampsAreOnTheContainersClock) {
  TempDir dir;
  const auto colours = dir / "colours.mp4";
  const auto clip = dir / "late.mp4";
  make_colour_clip(colours, "-c:v libx264 -pix_fmt yuv420p");
  // The video starts 1 s after the audio, which starts the container's clock.
  run_ffmpeg("-f lavfi -i sine=frequency=440:sample_rate=44100:duration=5 -itsoffset 1 -i " +
             quoted(colours) + " -map 0:a -map 1:v -c:v copy -c:a aac " + quoted(clip));
  const VideoFrames frames = decode_video(clip, fps_options(1.0));
  // Sampling is still over the video's own 4 s: one frame per colour.
  ASSERT_EQ(frames.num_frames, 4);
  for (int k = 0; k < 4; ++k) {
    EXPECT_TRUE(near_colour(mean_rgb(frames, k), kSecondColours[k])) << "frame " << k;
    EXPECT_NEAR(frames.timestamps[k], 1.0 + k + 0.5, kFramePeriod) << "frame " << k;
  }
}

// A clip whose every frame has a colour of its own, so that a test can read which frames were
// kept: 4 s at 10 fps; frame n has the levels 32 + 64 * d of its base-4 digits d, the first in
// red, the second in green, the third in blue (64 levels apart: far past what coding moves).
constexpr int kNumberedFrames = 40;
constexpr int kNumberedRate = 10;
constexpr const char* kNumberedClip =
    "-f lavfi -i \"color=c=black:s=64x48:r=10:d=4,format=gbrp,"
    "geq=r='32+64*mod(N\\,4)':g='32+64*mod(floor(N/4)\\,4)':b='32+64*mod(floor(N/16)\\,4)'\"";

// The number of the numbered clip's frame that slot `index` shows; -1 when its colour is no
// frame's.
int numbered_frame(const VideoFrames& frames, int64_t index) {
  const Rgb colour = mean_rgb(frames, index);
  int number = 0;
  int weight = 1;
  for (const double level : {colour.r, colour.g, colour.b}) {
    const long digit = std::lround((level - 32) / 64);
    if (digit < 0 || digit > 3 || std::abs(level - static_cast<double>(32 + 64 * digit)) > 16) {
      return -1;
    }
    number += static_cast<int>(digit) * weight;
    weight *= 4;
  }
  return number;
}

// Note [Sampling frames]: the numbered clip's frames on screen at the interval centres, worked
// out here in whole numbers: with num_frames n, t_k = (2k + 1) * 4 s / 2n; at fps f,
// ceil(4 * f) frames at t_k = (2k + 1) / 2f.
std::vector<int> numbered_frames_sampled(const VideoDecodeOptions& options) {
  std::vector<int> numbers;
  if (options.num_frames > 0) {
    for (int k = 0; k < options.num_frames; ++k) {
      numbers.push_back((2 * k + 1) * kNumberedFrames / (2 * options.num_frames));
    }
    return numbers;
  }
  const auto fps = static_cast<int>(options.fps);
  const int count = (kNumberedFrames * fps + kNumberedRate - 1) / kNumberedRate;
  for (int k = 0; k < count; ++k) {
    numbers.push_back(std::min(kNumberedFrames - 1, (2 * k + 1) * kNumberedRate / (2 * fps)));
  }
  return numbers;
}

// Checks that `frames`, decoded from the numbered clip with `options`, are the frames on screen
// at the sampled times, stamped with their own times plus `clip_start` on the sample clock.
void expect_numbered_frames(const VideoFrames& frames, const VideoDecodeOptions& options,
                            double clip_start, const std::string& what) {
  const std::vector<int> expected = numbered_frames_sampled(options);
  std::vector<double> expected_times;
  for (const int number : expected) {
    expected_times.push_back(clip_start + static_cast<double>(number) / kNumberedRate);
  }
  std::vector<int> got;
  for (int64_t k = 0; k < frames.num_frames; ++k) got.push_back(numbered_frame(frames, k));
  const std::string sampling =
      what + (options.num_frames > 0 ? ", num_frames " + std::to_string(options.num_frames)
                                     : ", fps " + std::to_string(options.fps));
  EXPECT_NEAR(frames.duration_s, 4.0, 1e-6) << sampling;
  EXPECT_EQ(got, expected) << sampling << ": the frames kept";
  ASSERT_EQ(frames.timestamps.size(), expected_times.size()) << sampling;
  for (size_t k = 0; k < expected_times.size(); ++k) {
    if (std::abs(frames.timestamps[k] - expected_times[k]) > 1e-9) {
      ADD_FAILURE() << sampling << ": timestamps " << ::testing::PrintToString(frames.timestamps)
                    << ", expected " << ::testing::PrintToString(expected_times);
      break;
    }
  }
}

// Note [Sample clock] in ffmpeg_common.hpp and Note [Stream durations] in ffmpeg_common.cpp:
// the same coded frames give the same frames and timestamps in every container, whether the
// file starts at 0 or 1.5 s in (the origin of the timestamps is the file's start; durations and
// sampled times count from the stream's start). Matroska states no duration per stream, only
// its Segment's, which runs from time 0: counted from the stream's start instead, it would
// sample a clip that starts 1.5 s in over 5.5 s, the wrong frames and the last one repeated.
struct ContainerCase {
  const char* name;
  const char* encode;                   // ffmpeg output options of the coded frames
  const char* first;                    // the file they are coded into
  std::vector<const char*> containers;  // the files they are copied into
};

void PrintTo(const ContainerCase& c, std::ostream* out) { *out << c.name; }

class VideoDecoderContainers : public ::testing::TestWithParam<ContainerCase> {};

TEST_P(VideoDecoderContainers, SameFramesAndTimestampsInEveryContainerAndStart) {
  const ContainerCase& c = GetParam();
  TempDir dir;
  const auto coded = dir / c.first;
  run_ffmpeg(std::string(kNumberedClip) + " " + c.encode + " " + quoted(coded));
  for (const char* container : c.containers) {
    for (const double start : {0.0, 1.5}) {
      const auto file = dir / (std::to_string(start) + "." + container);
      run_ffmpeg("-i " + quoted(coded) + " -c copy -output_ts_offset " + std::to_string(start) +
                 " " + quoted(file));
      for (const VideoDecodeOptions& options :
           {num_frames_options(7), num_frames_options(3), fps_options(2.0), fps_options(3.0)}) {
        expect_numbered_frames(decode_video(file, options), options, 0.0, file.filename().string());
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Codecs, VideoDecoderContainers,
    ::testing::Values(
        ContainerCase{"h264",
                      "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=10:bframes=2",
                      "coded.mp4",
                      {"mp4", "mkv"}},
        ContainerCase{"vp9",
                      "-c:v libvpx-vp9 -g 10 -deadline realtime -cpu-used 8 -crf 20 -b:v 0",
                      "coded.webm",
                      {"mp4", "mkv", "webm"}}),
    [](const ::testing::TestParamInfo<ContainerCase>& info) {
      return std::string(info.param.name);
    });

// A video that starts 1.5 s after its audio, in one file: sampled over its own 4 s, its frames
// stamped from the audio's start, in Matroska as in MP4. (The audio is FLAC, which has no
// encoder delay that would move either stream.)
TEST(VideoDecoderContainers, VideoStartingAfterItsAudioIsSampledOverItsOwnSpan) {
  TempDir dir;
  const auto coded = dir / "coded.mp4";
  run_ffmpeg(std::string(kNumberedClip) +
             " -c:v libx264 -pix_fmt yuv420p -x264-params keyint=10:bframes=2 " + quoted(coded));
  for (const char* container : {"mp4", "mkv"}) {
    const auto file = dir / (std::string("late.") + container);
    run_ffmpeg("-f lavfi -i sine=frequency=440:sample_rate=48000:duration=3 -itsoffset 1.5 -i " +
               quoted(coded) + " -map 0:a -map 1:v -c:v copy -c:a flac -strict -2 " + quoted(file));
    for (const VideoDecodeOptions& options : {num_frames_options(7), fps_options(2.0)}) {
      expect_numbered_frames(decode_video(file, options), options, 1.5, file.filename().string());
    }
  }
}

TEST(VideoDecoder, OptionsCopyTheConfigSection) {
  VideoSection section;
  section.fps = 2.5;
  section.num_frames = 0;
  section.height = 112;
  section.width = 160;
  section.resize = ResizeMode::kStretch;
  section.max_duration_s = 60;
  section.max_frames = 77;
  section.decoder_threads = 3;
  section.max_pixels = 1234;
  section.max_decoded_frames = 567;
  section.autorotate = false;
  section.seek = false;
  RunSection run;
  run.sample_timeout_s = 8.5;
  run.max_file_bytes = 999;
  const VideoDecodeOptions options = video_decode_options(section, run);
  EXPECT_EQ(options.fps, 2.5);
  EXPECT_EQ(options.num_frames, 0);
  EXPECT_EQ(options.height, 112);
  EXPECT_EQ(options.width, 160);
  EXPECT_EQ(options.resize, ResizeMode::kStretch);
  EXPECT_EQ(options.max_duration_s, 60);
  EXPECT_EQ(options.max_frames, 77);
  EXPECT_EQ(options.threads, 3);
  EXPECT_EQ(options.max_pixels, 1234);
  EXPECT_EQ(options.max_decoded_frames, 567);
  EXPECT_EQ(options.timeout_s, 8.5);
  EXPECT_EQ(options.max_file_bytes, 999);
  EXPECT_FALSE(options.autorotate);
  EXPECT_TRUE(video_decode_options(VideoSection{}, run).autorotate);
  EXPECT_FALSE(options.seek);
  EXPECT_TRUE(video_decode_options(VideoSection{}, run).seek);
}

// Note [Seeking to what is sampled]: the frames kept with seeking are bit for bit those of a
// full decode, timestamps included, for every GOP structure and container below; and where the
// container has an index and keyframes lie between targets, seeking does happen and decodes
// fewer frames.
struct SeekCase {
  const char* name;
  const char* file;       // its extension picks the container
  const char* encode;     // ffmpeg output options
  bool indexed;           // the container has an index that seeking can use
  bool may_undo = false;  // keyframes may show later than the index says (VFR gaps in MP4:
                          // decode times run on through a gap in presentation times)
};

class VideoDecoderSeek : public ::testing::TestWithParam<SeekCase> {};

// 12 s of a moving test pattern with a frame counter, so that every frame differs.
constexpr const char* kMovingPattern = "-f lavfi -i testsrc2=s=160x120:r=25:d=12";

TEST_P(VideoDecoderSeek, KeepsTheFramesOfAFullDecode) {
  const SeekCase& c = GetParam();
  TempDir dir;
  const auto clip = dir / c.file;
  run_ffmpeg(std::string(kMovingPattern) + " " + c.encode + " " + quoted(clip));
  int64_t seeks = 0;
  for (const VideoDecodeOptions& sampling :
       {num_frames_options(4, 48), fps_options(0.5, 48), fps_options(3.0, 48),
        num_frames_options(1, 48)}) {
    VideoDecodeOptions full = sampling;
    full.seek = false;
    const VideoFrames expected = decode_video(clip, full);
    // Both ways of seeking: with a flush, and without (Note [Seeking without a flush]).
    for (const bool flush : {true, false}) {
      VideoDecodeOptions seeking = sampling;
      seeking.flush_on_seek = flush;
      const VideoFrames got = decode_video(clip, seeking);
      ASSERT_EQ(got.num_frames, expected.num_frames) << c.name;
      EXPECT_EQ(got.timestamps, expected.timestamps)
          << c.name << " fps " << sampling.fps << " num_frames " << sampling.num_frames
          << " flush " << flush;
      EXPECT_TRUE(got.rgb == expected.rgb)
          << c.name << " fps " << sampling.fps << " num_frames " << sampling.num_frames
          << " flush " << flush << ": pixels differ";
      if (!c.may_undo) {
        EXPECT_EQ(got.seeks_undone, 0) << c.name << ": a seek landed past its target";
        EXPECT_LE(got.decoded_frames, expected.decoded_frames) << c.name;
      }
      seeks += got.seeks;
    }
  }
  if (c.indexed) {
    EXPECT_GT(seeks, 0) << c.name << ": seeking never happened, so nothing was tested";
  } else {
    EXPECT_EQ(seeks, 0) << c.name;
  }
}

INSTANTIATE_TEST_SUITE_P(
    GopStructures, VideoDecoderSeek,
    ::testing::Values(
        SeekCase{"h264_fixed_gop", "fixed.mp4",
                 "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=25:min-keyint=25:scenecut=0",
                 true},
        SeekCase{"h264_bpyramid", "pyramid.mp4",
                 "-c:v libx264 -pix_fmt yuv420p -x264-params "
                 "keyint=30:bframes=3:b-pyramid=normal:b-adapt=2",
                 true},
        SeekCase{"h264_open_gop", "open.mp4",
                 "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=30:bframes=3:open-gop=1",
                 true},
        SeekCase{"h264_no_bframes", "nob.mp4",
                 "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=20:bframes=0", true},
        SeekCase{"h264_vfr", "vfr.mp4",
                 "-vf \"setpts=N/25/TB+gte(N\\,100)*1.6/TB\" -fps_mode vfr -c:v libx264 "
                 "-pix_fmt yuv420p -x264-params keyint=25:bframes=2",
                 true, /*may_undo=*/true},
        SeekCase{"mpeg4_part2", "part2.mp4", "-c:v mpeg4 -g 25 -bf 2 -q:v 4", true},
        SeekCase{"vp9_webm", "vp9.webm",
                 "-c:v libvpx-vp9 -g 25 -deadline realtime -cpu-used 8 -b:v 300k", true},
        SeekCase{"hevc_mkv", "hevc.mkv",
                 "-c:v libx265 -x265-params keyint=25:bframes=3:log-level=error", true},
        SeekCase{"h264_mpegts", "clip.ts",
                 "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=25:bframes=3", false}),
    [](const ::testing::TestParamInfo<SeekCase>& info) { return std::string(info.param.name); });

// Note [Skipping frames nobody keeps]: with two B-frames between references and one keyframe in
// 12 s, sampling 1 frame a second drops most B-frames before they are decoded; the frames kept
// are the full decode's.
TEST(VideoDecoderSeek, NonReferenceFramesNobodyKeepsAreNotDecoded) {
  TempDir dir;
  const auto clip = dir / "bframes.mp4";
  run_ffmpeg(std::string(kMovingPattern) +
             " -c:v libx264 -pix_fmt yuv420p -x264-params keyint=300:bframes=2:b-pyramid=none "
             "-bf 2 " + quoted(clip));
  VideoDecodeOptions full = fps_options(1.0, 48);
  full.seek = false;
  const VideoFrames all = decode_video(clip, full);
  const VideoFrames skipped = decode_video(clip, fps_options(1.0, 48));
  EXPECT_TRUE(skipped.rgb == all.rgb);
  EXPECT_EQ(skipped.timestamps, all.timestamps);
  EXPECT_EQ(skipped.seeks, 0);  // one keyframe: nothing to seek to
  EXPECT_GT(all.decoded_frames, 280);
  EXPECT_LT(skipped.decoded_frames, all.decoded_frames * 6 / 10)
      << skipped.decoded_frames << " of " << all.decoded_frames;
}

// A fuzzed Matroska file (tests/fuzz/regressions/media): decoded from the start it gives the
// decoder nothing it keeps; after a seek one frame comes out, past the target, and the way back
// to the start again finds nothing. Both must end as a decode error naming the file (before,
// the end of decode_video copied a frame that was never kept, from before the buffer), and the
// seeking decode must not keep a frame a full decode does not have.
TEST(VideoDecoderSeek, AFileWithNoFrameAFullDecodeKeepsFailsWithOrWithoutSeeking) {
  const std::filesystem::path file = std::filesystem::path(PRECOMPUTE_SOURCE_DIR) /
                                     "tests/fuzz/regressions/media/mkv_mjpeg_seek_keeps_nothing.mkv";
  VideoDecodeOptions options;
  options.num_frames = 3;
  options.height = 12;
  options.width = 20;
  options.resize = ResizeMode::kStretch;
  VideoDecodeOptions full = options;
  full.seek = false;
  for (const auto& o : {full, options}) {
    const testing::MediaOutcome outcome = testing::media_outcome([&] { decode_video(file, o); });
    EXPECT_EQ(outcome.category, "decode_error") << "seek " << o.seek << ": " << outcome.message;
    EXPECT_NE(outcome.message.find("no frame could be decoded"), std::string::npos)
        << outcome.message;
  }
}

TEST(VideoDecoderSeek, SparseSamplingOfALongGopDecodesFewerFrames) {
  TempDir dir;
  const auto clip = dir / "long.mp4";
  run_ffmpeg(std::string(kMovingPattern) +
             " -c:v libx264 -pix_fmt yuv420p -x264-params keyint=25:min-keyint=25:scenecut=0 " +
             quoted(clip));
  VideoDecodeOptions full = num_frames_options(4, 48);
  full.seek = false;
  const VideoFrames all = decode_video(clip, full);
  const VideoFrames sought = decode_video(clip, num_frames_options(4, 48));
  EXPECT_TRUE(sought.rgb == all.rgb);
  // The last target, 10.5 s in, needs frames up to about 263 of 300 without seeking; with
  // keyframes every second each target needs at most a second of frames.
  EXPECT_GT(all.decoded_frames, 250);
  EXPECT_LT(sought.decoded_frames, 4 * 26 + 8);
  EXPECT_GE(sought.seeks, 3);
}


// Note [Keeping NVDEC decoders across files]: files decoded one after another through one kept
// decoder give, bit for bit, the frames and timestamps of a decoder of their own, whatever came
// before them: other GOP structures, containers with and without Annex B packets, a change of
// picture size, of chroma format and of colour tags, a file with damaged bytes, and a file that
// fails part-way.
// The CPU decodes here (no NVDEC session), which is what makes bit equality the test.
TEST(KeptDecoder, FilesInARowGiveTheFramesOfADecoderOfTheirOwn) {
  TempDir dir;
  const std::string pattern = "-f lavfi -i testsrc2=s=160x120:r=25:d=6 ";
  const auto fixed = dir / "fixed.mp4";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=25:scenecut=0 " +
             quoted(fixed));
  const auto pyramid = dir / "pyramid.mkv";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=30:bframes=3:" +
             "b-pyramid=normal " + quoted(pyramid));
  const auto open_gop = dir / "open.mp4";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=30:bframes=3:" +
             "open-gop=1 " + quoted(open_gop));
  const auto annex_b = dir / "clip.ts";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv420p -x264-params keyint=25 " +
             quoted(annex_b));
  const auto larger = dir / "larger.mp4";
  run_ffmpeg("-f lavfi -i testsrc2=s=320x240:r=30:d=4 -c:v libx264 -pix_fmt yuv420p " +
             quoted(larger));
  const auto chroma444 = dir / "444.mp4";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv444p " + quoted(chroma444));
  const auto full_range = dir / "full_range.mp4";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuvj420p -color_range pc " + quoted(full_range));
  const auto bt709 = dir / "bt709.mp4";
  run_ffmpeg(pattern + "-c:v libx264 -pix_fmt yuv420p -colorspace bt709 -color_primaries bt709 " +
             "-color_trc bt709 " + quoted(bt709));
  const auto hevc = dir / "hevc.mp4";
  run_ffmpeg(pattern + "-c:v libx265 -x265-params keyint=25:bframes=3:log-level=error " +
             "-tag:v hvc1 " + quoted(hevc));
  const auto damaged = dir / "damaged.mp4";
  std::filesystem::copy_file(fixed, damaged);
  {
    std::fstream file(damaged, std::ios::in | std::ios::out | std::ios::binary);
    const auto size = static_cast<std::streamoff>(std::filesystem::file_size(damaged));
    std::mt19937 random(7);
    for (std::streamoff at = size / 3; at < size / 3 + 2000; at += 97) {
      file.seekp(at);
      file.put(static_cast<char>(random() & 0xFF));
    }
  }

  // Tagged colours before untagged ones: what a stream does not say must not be inherited.
  const std::vector<std::filesystem::path> files = {
      full_range, fixed,   bt709, pyramid, open_gop, annex_b, larger, full_range, fixed,
      chroma444,  hevc,    damaged, bt709, pyramid, hevc,    annex_b, fixed};
  // Files that reach their last target before their end leave the decoder without draining
  // it, and the next H.264 file that starts with an IDR then begins without a flush (Note [Files
  // in a row without a flush] in kept_decoder.cpp): 4 frames and 1 frame/s do, 25 frames/s
  // reads every file to its end.
  int64_t unflushed = 0;
  for (const VideoDecodeOptions& sampling :
       {num_frames_options(4, 48), fps_options(1.0, 48), fps_options(3.0, 48),
        fps_options(25.0, 48)}) {
    KeptDecoder kept(/*hw_device=*/nullptr);
    NvdecDecoderBackend through_kept(/*session=*/nullptr, &kept);
    for (const auto& file : files) {
      const VideoFrames expected = decode_video(file, sampling);
      const VideoFrames got = decode_video(file, sampling, through_kept);
      ASSERT_EQ(got.num_frames, expected.num_frames) << file;
      EXPECT_EQ(got.timestamps, expected.timestamps) << file << " fps " << sampling.fps;
      EXPECT_TRUE(got.rgb == expected.rgb) << file << " fps " << sampling.fps << ": pixels differ";
      EXPECT_EQ(got.decoded_frames, expected.decoded_frames) << file;
    }
    EXPECT_GE(kept.reuses(), 8) << "the decoder was not kept, so nothing was tested";
    unflushed += kept.unflushed();
  }
  EXPECT_GE(unflushed, 16) << "too few files began without a flush for that path to be tested";
}

TEST(KeptDecoder, AFileThatFailsPartWayLeavesAFreshDecoderForTheNext) {
  TempDir dir;
  const auto clip = dir / "clip.mp4";
  run_ffmpeg("-f lavfi -i testsrc2=s=160x120:r=25:d=4 -c:v libx264 -pix_fmt yuv420p " +
             quoted(clip));
  KeptDecoder kept(/*hw_device=*/nullptr);
  NvdecDecoderBackend through_kept(/*session=*/nullptr, &kept);
  const VideoDecodeOptions options = fps_options(25.0, 48);
  const VideoFrames expected = decode_video(clip, options);
  (void)decode_video(clip, options, through_kept);
  (void)decode_video(clip, options, through_kept);
  EXPECT_EQ(kept.reuses(), 1);
  VideoDecodeOptions failing = options;
  failing.max_decoded_frames = 10;  // thrown from inside the decode loop
  EXPECT_EQ(testing::media_outcome([&] { decode_video(clip, failing, through_kept); }).category,
            "too_long");
  EXPECT_EQ(kept.reuses(), 2);  // the failing file was given the kept decoder
  const VideoFrames after = decode_video(clip, options, through_kept);
  EXPECT_EQ(kept.reuses(), 2) << "a decoder that failed part-way was used again";
  EXPECT_EQ(after.timestamps, expected.timestamps);
  EXPECT_TRUE(after.rgb == expected.rgb);
}

// Note [Opening and closing sessions side by side]: a pool that cannot open a GPU's context
// reports it naming the GPU and its sessions, in GPU order (no machine has a cuda:62 or a
// cuda:63, with or without CUDA in the build).
TEST(NvdecPoolTest, APoolThatCannotOpenItsSessionsNamesTheFirstGpu) {
  try {
    NvdecPool pool({63, 62}, 3);
    FAIL() << "a pool on cuda:63 opened";
  } catch (const std::runtime_error& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("NVDEC on cuda:63 (3 session(s)): ", 0), 0U) << what;
  }
}

}  // namespace
}  // namespace precompute
