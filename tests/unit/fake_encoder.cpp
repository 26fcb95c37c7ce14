#include "fake_encoder.hpp"

#include <algorithm>
#include <stdexcept>
#include <thread>

#include "pipeline/core/error.hpp"

namespace precompute::testing {
namespace {

// FNV-1a: a hash that is the same on every platform and run (std::hash need not be).
uint64_t fnv1a(const std::string& text, uint64_t h = 1469598103934665603ULL) {
  for (unsigned char c : text) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

int64_t steps_of(Modality m, const PreparedSample& s) {
  switch (m) {
    case Modality::kVideo:
      return s.video->num_frames;
    case Modality::kAudio:
      return s.audio->num_windows;
    case Modality::kText:
      return static_cast<int64_t>(s.text->ids.size());
  }
  return 0;
}

}  // namespace

std::vector<float> fake_row(const std::string& id, Modality m, int64_t row, int64_t dim) {
  std::vector<float> values(static_cast<size_t>(dim));
  const uint64_t base = fnv1a(std::string(modality_name(m)) + "/" + std::to_string(row),
                              fnv1a(id));
  for (int64_t j = 0; j < dim; ++j) {
    const uint64_t h = fnv1a(std::to_string(j), base);
    values[static_cast<size_t>(j)] = static_cast<float>(static_cast<int64_t>(h % 2048) - 1024) /
                                     1024.0f;
  }
  return values;
}

float fake_batch_trace(const std::vector<PreparedSamplePtr>& batch) {
  const int64_t first = batch.front()->seq % 64;
  return static_cast<float>(first + static_cast<int64_t>(batch.size())) / 65536.0f;
}

FakeEncoder::FakeEncoder(Modality modality, FakeEncoderOptions options)
    : options_(std::move(options)) {
  info_.modality = modality;
  info_.device = options_.device;
  info_.model_file = std::string("fake-") + std::string(modality_name(modality)) + ".pt";
  info_.model_sha256 = std::string(64, '0');
  info_.dim = options_.dim;
  info_.per_step = options_.per_step;
  info_.concurrent_calls = options_.concurrent_calls;
}

std::vector<SampleEmbedding> FakeEncoder::encode(const std::vector<PreparedSamplePtr>& batch) {
  const Modality m = info_.modality;
  Call call;
  std::chrono::microseconds sleep = options_.sleep_per_call;
  bool fails = false;
  bool throws = false;
  for (const auto& s : batch) {
    PC_ASSERT(s->has(m), "fake ", modality_name(m), " encoder got sample '", s->id,
              "' without that modality");
    call.seqs.push_back(s->seq);
    call.cost += sample_cost(m, *s);
    if (auto slow = options_.slow_ids.find(s->id); slow != options_.slow_ids.end()) {
      sleep += slow->second;
    }
    fails = fails || options_.failing_ids.count(s->id) > 0;
    throws = throws || options_.throwing_ids.count(s->id) > 0;
  }
  {
    std::lock_guard lock(mutex_);
    ++running_;
    most_running_ = std::max(most_running_, running_);
  }
  struct Done {
    FakeEncoder* self;
    Call& call;
    ~Done() {
      std::lock_guard lock(self->mutex_);
      --self->running_;
      self->calls_.push_back(std::move(call));
    }
  } done{this, call};
  if (sleep.count() > 0) std::this_thread::sleep_for(sleep);

  if (throws) {
    call.outcome = Outcome::kThrew;
    throw std::logic_error("fake " + std::string(modality_name(m)) +
                           " encoder: a bug on a marked sample");
  }
  if (options_.oom_above_cost >= 0 && call.cost > options_.oom_above_cost) {
    call.outcome = Outcome::kOutOfMemory;
    PC_THROW(DeviceOutOfMemoryError, "fake ", modality_name(m), " encoder on ", info_.device,
             " ran out of memory on a batch of ", batch.size(), " (cost ", call.cost, ")");
  }
  if (fails) {
    call.outcome = Outcome::kFailed;
    PC_THROW(ModelError, "fake ", modality_name(m), " encoder failed on a batch of ",
             batch.size(), " holding a marked sample");
  }

  const float trace = options_.batch_dependent ? fake_batch_trace(batch) : 0.0f;
  std::vector<SampleEmbedding> out;
  out.reserve(batch.size());
  for (const auto& s : batch) {
    SampleEmbedding e;
    e.seq = s->seq;
    e.dim = info_.dim;
    e.steps = static_cast<int32_t>(steps_of(m, *s));
    e.rows = info_.per_step ? steps_of(m, *s) : 1;
    for (int64_t r = 0; r < e.rows; ++r) {
      for (float v : fake_row(s->id, m, r, info_.dim)) e.values.push_back(v + trace);
    }
    if (info_.per_step && m == Modality::kVideo) e.timestamps = s->video->timestamps;
    if (info_.per_step && m == Modality::kAudio) e.timestamps = s->audio->timestamps;
    if (m == Modality::kText) e.truncated = s->text->truncated;
    out.push_back(std::move(e));
  }
  return out;
}

std::vector<FakeEncoder::Call> FakeEncoder::calls() const {
  std::lock_guard lock(mutex_);
  return calls_;
}

std::map<int64_t, int> FakeEncoder::embedded_counts() const {
  std::lock_guard lock(mutex_);
  std::map<int64_t, int> counts;
  for (const auto& call : calls_) {
    if (call.outcome != Outcome::kEmbedded) continue;
    for (int64_t seq : call.seqs) ++counts[seq];
  }
  return counts;
}

int FakeEncoder::most_concurrent_calls() const {
  std::lock_guard lock(mutex_);
  return most_running_;
}

}  // namespace precompute::testing
