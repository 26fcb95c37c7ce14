#pragma once
// The names and constants of the shard format, in one place for the writer, the reader and the
// tests. docs/format.md describes the same schema for users; change both together, and bump
// kShardFormatVersion when a reader of the old version would misread the new files.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sha256.hpp"

namespace precompute::shard_schema {

inline constexpr std::string_view kShardFormat = "precompute-shard";
inline constexpr int64_t kShardFormatVersion = 1;

// Attributes of the root group "/".
inline constexpr char kFormatAttr[] = "format";
// The folder's output id (storage/output_id.hpp), the mark that proves the file is the tool's.
inline constexpr char kOutputIdAttr[] = "output_id";
inline constexpr char kFormatVersionAttr[] = "format_version";
inline constexpr char kToolVersionAttr[] = "tool_version";
inline constexpr char kConfigFingerprintAttr[] = "config_fingerprint";
inline constexpr char kConfigAttr[] = "config";
inline constexpr char kStorageDtypeAttr[] = "storage_dtype";
inline constexpr char kShardIndexAttr[] = "shard_index";
inline constexpr char kFirstSeqAttr[] = "first_seq";
inline constexpr char kSeqCountAttr[] = "seq_count";
// SHA-256 of the input samples of the shard's range (ids, paths, captions), so that an index
// rebuilt from the shards can tell a shard of an edited input (absent in older shards).
inline constexpr char kInputSha256Attr[] = "input_sha256";

// Note [Digests of string datasets]
// HDF5 can checksum only datasets of fixed-size elements (Fletcher-32, checked on every read);
// variable-length strings (/ids, /columns/<name>, the failure records) live in the global heap,
// where a flipped byte reads back as another id or label without an error. So each string
// dataset carries an attribute `sha256`: SHA-256 over every row's length in bytes (8 bytes,
// little-endian) and its bytes, in row order. `precompute verify` and the Python reader check
// it; plain h5py does not (docs/format.md).
inline constexpr char kStringsSha256Attr[] = "sha256";

class StringsDigest {
 public:
  void add(std::string_view value) {
    uint64_t size = value.size();
    unsigned char length[8];
    for (unsigned char& byte : length) {
      byte = static_cast<unsigned char>(size & 0xff);
      size >>= 8;
    }
    hash_.update(length, sizeof(length));
    hash_.update(value);
  }
  std::string hex() { return hash_.hex_digest(); }

 private:
  Sha256 hash_;
};

// Datasets of the root group: one row per sample that has at least one embedding.
inline constexpr char kIdsDataset[] = "ids";
inline constexpr char kSeqDataset[] = "seq";

// Attributes of a modality group ("/video", "/audio", "/text": modality_name()).
inline constexpr char kEncoderAttr[] = "encoder";
inline constexpr char kEncoderSha256Attr[] = "encoder_sha256";
inline constexpr char kPoolingAttr[] = "pooling";
inline constexpr char kPreprocessingAttr[] = "preprocessing";
inline constexpr char kDimAttr[] = "dim";
inline constexpr char kLayoutAttr[] = "layout";
inline constexpr char kDtypeAttr[] = "dtype";

inline constexpr std::string_view kPooledLayout = "pooled";
inline constexpr std::string_view kPerStepLayout = "per_step";

// Datasets of a modality group. Rows follow /ids, except values and timestamps, which have one
// row per step and are cut into samples by offsets (CSR).
inline constexpr char kPresentDataset[] = "present";
inline constexpr char kNumStepsDataset[] = "num_steps";
inline constexpr char kEmbeddingsDataset[] = "embeddings";  // pooled layout
inline constexpr char kValuesDataset[] = "values";          // per-step layout
inline constexpr char kOffsetsDataset[] = "offsets";        // per-step layout
inline constexpr char kTimestampsDataset[] = "timestamps";  // per-step video and audio
inline constexpr char kTruncatedDataset[] = "truncated";    // text

// The group of failure records and its datasets, one row per record.
inline constexpr char kFailuresGroup[] = "failures";
inline constexpr char kFailureSeqDataset[] = "seq";
inline constexpr char kFailureIdDataset[] = "id";
inline constexpr char kFailureModalityDataset[] = "modality";
inline constexpr char kFailureCategoryDataset[] = "category";
inline constexpr char kFailureMessageDataset[] = "message";

// The group of kept manifest columns (output.keep_columns): one variable-length UTF-8 string
// dataset per column, named as the column, row-aligned with /ids. Absent when none is kept.
inline constexpr char kColumnsGroup[] = "columns";

// Chunks hold meta.chunk_rows rows, but never more rows than the dataset (small shards stay
// small) and never more than this many bytes: HDF5's default chunk cache is 1 MiB per dataset,
// and a chunk larger than the cache is read from disk again for every slice a trainer takes.
inline constexpr size_t kMaxChunkBytes = size_t{1} << 20;

// The inverse of storage_dtype_name(), for the storage_dtype attribute and index.json.
inline std::optional<StorageDtype> parse_storage_dtype(std::string_view name) {
  for (StorageDtype dtype : {StorageDtype::kFloat16, StorageDtype::kFloat32}) {
    if (storage_dtype_name(dtype) == name) return dtype;
  }
  return std::nullopt;
}

}  // namespace precompute::shard_schema
