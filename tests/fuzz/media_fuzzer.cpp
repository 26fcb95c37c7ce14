// libFuzzer target for media decoding: each input is written to a file and decoded as video and
// as audio, with small limits so that one input costs milliseconds, not seconds. FFmpeg probes
// the container from the bytes, so the seeds (make_seeds.sh) may be any container we accept.
// MediaError is how a bad file must end. A sanitizer report, any other exception, or a result
// that does not have the shape the decoder promises is a bug, and aborts so that libFuzzer saves
// the input. The decoders' own deadline (kTimeout) is well under libFuzzer's -timeout (10 s in
// tools/test_sanitized.sh), so a libFuzzer timeout means a stretch of work the deadline cannot
// interrupt.

#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

#include "pipeline/core/error.hpp"
#include "pipeline/media/audio_decoder.hpp"
#include "pipeline/media/video_decoder.hpp"

namespace {

namespace fs = std::filesystem;

constexpr double kDeadlineSeconds = 3.0;
constexpr int64_t kMaxFileBytes = 1 << 20;  // above any input libFuzzer makes from our seeds

void require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "media_fuzzer: broken contract: %s\n", what);
  std::abort();
}

// The decoders read files only. The file is named by the pid so that fuzzers running side by
// side (-jobs, -fork) do not overwrite each other's input; /dev/shm keeps the write off the disk.
class ScratchFile {
 public:
  ScratchFile() {
    std::error_code error;
    const fs::path dir =
        fs::is_directory("/dev/shm", error) ? fs::path("/dev/shm") : fs::temp_directory_path();
    path_ = dir / ("precompute-media-fuzzer-" + std::to_string(::getpid()) + ".mp4");
  }
  ~ScratchFile() {
    std::error_code error;
    fs::remove(path_, error);
  }
  ScratchFile(const ScratchFile&) = delete;
  ScratchFile& operator=(const ScratchFile&) = delete;

  const fs::path& write(const uint8_t* data, size_t size) {
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
    out.close();
    require(out.good(), "the scratch file can be written");
    return path_;
  }

 private:
  fs::path path_;
};

void decode_as_video(const fs::path& file, size_t size) {
  precompute::VideoDecodeOptions options;
  // Both sampling modes and both resize modes, picked by the input's size so that a saved
  // crash reproduces with the same options.
  if (size % 2 == 0) {
    options.num_frames = 3;
  } else {
    options.fps = 4.0;
    options.max_frames = 40;
  }
  options.resize =
      size % 4 < 2 ? precompute::ResizeMode::kShorterSideCrop : precompute::ResizeMode::kStretch;
  options.height = 12;
  options.width = 20;
  options.max_duration_s = 10.0;
  options.max_pixels = 640 * 480;
  options.max_decoded_frames = 2000;
  options.timeout_s = kDeadlineSeconds;
  options.max_file_bytes = kMaxFileBytes;
  try {
    const precompute::VideoFrames frames = precompute::decode_video(file, options);
    require(frames.num_frames > 0, "a decoded video has frames");
    require(frames.height == options.height && frames.width == options.width,
            "frames have the requested size");
    require(frames.rgb.size() ==
                static_cast<size_t>(frames.num_frames) * 3 * frames.height * frames.width,
            "rgb holds num_frames frames");
    require(frames.timestamps.size() == static_cast<size_t>(frames.num_frames),
            "one timestamp per frame");
    require(options.num_frames == 0 || frames.num_frames == options.num_frames,
            "num_frames mode gives exactly num_frames frames");
  } catch (const precompute::MediaError&) {
  }
}

void decode_as_audio(const fs::path& file, size_t size) {
  precompute::AudioDecodeOptions options;
  options.sample_rate = 8000;
  // Whole-clip and windowed, as for video.
  if (size % 2 == 1) {
    options.window_s = 0.25;
    options.hop_s = size % 4 == 1 ? 0.1 : 0.0;
  }
  options.max_duration_s = 10.0;
  options.timeout_s = kDeadlineSeconds;
  options.max_file_bytes = kMaxFileBytes;
  try {
    const precompute::AudioWindows audio = precompute::decode_audio(file, options);
    require(audio.num_windows > 0 && audio.window_samples > 0, "decoded audio has samples");
    require(audio.samples.size() ==
                static_cast<size_t>(audio.num_windows) * static_cast<size_t>(audio.window_samples),
            "samples holds num_windows windows");
    require(audio.timestamps.size() == static_cast<size_t>(audio.num_windows) &&
                audio.valid_samples.size() == static_cast<size_t>(audio.num_windows),
            "one timestamp and one valid count per window");
    for (const int64_t valid : audio.valid_samples) {
      require(valid > 0 && valid <= audio.window_samples, "every window starts inside the clip");
    }
  } catch (const precompute::MediaError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) {
  // FFmpeg's complaints about broken input are the expected case here; they would flood the log.
  ::setenv("PRECOMPUTE_FFMPEG_LOG", "quiet", /*overwrite=*/0);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static ScratchFile scratch;
  const fs::path& file = scratch.write(data, size);
  decode_as_video(file, size);
  decode_as_audio(file, size);
  return 0;
}
