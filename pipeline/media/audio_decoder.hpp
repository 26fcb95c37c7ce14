#pragma once
// Decodes the audio stream of one file (an audio file, or a video's audio track) into mono float
// samples at the encoder's rate (libswresample downmixes and resamples), cut into windows
// (Note [Audio windows] in audio_decoder.cpp). Concurrent calls on different threads are safe.

#include <filesystem>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

struct AudioDecodeOptions {
  int sample_rate = 16000;
  double window_s = 0.0;  // 0: the whole clip is one window
  double hop_s = 0.0;     // 0: window_s
  double max_duration_s = 4 * 3600.0;
  double timeout_s = 600.0;             // the whole decode of the file, at most: kTimeout
  int64_t max_file_bytes = 64LL << 30;  // larger files: kTooLarge
};

// The options of `section`, with the per-file limits of `run`.
AudioDecodeOptions audio_decode_options(const AudioSection& section, const RunSection& run);

// Throws MediaError (missing, unreadable, no_stream, decode_error, too_long, too_large,
// timeout, unsupported) naming the file.
AudioWindows decode_audio(const std::filesystem::path& file, const AudioDecodeOptions& options);

}  // namespace precompute
