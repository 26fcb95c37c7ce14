#pragma once
// Reads a shard written by ShardWriter back into memory (embeddings as float32), for `precompute
// inspect` and the tests. Trainers read shards with h5py (docs/format.md), not with this.
// Not thread-safe with other HDF5 calls in the process: use from one thread.

#include <filesystem>
#include <vector>

#include "storage/shard_contents.hpp"

namespace precompute {

struct ShardFile {
  ShardMeta meta;          // from the file's attributes (dtype, fingerprint, schemas); a shard
                           // does not store chunk_rows (index.json does), it keeps its default
  ShardContents contents;  // embeddings converted to float32
};

// Throws StorageError naming the file when it is not a precompute shard or is damaged.
ShardFile read_shard(const std::filesystem::path& file);

// Only the shard's failure records (what a run's summary counts of earlier runs' shards), without
// reading its embeddings. Throws as read_shard().
std::vector<FailureRecord> read_shard_failures(const std::filesystem::path& file);

}  // namespace precompute
