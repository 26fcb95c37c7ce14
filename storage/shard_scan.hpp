#pragma once
// Reads every byte of a shard that HDF5 can read back, in bounded memory, for `precompute
// verify`: every attribute, and every dataset end to end in blocks of whole chunks (so that the
// Fletcher-32 filter of each chunk is checked), keeping only what the output-wide checks need
// (ids, seqs, failure records' seqs and ids, per-modality presence counts). read_shard() is the
// other reader; it loads a whole shard as float32, which verify avoids.
// Not thread-safe with other HDF5 calls in the process: use from one thread.

#include <array>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/core/modality.hpp"

namespace precompute {

// A modality group's attributes, as the shard states them.
struct ScannedModality {
  int64_t dim = 0;
  std::string layout;
  std::string dtype;
  std::string encoder;
  std::string encoder_sha256;
  std::string pooling;
  std::string preprocessing;
};

struct ShardScan {
  // Root attributes.
  std::string output_id;
  std::string config_fingerprint;
  std::string storage_dtype;
  int64_t shard_index = 0;
  int64_t first_seq = 0;
  int64_t seq_count = 0;
  std::string input_sha256;  // empty in shards written before it was stored

  std::vector<std::string> ids;                   // /ids
  std::vector<int64_t> seqs;                      // /seq
  std::vector<int64_t> failure_seqs;              // /failures/seq
  std::vector<std::string> failure_ids;           // /failures/id
  std::array<int64_t, kNumModalities> present{};  // rows of /<modality>/present that are set
  std::array<std::optional<ScannedModality>, kNumModalities> modalities;  // groups present
  // String datasets whose rows do not hash to their `sha256` attribute, or that have none
  // (Note [Digests of string datasets] in shard_schema.hpp), each with why.
  std::vector<std::string> digest_problems;
  // Rows of each kept column, /columns/<name> (read end to end like every dataset), by name.
  std::map<std::string, int64_t> column_rows;

  int64_t datasets_read = 0;
  int64_t attributes_read = 0;
  uint64_t bytes_read = 0;  // dataset bytes as stored in memory (variable-length: pointers)
};

// Peak memory of a scan beyond the ids it keeps: one block of at most this many bytes (or one
// chunk, when a chunk is larger).
inline constexpr size_t kScanBlockBytes = size_t{4} << 20;

// Throws StorageError naming the file and the dataset or attribute that cannot be read (a
// checksum mismatch, a truncated file, a damaged header) or is not what the format says.
ShardScan scan_shard(const std::filesystem::path& file);

}  // namespace precompute
