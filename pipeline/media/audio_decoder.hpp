#pragma once
// Decodes the audio stream of one file (an audio file, or a video's audio track) into mono float
// samples at the encoder's rate (libswresample downmixes and resamples), cut into windows
// (Note [Audio windows] in audio_decoder.cpp). Concurrent calls on different threads are safe.

#include <filesystem>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

// Defaults are the config's (default_audio_section(), default_run_section()): declared once.
struct AudioDecodeOptions {
  int sample_rate = default_audio_section().sample_rate;
  double window_s = default_audio_section().window_s;  // 0: the whole clip is one window
  double hop_s = default_audio_section().hop_s;        // 0: window_s
  double max_duration_s = default_audio_section().max_duration_s;
  double timeout_s = default_run_section().sample_timeout_s;  // the whole decode, at most: kTimeout
  int64_t max_file_bytes = default_run_section().max_file_bytes;  // larger files: kTooLarge
};

// The options of `section`, with the per-file limits of `run`.
AudioDecodeOptions audio_decode_options(const AudioSection& section, const RunSection& run);

// Throws MediaError (missing, unreadable, no_stream, decode_error, too_long, too_large,
// timeout, unsupported) naming the file.
AudioWindows decode_audio(const MediaSource& source, const AudioDecodeOptions& options);

}  // namespace precompute
