#pragma once
// Messages between the pipeline's stages after decoding (the source sends SampleSpec, the
// prepare stage PreparedSamplePtr). All are cheap to copy: oneTBB copies messages between nodes.

#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <variant>
#include <vector>

#include "pipeline/core/failure.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

// Samples of one modality to embed in one forward pass, ascending seq.
struct ModalityBatch {
  Modality modality = Modality::kVideo;
  std::vector<PreparedSamplePtr> samples;
  // When the router cut it: the time until an encoder takes it is the batch's wait (summary).
  std::chrono::steady_clock::time_point cut_at{};
};

// What the writer must wait for before a sample is complete: sent once per sample, in seq order,
// by the batch router, while the sample's inputs travel through the encoders.
struct SampleOutline {
  int64_t seq = 0;
  std::string id;
  std::array<bool, kNumModalities> expected{};  // modalities sent to an encoder
  std::vector<FailureRecord> failures;          // from decoding and tokenising
};

// The result of one ModalityBatch: every sample of it has an embedding or a failure record.
struct EncodedBatch {
  Modality modality = Modality::kVideo;
  std::vector<SampleEmbedding> embeddings;
  std::vector<FailureRecord> failures;
};

// What the writer receives. An encoded batch travels behind a pointer: oneTBB hands node bodies
// a const reference, and the writer takes the embeddings over rather than copying megabytes.
using WriterMessage = std::variant<SampleOutline, std::shared_ptr<EncodedBatch>>;

}  // namespace precompute
