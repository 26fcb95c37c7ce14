#include "storage/rank_lifecycle.hpp"

#include <spdlog/spdlog.h>

#include <utility>

namespace precompute {

// Note [A rank's record]
// rank.json describes the rank's output, so it changes only where the output does. A start-up
// that is refused (other settings, a model that does not load, a budget too small) leaves it as
// it was: the refusal left the output alone. Once the start-up has passed, the rank is
// "running"; it ends "done", "stopped" (a signal: a scheduler's preemption or time limit is not
// a failure of the rank) or "failed", with the error's message. A rerun of a finished rank that
// processes nothing leaves the earlier record as it was, its times and counts those of the run
// that made the output. overwrite_done says that the rank's --overwrite was carried out (in
// plan(); Note [Overwrite once] in pipeline/runner.cpp), so that the rerun command resumes
// instead of removing the rank's work again.

RankLifecycle::RankLifecycle(std::filesystem::path folder, RankRecord attempt)
    : folder_(std::move(folder)), record_(std::move(attempt)) {}

void RankLifecycle::write() const { write_rank_record(folder_, record_); }

void RankLifecycle::done_without_work(bool overwrite_done) {
  record_.state = "done";
  record_.overwrite_done = overwrite_done;
  record_.finished = unix_now();
  write();
}

void RankLifecycle::running(const std::string& output_id, bool overwriting,
                            bool overwrite_done) {
  earlier_ = read_rank_record(folder_);
  if (earlier_ && !overwriting && earlier_->span.first_seq == record_.span.first_seq &&
      earlier_->span.end_seq == record_.span.end_seq) {
    record_.started = earlier_->started > 0 ? earlier_->started : record_.started;
    record_.attempts = earlier_->attempts + 1;
  }
  record_.output_id = output_id;
  record_.state = "running";
  record_.overwrite_done = overwrite_done;
  write();
}

void RankLifecycle::overwrite_carried_out() {
  if (record_.overwrite_done) return;
  record_.overwrite_done = true;
  write();
}

void RankLifecycle::done(int64_t processed, double seconds) {
  if (processed == 0 && earlier_ && earlier_->state == "done" &&
      earlier_->output_id == record_.output_id) {
    write_rank_record(folder_, *earlier_);
    return;
  }
  record_.state = "done";
  record_.finished = unix_now();
  record_.processed = processed;
  record_.seconds = seconds;
  write();
}

void RankLifecycle::ended_by(const Error& error) noexcept {
  try {
    record_.state = dynamic_cast<const StoppedError*>(&error) != nullptr ? "stopped" : "failed";
    record_.finished = unix_now();
    record_.message = error.what();
    write();
  } catch (const std::exception& e) {
    spdlog::warn("cannot record the rank's failure: {}", e.what());
  }
}

}  // namespace precompute
