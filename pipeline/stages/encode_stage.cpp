#include "pipeline/stages/encode_stage.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>

#include "pipeline/core/error.hpp"
#include "pipeline/core/seconds_since.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/stages/batch_router.hpp"

namespace precompute {

EncoderPool::EncoderPool(std::vector<std::unique_ptr<Encoder>> encoders)
    : encoders_(std::move(encoders)) {
  PC_ASSERT(!encoders_.empty(), "an encoder pool needs an encoder");
  // Note [Every device gets batches]
  // Calls are handed out first in, first out, and the pool starts with the devices
  // interleaved, so that batches go round the devices. Handing out the last one returned (as a
  // stack would) gives every batch to one GPU whenever batches come slower than the GPU takes
  // them, as video's do when decoding is the bound: on two GPUs, one gets none.
  int most_calls = 0;
  for (auto& e : encoders_) most_calls = std::max(most_calls, e->info().concurrent_calls);
  for (int call = 0; call < most_calls; ++call) {
    for (auto& e : encoders_) {
      if (call < e->info().concurrent_calls) free_.push_back(e.get());
    }
  }
  size_ = free_.size();
}

EncoderPool::~EncoderPool() {
  const auto started = std::chrono::steady_clock::now();
  const std::string model = encoders_.front()->info().model_file;
  const size_t count = encoders_.size();
  encoders_.clear();
  spdlog::debug("end: {} encoder(s) of {} released in {:.1f} ms", count, model,
                1000.0 * seconds_since(started));
}

Encoder* EncoderPool::acquire() {
  std::unique_lock lock(mutex_);
  available_.wait(lock, [&] { return !free_.empty(); });
  Encoder* e = free_.front();
  free_.pop_front();
  return e;
}

void EncoderPool::release(Encoder* encoder) {
  {
    std::lock_guard lock(mutex_);
    free_.push_back(encoder);
  }
  available_.notify_one();
}

// Note [Out of memory]
// A batch that runs out of device memory (DeviceOutOfMemoryError: the encoder has already
// released the allocator's cached blocks) is split in two halves, each encoded on its own, down
// to single samples; a single sample that still fails is retried once with every other encode
// call held back (their batches may have been what filled the device), and only then gets a
// failure record of category `oom` naming its size. The halves keep input order, so the embeddings are the same rows a larger
// batch would have produced, up to the batch-size dependence of the kernels. Splits are
// counted in the run's summary. The cost model learns: after a split, the batch router cuts
// later batches of that modality at half the failed batch's cost (frames, audio samples,
// tokens), so a budget that was calibrated too generously stops costing retries.
void EncodeStage::encode_splitting(const std::vector<PreparedSamplePtr>& samples, Modality m, EncodedBatch& out) const {
  auto& pool = *pools_[modality_index(m)];
  try {
    const std::shared_lock shared(*alone_);
    auto embeddings = pool.with_encoder([&](Encoder& e) { return e.encode(samples); });
    for (auto& e : embeddings) out.embeddings.push_back(std::move(e));
  } catch (const DeviceOutOfMemoryError& error) {
    if (samples.size() == 1) {
      // Once more with no other batch in flight: the memory may have been theirs.
      try {
        const std::unique_lock alone(*alone_);
        auto embeddings = pool.with_encoder([&](Encoder& e) { return e.encode(samples); });
        out.embeddings.push_back(std::move(embeddings.front()));
      } catch (const DeviceOutOfMemoryError& alone_error) {
        const auto& s = *samples.front();
        out.failures.push_back({s.seq, s.id, m, FailureCategory::kOom,
                                detail::concat("sample '", s.id, "' does not fit in device "
                                               "memory on its own: ", alone_error.what())});
      }
      return;
    }
    stats_->oom_splits.fetch_add(1, std::memory_order_relaxed);
    // Later batches are cut below half of this one's cost (never below one largest sample).
    int64_t cost = 0, largest = 0;
    for (const auto& s : samples) {
      cost += sample_cost(m, *s);
      largest = std::max(largest, sample_cost(m, *s));
    }
    const int64_t limit = feedback_->lower(m, std::max(largest, cost / 2));
    spdlog::warn("{}; splitting the batch of {} in two; later {} batches cost at most {}",
                 error.what(), samples.size(), modality_name(m), limit);
    const auto half = samples.begin() + static_cast<std::ptrdiff_t>(samples.size() / 2);
    encode_splitting(std::vector<PreparedSamplePtr>(samples.begin(), half), m, out);
    encode_splitting(std::vector<PreparedSamplePtr>(half, samples.end()), m, out);
  }
}

EncodedBatch EncodeStage::operator()(const ModalityBatch& batch) const {
  const auto m = batch.modality;
  const auto started = std::chrono::steady_clock::now();
  const auto waited = batch.cut_at == std::chrono::steady_clock::time_point{}
                          ? std::chrono::steady_clock::duration{}
                          : started - batch.cut_at;
  stats_->encode_wait_ns[modality_index(m)].fetch_add(
      std::chrono::duration_cast<std::chrono::nanoseconds>(waited).count(),
      std::memory_order_relaxed);
  const StageTimer timer(stats_->encode_ns[modality_index(m)]);
  const OverlapClock::Scope in_use(stats_->encode_in_use[modality_index(m)]);
  auto& pool = *pools_[modality_index(m)];
  EncodedBatch out;
  out.modality = m;
  try {
    encode_splitting(batch.samples, m, out);
  } catch (const ModelError& batch_error) {
    out.embeddings.clear();
    out.failures.clear();
    if (batch.samples.size() == 1) {
      const auto& s = *batch.samples.front();
      out.failures.push_back(
          {s.seq, s.id, m, FailureCategory::kEncodeError, batch_error.what()});
    } else {
      // Find the sample(s) at fault: each one alone.
      stats_->batch_retries.fetch_add(1, std::memory_order_relaxed);
      spdlog::warn("{} batch of {} samples failed ({}); retrying them one by one",
                   modality_name(m), batch.samples.size(), batch_error.what());
      for (const auto& sample : batch.samples) {
        try {
          auto one = pool.with_encoder([&](Encoder& e) { return e.encode({sample}); });
          out.embeddings.push_back(std::move(one.front()));
        } catch (const DeviceOutOfMemoryError& e) {
          out.failures.push_back({sample->seq, sample->id, m, FailureCategory::kOom, e.what()});
        } catch (const ModelError& e) {
          out.failures.push_back(
              {sample->seq, sample->id, m, FailureCategory::kEncodeError, e.what()});
        }
      }
    }
  }
  stats_->embedded[modality_index(m)].fetch_add(static_cast<int64_t>(out.embeddings.size()),
                                                std::memory_order_relaxed);
  stats_->batches_done[modality_index(m)].fetch_add(1, std::memory_order_relaxed);
  // A timeline of the encoders at debug level: how long each batch waited and took.
  if (spdlog::should_log(spdlog::level::debug)) {
    const auto ms = [](std::chrono::steady_clock::duration d) {
      return std::chrono::duration<double, std::milli>(d).count();
    };
    int64_t cost = 0;
    for (const auto& s : batch.samples) cost += sample_cost(m, *s);
    spdlog::debug("{} batch of {} (cost {}): waited {:.1f} ms for an encoder, took {:.1f} ms",
                  modality_name(m), batch.samples.size(), cost, ms(waited),
                  ms(std::chrono::steady_clock::now() - started));
  }
  return out;
}

}  // namespace precompute
