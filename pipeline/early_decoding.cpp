#include "pipeline/early_decoding.hpp"

#include <utility>

#include "pipeline/core/stop_request.hpp"

namespace precompute {

// Note [Decoding while the encoders load]
// Loading and warming up the encoders takes most of a second on a GPU (a ResNet-50 or a ViT:
// 0.75 s), and a second is a tenth of a 800-clip video job: the decoders, the job's bound, stood
// idle through it. So the run loads the encoders on a thread of its own and, meanwhile, sets up
// the decoders and prepares the first samples of its plan: twice the decode threads, the samples
// the graph holds in decoding anyway, so no more memory than the graph's own. The graph then
// takes each of them by position instead of preparing it (take()); one that no thread has started
// yet it prepares itself, so nothing is prepared twice.
//
// What stays as it was (Note [Refuse before touching the output] in pipeline/runner.cpp): the
// output folder is not changed before every refusal is behind; early decoding only writes the
// in-flight journal (crash containment holds from the first decode: a file that crashes the
// decoder now is quarantined like one that crashes it in the graph) and removes it when a refusal
// ends the run. The positions come from the folder as it was found (its index, or none with
// --overwrite): where the rebuilt or repaired index plans others, the samples prepared for
// positions it does not plan are dropped, the only cost a few decodes. Early decoding stays off
// where it could change what a run does: under run.host_memory_budget (its samples would be held
// outside the budget) and with --retry-failed (the plan reads shards).
//
// With --overwrite, a crash among the early decodes comes before the earlier run's files are
// removed, so the quarantine the supervisor writes for it lies beside them. The supervisor says
// so to the runs it restarts (RunContext::quarantine_is_this_commands): those take its suspects,
// and the removal leaves the quarantine, as it leaves the journal of the decodes under way. A
// quarantine that was there before the command is an earlier run's, about another input maybe:
// the removal takes it, and until then nothing is decoded early.
//
// A run that ends while early samples are still being decoded (refused once the encoders
// loaded, or ended by an error) drops them and cuts their decodes short (cut_decodes_short())
// rather than keeping the refusal waiting; a decoder that ignores the check holds it until the
// watchdog ends the process, as in the graph.
//
// The run's clock (the summary's `seconds.run`) leaves out only the part of the encoders' load
// that no decode overlapped: the time after the early samples were all prepared, or the whole
// load when none were.

EarlyDecoding::EarlyDecoding(const std::vector<SampleSpec>& input, std::vector<int64_t> positions,
                             Prepare prepare, int threads, std::function<void()> on_prepared,
                             std::function<void()> on_taken)
    : prepare_(std::move(prepare)),
      on_prepared_(std::move(on_prepared)),
      on_taken_(std::move(on_taken)) {
  items_.reserve(positions.size());
  for (size_t i = 0; i < positions.size(); ++i) {
    Item item;
    item.spec = input[static_cast<size_t>(positions[i])];
    item.spec.order = static_cast<int64_t>(i);
    by_seq_.emplace(item.spec.seq, items_.size());
    items_.push_back(std::move(item));
  }
  if (items_.empty() || threads < 1) {
    next_ = items_.size();
    idle_since_ = Clock::now();
    return;
  }
  const auto count = std::min<size_t>(static_cast<size_t>(threads), items_.size());
  threads_.reserve(count);
  for (size_t i = 0; i < count; ++i) threads_.emplace_back([this] { work(); });
}

EarlyDecoding::~EarlyDecoding() {
  {
    const std::lock_guard lock(mutex_);
    stopping_ = true;
    // The run ends with samples still being decoded (refused while the encoders loaded, or
    // ended by an error): their results are dropped, so their decodes end at the next check
    // instead of keeping the refusal waiting. A decoder that ignores the check is the watchdog's.
    if (busy_ > 0) cut_decodes_short();
  }
  for (auto& t : threads_) t.join();
}

void EarlyDecoding::work() {
  std::unique_lock lock(mutex_);
  for (;;) {
    while (next_ < items_.size() && items_[next_].state != State::kWaiting) ++next_;
    // A stop request leaves the rest to the graph, which takes no more samples.
    if (next_ == items_.size() || stopping_ || stop_requested()) break;
    Item& item = items_[next_++];
    item.state = State::kPreparing;
    ++busy_;
    lock.unlock();
    PreparedSamplePtr sample;
    std::exception_ptr error;
    try {
      sample = prepare_(item.spec);
    } catch (...) {
      error = std::current_exception();
    }
    if (on_prepared_ && !error) on_prepared_();
    lock.lock();
    item.sample = std::move(sample);
    item.error = error;
    item.state = State::kDone;
    --busy_;
    ++prepared_;
    done_.notify_all();
  }
  // The last thread to find nothing left marks when the decoders went idle.
  if (busy_ == 0 && !idle_since_) idle_since_ = Clock::now();
}

PreparedSamplePtr EarlyDecoding::take(int64_t seq) {
  std::unique_lock lock(mutex_);
  const auto found = by_seq_.find(seq);
  if (found == by_seq_.end()) return nullptr;
  Item& item = items_[found->second];
  switch (item.state) {
    case State::kWaiting:
      item.state = State::kTaken;  // the caller prepares it
      return nullptr;
    case State::kTaken:
      return nullptr;
    case State::kPreparing:
      done_.wait(lock, [&] { return item.state == State::kDone; });
      break;
    case State::kDone:
      break;
  }
  item.state = State::kTaken;
  auto sample = std::move(item.sample);
  const auto error = std::exchange(item.error, nullptr);
  lock.unlock();
  if (error) std::rethrow_exception(error);
  if (on_taken_) on_taken_();
  return sample;
}

std::optional<EarlyDecoding::Clock::time_point> EarlyDecoding::idle_since() const {
  const std::lock_guard lock(mutex_);
  return idle_since_;
}

int64_t EarlyDecoding::prepared() const {
  const std::lock_guard lock(mutex_);
  return prepared_;
}

}  // namespace precompute
