#pragma once
// The prepare stage: one SampleSpec in, its decoded frames, audio windows and token ids out.
// Problems with one sample's inputs never escape: they become failure records in the result, so
// that one bad file fails alone. Copyable and callable from many threads at once (oneTBB copies node
// bodies; the shared state is immutable).

#include <filesystem>
#include <memory>
#include <string>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

struct RunStats;

// True when `spec` gives an input that a modality of `config` embeds (a video or audio file for
// video/audio, a caption for text; audio may come from the video's track). A sample without one
// is recorded as no_input (Note [Samples without a configured input] in pipeline/runner.cpp).
bool sample_has_configured_input(const SampleSpec& spec, const Config& config);

class SamplePreparer {
 public:
  SamplePreparer(const Config& config, RunStats& stats);
  // With `skipped`, video and audio are recorded as failed instead of decoded; the line is
  // still judged by what it gives (no_input), and its caption is still tokenised.
  PreparedSamplePtr operator()(const SampleSpec& spec, const SkippedMedia* skipped = nullptr) const;
  // The NVDEC sessions that decode video and whether CPU decoders join them; empty when only
  // the CPU decodes (or there is no video).
  std::string video_decoders() const;
  // Decode threads to add to one per core so that the CPU decoders stay as many while some
  // threads wait on NVDEC: the sessions, under video.decoder: auto; else 0.
  int decode_threads_beside_the_cpu() const;
  // The NVDEC sessions video decodes on (every GPU's); 0 when only the CPU decodes.
  int nvdec_sessions() const;
  // Logs a warning when more than 5% of the caption tokens this preparer made were [UNK] (Note
  // [Unknown tokens] in sample_preparer.cpp); the run calls it once, after the graph.
  void warn_about_unknown_tokens() const;

 private:
  struct State;

  std::shared_ptr<const State> state_;
  RunStats* stats_;
};

}  // namespace precompute
