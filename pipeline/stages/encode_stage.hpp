#pragma once
// The inference stage: one ModalityBatch in, an EncodedBatch out. The encoders of a modality (one
// per device) sit in a pool; a call checks one out, so the node's concurrency equals the pool's
// size and every device has one owner at a time. A batch that fails is retried sample by sample,
// so one bad sample fails alone (category encode_error) and the rest are embedded.
// After an out-of-memory split it lowers the modality's cost limit in a BatchCostFeedback that
// the batch router reads (Note [Out of memory]).
// Copyable (oneTBB copies bodies); the pool is shared and thread-safe.

#include <array>
#include <condition_variable>
#include <deque>
#include <memory>
#include <shared_mutex>
#include <mutex>
#include <vector>

#include "encoders/encoder.hpp"
#include "pipeline/stages/batch_cost_feedback.hpp"
#include "pipeline/stages/stage_messages.hpp"

namespace precompute {

struct RunStats;

// The loaded encoders of one modality, one per device, each offered as many times as it takes
// concurrent calls.
class EncoderPool {
 public:
  explicit EncoderPool(std::vector<std::unique_ptr<Encoder>> encoders);
  ~EncoderPool();  // releases the encoders, saying how long that took (debug)

  // Calls that can run at once.
  size_t size() const { return size_; }
  const EncoderInfo& info() const { return encoders_.front()->info(); }
  // Every instance (one per device), for probes made before the run starts.
  const std::vector<std::unique_ptr<Encoder>>& encoders() const { return encoders_; }

  // Runs `fn(encoder)` on a free encoder, waiting for one if all are busy.
  template <class Fn>
  auto with_encoder(Fn&& fn) {
    Encoder* encoder = acquire();
    struct Release {
      EncoderPool* pool;
      Encoder* encoder;
      ~Release() { pool->release(encoder); }
    } release{this, encoder};
    return fn(*encoder);
  }

 private:
  Encoder* acquire();
  void release(Encoder* encoder);

  std::vector<std::unique_ptr<Encoder>> encoders_;
  std::deque<Encoder*> free_;  // first in, first out (Note [Every device gets batches])
  size_t size_ = 0;
  std::mutex mutex_;
  std::condition_variable available_;
};

using EncoderPools = std::array<std::shared_ptr<EncoderPool>, kNumModalities>;

class EncodeStage {
 public:
  // `stats` and `feedback` must outlive the stage and its copies.
  EncodeStage(EncoderPools pools, RunStats& stats, BatchCostFeedback& feedback)
      : pools_(std::move(pools)), stats_(&stats), feedback_(&feedback) {}
  EncodedBatch operator()(const ModalityBatch& batch) const;

 private:
  // Encodes `samples` into `out`, halving on out-of-memory (Note [Out of memory]).
  void encode_splitting(const std::vector<PreparedSamplePtr>& samples, Modality m,
                        EncodedBatch& out) const;

  EncoderPools pools_;
  RunStats* stats_;
  BatchCostFeedback* feedback_;
  // Encode calls hold it shared; the last retry of a sample that ran out of memory holds it
  // alone, so that no other batch's memory stands in its way (Note [Out of memory]).
  std::shared_ptr<std::shared_mutex> alone_ = std::make_shared<std::shared_mutex>();
};

}  // namespace precompute
