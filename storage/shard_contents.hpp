#pragma once
// What one shard holds, in memory, before it is written (ShardWriter) and after it is read back
// (read_shard). The schema on disk is in docs/format.md; dataset and attribute names are in
// storage/shard_schema.hpp.

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/failure.hpp"
#include "pipeline/core/modality.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

// How one modality is stored in every shard of a run; fixed when the encoders are loaded.
struct ModalitySchema {
  Modality modality = Modality::kVideo;
  bool per_step = false;           // true: CSR layout (values/offsets/timestamps); false: pooled
  int64_t dim = 0;                 // embedding width
  std::string encoder;             // model file name
  std::string encoder_sha256;      // model file content hash
  std::string pooling;             // mean, none, cls, max, model
  std::string preprocessing_json;  // decode/tokenizer settings as JSON
};

// Settings shared by every shard of a run.
struct ShardMeta {
  std::string tool_version;
  std::string output_id;           // the output folder's (storage/output_id.hpp)
  std::string config_fingerprint;  // sha256 of semantic_config_json()
  std::string config_json;         // full_config_json()
  StorageDtype dtype = StorageDtype::kFloat16;
  int chunk_rows = 256;
  std::array<std::optional<ModalitySchema>, kNumModalities> modalities;  // unset: not computed
  // output.keep_columns: each a string dataset /columns/<name>; empty: no /columns group. Read
  // back from the recorded config (kept_columns_of_config() in output_index.hpp).
  std::vector<std::string> kept_columns;
};

// One sample that has at least one embedding.
struct ShardSample {
  int64_t seq = 0;
  std::string id;
  // One entry per modality; unset when the sample has no such input or its embedding failed.
  std::array<std::optional<SampleEmbedding>, kNumModalities> embeddings;
  // Its values of ShardMeta::kept_columns, in that order (the writer checks the count). Not
  // filled by read_shard(): the run takes them from the input again.
  std::vector<std::string> columns;
};

// The samples of manifest positions [first_seq, first_seq + seq_count).
struct ShardContents {
  int64_t shard_index = 0;
  int64_t first_seq = 0;
  int64_t seq_count = 0;
  // input_identity() (pipeline/resume.hpp) of the input samples of this range; empty in shards
  // written by versions before it was stored.
  std::string input_sha256;
  std::vector<ShardSample> samples;     // ascending seq; samples with no embedding are absent
  std::vector<FailureRecord> failures;  // ascending seq, then modality
};

}  // namespace precompute
