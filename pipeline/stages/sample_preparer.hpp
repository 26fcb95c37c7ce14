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
