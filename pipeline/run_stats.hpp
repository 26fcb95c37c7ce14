#pragma once
// Counters the stages bump as samples move, read by the progress reporter and the final
// summary. Every field is an atomic: any thread may update or read at any time.

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>

#include "pipeline/core/modality.hpp"

namespace precompute {

struct RunStats {
  std::atomic<int64_t> total{0};           // samples in the input
  std::atomic<int64_t> submitted{0};       // sent by the source into the graph
  std::atomic<int64_t> prepared{0};        // decoded and tokenised
  std::atomic<int64_t> routed{0};          // past the sequencer, in a batcher or beyond
  std::atomic<int64_t> completed{0};       // every modality embedded or failed
  std::atomic<int64_t> failed_samples{0};  // samples with at least one failure record
  std::atomic<int64_t> failure_records{0};
  std::atomic<int64_t> shards_written{0};
  std::atomic<int64_t> bytes_written{0};
  std::atomic<int64_t> invalid_utf8_texts{0};
  std::atomic<int64_t> batch_retries{0};   // failed batches retried sample by sample
  std::array<std::atomic<int64_t>, kNumModalities> embedded{};        // per modality
  std::array<std::atomic<int64_t>, kNumModalities> batches_queued{};  // sent to an encoder
  std::array<std::atomic<int64_t>, kNumModalities> batches_done{};
  std::array<std::atomic<int64_t>, 16> failures_by_category{};  // by FailureCategory value
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
};

}  // namespace precompute
