#include "pipeline/stages/shard_committer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>

#include "pipeline/run_stats.hpp"

namespace precompute {

ShardCommitter::ShardCommitter(std::filesystem::path output_dir, OutputIndex index,
                               RunStats& stats, size_t max_pending)
    : output_dir_(std::move(output_dir)),
      writer_(output_dir_, index.meta),
      index_(std::move(index)),
      stats_(&stats),
      max_pending_(std::max<size_t>(1, max_pending)),
      thread_([this] { loop(); }) {}

ShardCommitter::~ShardCommitter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void ShardCommitter::submit(ShardContents contents) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return queue_.size() < max_pending_ || error_; });
  if (error_) std::rethrow_exception(error_);
  queue_.push_back(std::move(contents));
  changed_.notify_all();
}

void ShardCommitter::finish() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return (queue_.empty() && !busy_) || error_; });
  if (error_) std::rethrow_exception(error_);
}

void ShardCommitter::loop() {
  std::unique_lock lock(mutex_);
  while (true) {
    changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, nothing left
    ShardContents contents = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr error;
    try {
      commit(contents);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (error && !error_) error_ = error;
    if (error_) queue_.clear();  // nothing after a failed commit may be recorded
    changed_.notify_all();
  }
}

void ShardCommitter::commit(ShardContents& contents) {
  const StageTimer timer(stats_->commit_ns);
  const auto committed = writer_.write(contents);

  IndexEntry entry;
  entry.file = committed.file;
  entry.shard_index = contents.shard_index;
  entry.first_seq = contents.first_seq;
  entry.seq_count = contents.seq_count;
  entry.num_samples = static_cast<int64_t>(contents.samples.size());
  entry.num_failures = static_cast<int64_t>(contents.failures.size());
  for (const auto& s : contents.samples) {
    for (int m = 0; m < kNumModalities; ++m) entry.modality_counts[m] += s.embeddings[m] ? 1 : 0;
  }
  entry.bytes = committed.bytes;
  entry.sha256 = committed.sha256;
  index_.shards.push_back(entry);
  std::sort(index_.shards.begin(), index_.shards.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.shard_index < b.shard_index; });
  write_index(output_dir_, index_);

  stats_->shards_written.fetch_add(1, std::memory_order_relaxed);
  stats_->bytes_written.fetch_add(static_cast<int64_t>(committed.bytes),
                                  std::memory_order_relaxed);
  spdlog::debug("committed {} ({} samples, {} failures, {} bytes)", committed.file,
                entry.num_samples, entry.num_failures, committed.bytes);
}

}  // namespace precompute
