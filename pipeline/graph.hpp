#pragma once
// The oneTBB flow graph that runs a precompute job; the only file pair that knows oneTBB
// (Note [The graph] in graph.cpp). The stages it wires are plain classes in pipeline/stages/.

#include <array>
#include <cstddef>
#include <functional>
#include <vector>

#include "pipeline/core/sample.hpp"
#include "pipeline/stages/batch_router.hpp"
#include "pipeline/stages/encode_stage.hpp"
#include "pipeline/stages/sample_preparer.hpp"
#include "pipeline/stages/shard_assembler.hpp"

namespace precompute {

struct RunStats;

struct GraphSettings {
  int decode_concurrency = 1;  // samples decoded at once
  size_t max_in_flight = 64;   // samples between the source and the writer
  std::array<size_t, kNumModalities> encode_concurrency{};  // encoders per modality (0: none)
  // Called by the source before each sample; may wait (host memory back-pressure).
  std::function<void()> before_sample;
};

// Runs the samples of `samples` (ascending seq; a resumed run passes only those not yet
// committed) through the stages and returns when the last shard is written, or, after a stop
// request, when the samples taken so far have reached the writer. Rethrows the first exception
// a stage let escape, after cancelling the rest of the graph.
// Decodes and tokenises one sample (thread-safe): SamplePreparer, in crash containment.
using PrepareFn = std::function<PreparedSamplePtr(const SampleSpec&)>;

void run_graph(const std::vector<SampleSpec>& samples, const PrepareFn& prepare,
               BatchRouter& router, const EncodeStage& encoder, ShardAssembler& assembler,
               RunStats& stats, const GraphSettings& settings);

}  // namespace precompute
