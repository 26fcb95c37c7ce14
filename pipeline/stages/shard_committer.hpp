#pragma once
// Commits assembled shards off the graph's writer node, in two threads: one builds each shard's
// HDF5 image in memory (the only thread that calls HDF5), the other writes, fsyncs and hashes
// it and replaces index.json. The assembler hands a shard over and goes on gathering the next;
// a shard's image is written while the next one is built. At most `max_pending` shards wait at
// each step; submit() blocks beyond that, which bounds the memory they hold. submit() and
// finish() are called from one thread (the assembler's).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "storage/output_index.hpp"
#include "storage/shard_contents.hpp"
#include "storage/shard_writer.hpp"

namespace precompute {

struct RunStats;

class ShardCommitter {
 public:
  // `index` is the run's index so far; every commit adds its shard and replaces index.json.
  ShardCommitter(std::filesystem::path output_dir, OutputIndex index, RunStats& stats,
                 size_t max_pending = 2);
  ~ShardCommitter();
  ShardCommitter(const ShardCommitter&) = delete;
  ShardCommitter& operator=(const ShardCommitter&) = delete;

  // Queues a complete shard. Rethrows the error of an earlier shard that failed.
  void submit(ShardContents contents);
  // Waits until every queued shard is committed and the one-file view shows them all; rethrows
  // the first error.
  void finish();
  // The index with every committed shard (complete after finish()).
  const OutputIndex& index() const { return index_; }

 private:
  // A shard's image between the two threads.
  struct Image {
    IndexEntry entry;  // without file, bytes and sha256 until written
    std::string bytes;
  };

  void build_loop();
  void write_loop();
  void write(const Image& image);
  // Waits on `ready` under the lock; false when stopping with nothing left.
  template <class Queue>
  bool wait_for_work(std::unique_lock<std::mutex>& lock, Queue& queue);
  void fail(std::exception_ptr error);
  // Rewrites dataset.h5 for index_ (Note [When the view is rewritten]); only from the thread
  // that writes the index, or once both threads are idle.
  void refresh_view();

  using Clock = std::chrono::steady_clock;

  std::filesystem::path output_dir_;
  ShardWriter writer_;
  OutputIndex index_;
  RunStats* stats_;
  size_t max_pending_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<ShardContents> to_build_;
  std::deque<Image> to_write_;
  // Written images' strings, whose capacity the next builds reuse (Note [Buffers kept from
  // shard to shard] in storage/shard_writer.cpp).
  std::vector<std::string> spare_images_;
  int working_ = 0;  // shards being built or written right now
  bool stopping_ = false;
  std::exception_ptr error_;
  // The view: whether it lags index_, when it was last written, how long that took.
  bool view_stale_ = false;
  Clock::time_point view_written_ = Clock::now();
  Clock::duration view_took_{};
  std::thread builder_;
  std::thread writer_thread_;
};

}  // namespace precompute
