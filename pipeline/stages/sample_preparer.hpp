#pragma once
// The prepare stage: one SampleSpec in, its decoded frames, audio windows and token ids out.
// Problems with one sample's inputs never escape: they become failure records in the result
// (STYLE.md, "Do this" 5). Copyable and callable from many threads at once (oneTBB copies node
// bodies; the shared state is immutable).

#include <memory>

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
  PreparedSamplePtr operator()(const SampleSpec& spec) const;

 private:
  struct State;
  std::shared_ptr<const State> state_;
  RunStats* stats_;
};

}  // namespace precompute
