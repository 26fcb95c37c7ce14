#pragma once
// The data that flows through the pipeline, from a manifest line to an embedding. All of it is
// plain host memory, free of LibTorch, TBB and FFmpeg types, so that every stage and the storage
// layer can be built and tested without them. Large payloads travel behind shared_ptr because
// oneTBB copies messages between nodes.

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/core/failure.hpp"
#include "pipeline/core/media_source.hpp"
#include "pipeline/core/modality.hpp"

namespace precompute {

// One sample of the input, as the manifest (or folder scan) describes it, paths already resolved.
struct SampleSpec {
  int64_t seq = 0;    // 0-based position in the input; shards are cut on it
  int64_t order = 0;  // 0-based position among the samples this run processes (a resumed run
                      // skips committed ones); the graph restores this order after decoding
  std::string id;     // unique across the input
  std::optional<MediaSource> video;
  std::optional<MediaSource> audio;  // when absent, the audio track of `video`
  std::optional<std::string> text;
  // The values of output.keep_columns, in that key's order ("" where the line has no value);
  // empty when no column is kept.
  std::vector<std::string> columns;
  int64_t line = 0;  // 1-based manifest line (or file number in folder mode), for messages
};

// Whether `spec` gives modality `m` an input: audio comes from the audio file, or else from the
// video file's audio track.
inline bool gives_input(const SampleSpec& spec, Modality m) {
  switch (m) {
    case Modality::kVideo:
      return spec.video.has_value();
    case Modality::kAudio:
      return spec.audio.has_value() || spec.video.has_value();
    case Modality::kText:
      return spec.text.has_value();
  }
  return false;
}

// Why a sample's media are not to be decoded (it crashed or hung the process, Note [Crash
// containment] in pipeline/crash_containment.cpp): each media modality its line gives gets a
// failure record of this category and message instead.
struct SkippedMedia {
  FailureCategory category = FailureCategory::kCrashed;
  std::string message;
};

// Frames sampled from a video, already scaled and colour-converted to the encoder's input size.
// Pixels are RGB24, frame-major, then rows, then columns (THWC), tightly packed.
struct VideoFrames {
  int64_t num_frames = 0;
  int height = 0;
  int width = 0;
  std::vector<uint8_t> rgb;         // num_frames * height * width * 3
  std::vector<double> timestamps;   // seconds from the stream's start, one per frame
  int source_width = 0;             // the coded picture size, for records
  int source_height = 0;
  double duration_s = 0.0;
  int64_t decoded_frames = 0;  // frames out of the decoder (seeking skips the others)
  int64_t seeks = 0;           // seeks to a keyframe near a target
  int64_t seeks_undone = 0;    // seeks that landed wrong and were undone (decoded from the start)
  bool nvdec = false;          // decoded on NVDEC and converted on the GPU (video.decoder)

  size_t bytes() const { return rgb.size() + timestamps.size() * sizeof(double); }
};

// Mono audio at the encoder's sample rate, cut into windows of equal length. The whole-clip mode
// is one window as long as the clip.
struct AudioWindows {
  int sample_rate = 0;
  int64_t window_samples = 0;       // samples per window
  int64_t num_windows = 0;
  std::vector<float> samples;       // num_windows * window_samples, window-major
  std::vector<double> timestamps;   // start of each window, seconds from the stream's start
  std::vector<int64_t> valid_samples;  // per window: samples before the zero padding
  double duration_s = 0.0;

  size_t bytes() const {
    return samples.size() * sizeof(float) + timestamps.size() * sizeof(double) +
           valid_samples.size() * sizeof(int64_t);
  }
};

// A caption as token ids, [CLS] ... [SEP] included.
struct TokenizedText {
  std::vector<int32_t> ids;
  bool truncated = false;  // the text had more tokens than max_length

  size_t bytes() const { return ids.size() * sizeof(int32_t); }
};

// A sample after decoding and tokenisation: what the encoders consume. A modality that failed or
// was not asked for is empty, and every failure is in `failures`.
struct PreparedSample {
  int64_t seq = 0;
  int64_t order = 0;  // SampleSpec::order
  std::string id;
  std::optional<VideoFrames> video;
  std::optional<AudioWindows> audio;
  std::optional<TokenizedText> text;
  std::vector<FailureRecord> failures;

  bool has(Modality m) const {
    switch (m) {
      case Modality::kVideo:
        return video.has_value();
      case Modality::kAudio:
        return audio.has_value();
      case Modality::kText:
        return text.has_value();
    }
    return false;
  }
  size_t bytes() const {
    return (video ? video->bytes() : 0) + (audio ? audio->bytes() : 0) +
           (text ? text->bytes() : 0);
  }
};

using PreparedSamplePtr = std::shared_ptr<const PreparedSample>;

// Cost of one sample in a batch of modality `m` (which it must have), in the unit batch limits
// and memory budgets count: video frames, audio samples, text tokens.
inline int64_t sample_cost(Modality m, const PreparedSample& sample) {
  switch (m) {
    case Modality::kVideo:
      return sample.video->num_frames;
    case Modality::kAudio:
      return sample.audio->num_windows * sample.audio->window_samples;
    case Modality::kText:
      return static_cast<int64_t>(sample.text->ids.size());
  }
  return 0;
}

// One modality's embedding of one sample, on the host in float32. Pooled output has one row;
// per-step output (pooling: none) has one row per frame, window or token.
struct SampleEmbedding {
  int64_t seq = 0;
  int64_t rows = 0;
  int64_t dim = 0;
  std::vector<float> values;       // rows * dim, row-major
  std::vector<double> timestamps;  // one per row for per-step video/audio output, else empty
  int32_t steps = 0;               // frames, windows or tokens that went into it
  bool truncated = false;          // text: the caption was cut at max_length
};

}  // namespace precompute
