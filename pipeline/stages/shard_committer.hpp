#pragma once
// Commits assembled shards on a thread of its own, so that writing HDF5 images, hashing and
// fsyncing them never stalls the graph's writer node: the assembler hands a shard over and goes
// on gathering the next one. This thread is the only one that touches HDF5. At most
// `max_pending` shards wait; submit() blocks beyond that, which bounds the memory they hold.
// submit() and finish() are called from one thread (the assembler's).

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <filesystem>
#include <mutex>
#include <thread>

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

  // Queues a complete shard. Rethrows the error of an earlier commit that failed.
  void submit(ShardContents contents);
  // Waits until every queued shard is committed; rethrows the first commit error.
  void finish();
  // The index with every committed shard (complete after finish()).
  const OutputIndex& index() const { return index_; }

 private:
  void loop();
  void commit(ShardContents& contents);

  std::filesystem::path output_dir_;
  ShardWriter writer_;
  OutputIndex index_;
  RunStats* stats_;
  size_t max_pending_;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<ShardContents> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

}  // namespace precompute
