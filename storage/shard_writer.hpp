#pragma once
// Writes one shard: the HDF5 file is built in memory with HDF5's core driver (so that HDF5 never
// touches the output folder), then its image is committed by write_file_atomically(): temp file,
// fsync, rename, folder fsync (docs/reliability.md, "HDF5 is not crash-safe by
// itself").
// Thread-safety: build() on one thread (HDF5 is not concurrent, and build() reuses its buffers
// from shard to shard), commit() on any, also while build() runs.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "storage/shard_contents.hpp"
#include "storage/shard_file_name.hpp"

namespace precompute {

struct CommittedShard {
  std::string file;  // name inside the output folder: shard_file_name(index, sha256)
  uint64_t bytes = 0;
  std::string sha256;  // of the file's bytes
};

struct ShardBuildBuffers;  // shard_writer.cpp

class ShardWriter {
 public:
  ShardWriter(std::filesystem::path output_dir, ShardMeta meta);
  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) = delete;
  ~ShardWriter();

  // Validates `contents` against the meta (dims, per-step rows, ascending seqs), builds the
  // shard and commits it under shard_file_name() of its index and bytes. Throws StorageError naming
  // the path on any failure; the output folder then holds no partial shard file.
  CommittedShard write(const ShardContents& contents);

  // write() in two steps, for callers that run them on different threads: build() validates and
  // makes the file image in memory (the only step that calls HDF5), commit() writes it
  // atomically and hashes it (no HDF5).
  std::string build(const ShardContents& contents) const;
  // build() into `image`, whose capacity is reused (Note [Buffers kept from shard to shard] in
  // shard_writer.cpp): a caller that hands each committed image back here allocates no
  // shard-sized buffer after the first shards.
  void build(const ShardContents& contents, std::string& image) const;
  CommittedShard commit(int64_t shard_index, const std::string& image) const;

  const ShardMeta& meta() const { return meta_; }
  // Builds whose in-memory file found the previous one's block ready (Note [Buffers kept from
  // shard to shard] in shard_writer.cpp); for the tests.
  int64_t in_memory_file_reuses() const;

 private:
  std::filesystem::path output_dir_;
  ShardMeta meta_;
  std::unique_ptr<ShardBuildBuffers> buffers_;  // build()'s, kept from shard to shard
};

}  // namespace precompute
