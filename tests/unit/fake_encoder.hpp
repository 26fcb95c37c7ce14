#pragma once
// An Encoder without LibTorch for the graph tests (graph_test.cpp): deterministic vectors made
// from each sample's id, and the faults a real encoder shows, on demand: out of device memory
// above a batch cost, a failed batch when it holds a marked id, an exception that is a bug (it
// cancels the graph), and sleeps that shuffle the order in which batches finish. It records
// every call, so that a test can tell which samples were embedded how many times.
// Thread-safe: encode() may run on as many threads at once as info().concurrent_calls (it
// checks that it never runs on more).

#include <chrono>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "encoders/encoder.hpp"

namespace precompute::testing {

struct FakeEncoderOptions {
  int64_t dim = 4;
  bool per_step = false;  // one row per frame / window / token, as pooling: none gives
  std::string device = "cpu";
  int concurrent_calls = 1;
  // Rows carry a trace of the batch they ran in (its first seq and size), as real kernels'
  // last bits do: shards are then bit-identical only if batches are cut the same way.
  bool batch_dependent = true;
  // A batch costing more than this (sample_cost units) throws DeviceOutOfMemoryError, as a
  // LibTorch encoder does after c10::OutOfMemoryError; -1: never.
  int64_t oom_above_cost = -1;
  // A batch holding one of these ids throws ModelError (the encode stage retries its samples
  // one by one, and only this one fails).
  std::set<std::string> failing_ids;
  // A batch holding one of these ids throws std::logic_error, a bug: it cancels the graph.
  std::set<std::string> throwing_ids;
  // Time each call takes, and more for a batch holding one of `slow_ids`.
  std::chrono::microseconds sleep_per_call{0};
  std::map<std::string, std::chrono::microseconds> slow_ids;
};

class FakeEncoder final : public Encoder {
 public:
  FakeEncoder(Modality modality, FakeEncoderOptions options);

  const EncoderInfo& info() const override { return info_; }
  std::vector<SampleEmbedding> encode(const std::vector<PreparedSamplePtr>& batch) override;
  ParameterSummary parameters() const override { return {}; }
  std::string input_dtype() const override { return "Float"; }

  enum class Outcome { kEmbedded, kOutOfMemory, kFailed, kThrew };
  struct Call {
    std::vector<int64_t> seqs;
    int64_t cost = 0;
    Outcome outcome = Outcome::kEmbedded;
  };
  std::vector<Call> calls() const;
  // How many times each seq came back embedded.
  std::map<int64_t, int> embedded_counts() const;
  // The most calls that ran at once.
  int most_concurrent_calls() const;

 private:
  EncoderInfo info_;
  FakeEncoderOptions options_;
  mutable std::mutex mutex_;
  std::vector<Call> calls_;
  int running_ = 0;
  int most_running_ = 0;
};

// The vector the fake encoder makes for row `row` of `id`'s `m` embedding, before the batch's
// trace: values in [-1, 1) on a grid of 2^-10, exact in float32 and float16.
std::vector<float> fake_row(const std::string& id, Modality m, int64_t row, int64_t dim);

// The batch trace added to every value of a batch_dependent encoder's rows: below 2^-8.
float fake_batch_trace(const std::vector<PreparedSamplePtr>& batch);

}  // namespace precompute::testing
