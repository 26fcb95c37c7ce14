#include "pipeline/stages/shard_committer.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <string>
#include <system_error>
#include <vector>

#include "pipeline/run_stats.hpp"
#include "storage/dataset_view.hpp"

namespace precompute {

ShardCommitter::ShardCommitter(std::filesystem::path output_dir, OutputIndex index,
                               RunStats& stats, size_t max_pending)
    : output_dir_(std::move(output_dir)),
      writer_(output_dir_, index.meta),
      index_(std::move(index)),
      stats_(&stats),
      max_pending_(std::max<size_t>(1, max_pending)),
      builder_([this] { build_loop(); }),
      writer_thread_([this] { write_loop(); }) {}

ShardCommitter::~ShardCommitter() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  builder_.join();
  writer_thread_.join();
  // A run that failed or stopped keeps a view of every shard it committed.
  if (view_stale_) refresh_view();
}

void ShardCommitter::submit(ShardContents contents) {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] { return to_build_.size() < max_pending_ || error_; });
  if (error_) std::rethrow_exception(error_);
  to_build_.push_back(std::move(contents));
  changed_.notify_all();
}

void ShardCommitter::finish() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [&] {
    return (to_build_.empty() && to_write_.empty() && working_ == 0) || error_;
  });
  if (error_) std::rethrow_exception(error_);
  // Both threads are idle and stay so: no shard is queued.
  if (view_stale_) refresh_view();
}

// Note [When the view is rewritten]
// The one-file view (storage/dataset_view.hpp) names every committed shard, so rewriting it costs
// time in proportion to the shards so far, under the HDF5 lock that the shard builder needs too.
// Rewritten after every commit, the view costs time quadratic in the shard count: a run of
// 1,000,000 captions in 122 shards spent about as long on views as on shards (docs/benchmarks.md,
// "The shard builder, and the text path's own ceiling"). So after a commit it is rewritten only
// when a second has passed since the last rewrite, and at least ten times as long as that rewrite
// took (at most a tenth of the writer's time, however many shards), or when the commit replaced a
// shard (the view must never name a file that is about to be deleted); and always once the run's
// last shard is committed (finish(), or the destructor after a failure or a stop). Between rewrites
// the view shows fewer shards than index.json, never a file that does not exist.
void ShardCommitter::refresh_view() {
  const auto started = Clock::now();
  refresh_dataset_view(output_dir_, index_);  // never throws: the view is a convenience
  view_written_ = Clock::now();
  view_took_ = view_written_ - started;
  view_stale_ = false;
}

template <class Queue>
bool ShardCommitter::wait_for_work(std::unique_lock<std::mutex>& lock, Queue& queue) {
  // The builder stops once told to and idle; the writer also waits for the builder's last image.
  changed_.wait(lock, [&] { return !queue.empty() || (stopping_ && working_ == 0); });
  return !queue.empty();
}

void ShardCommitter::fail(std::exception_ptr error) {
  if (!error_) error_ = std::move(error);
  // Nothing after a failed shard may be recorded.
  to_build_.clear();
  to_write_.clear();
}

void ShardCommitter::build_loop() {
  std::unique_lock lock(mutex_);
  while (wait_for_work(lock, to_build_)) {
    ShardContents contents = std::move(to_build_.front());
    to_build_.pop_front();
    Image image;
    if (!spare_images_.empty()) {
      image.bytes = std::move(spare_images_.back());
      spare_images_.pop_back();
    }
    ++working_;
    changed_.notify_all();
    lock.unlock();
    std::exception_ptr error;
    try {
      const StageTimer timer(stats_->build_ns);
      writer_.build(contents, image.bytes);
      image.entry = index_entry_for(contents);
    } catch (...) {
      error = std::current_exception();
    }
    contents = ShardContents{};  // only the image waits for the writer
    lock.lock();
    // The writer may take at most max_pending images: wait for room.
    changed_.wait(lock, [&] { return to_write_.size() < max_pending_ || error_ || error; });
    if (error) {
      fail(error);
    } else if (!error_) {
      to_write_.push_back(std::move(image));
    }
    --working_;
    changed_.notify_all();
  }
}

void ShardCommitter::write_loop() {
  std::unique_lock lock(mutex_);
  while (wait_for_work(lock, to_write_)) {
    Image image = std::move(to_write_.front());
    to_write_.pop_front();
    ++working_;
    changed_.notify_all();
    lock.unlock();
    std::exception_ptr error;
    try {
      write(image);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    // At most one image a step can be in flight (built, waiting, written): more spares than
    // that would only hold memory.
    if (spare_images_.size() < max_pending_ + 2) spare_images_.push_back(std::move(image.bytes));
    if (error) fail(error);
    --working_;
    changed_.notify_all();
  }
}

void ShardCommitter::write(const Image& image) {
  const StageTimer timer(stats_->commit_ns);
  const auto committed = writer_.commit(image.entry.shard_index, image.bytes);
  IndexEntry entry = image.entry;
  entry.file = committed.file;
  entry.bytes = committed.bytes;
  entry.sha256 = committed.sha256;
  // Only this thread touches the index while the run goes on. A shard redone by
  // --retry-failed replaces the entry of the same range; the old file goes once the index no
  // longer lists it.
  std::vector<std::string> replaced;
  std::erase_if(index_.shards, [&](const IndexEntry& e) {
    const bool overlaps = e.first_seq < entry.first_seq + entry.seq_count &&
                          entry.first_seq < e.first_seq + e.seq_count;
    if (overlaps && e.file != entry.file) replaced.push_back(e.file);
    return overlaps;
  });
  index_.shards.push_back(entry);
  std::sort(index_.shards.begin(), index_.shards.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.first_seq < b.first_seq; });
  write_index(output_dir_, index_);
  view_stale_ = true;
  const auto since = Clock::now() - view_written_;
  if (!replaced.empty() || (since >= std::chrono::seconds(1) && since >= 10 * view_took_)) {
    refresh_view();
  }
  for (const auto& file : replaced) {
    std::error_code ignored;  // a leftover is deleted by the next resume anyway
    std::filesystem::remove(output_dir_ / file, ignored);
  }

  stats_->shards_written.fetch_add(1, std::memory_order_relaxed);
  stats_->bytes_written.fetch_add(static_cast<int64_t>(committed.bytes),
                                  std::memory_order_relaxed);
  spdlog::debug("committed {} ({} samples, {} failures, {} bytes)", committed.file,
                entry.num_samples, entry.num_failures, committed.bytes);
}

}  // namespace precompute
