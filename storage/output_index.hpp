#pragma once
// index.json at the output root: which shards exist, their sample ranges and counts, the
// modalities with their dims, and the run's fingerprint. Replaced atomically after every shard
// commit, so a reader never sees a half-written index. Not thread-safe: the writer thread owns it.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <array>

#include "storage/shard_contents.hpp"

namespace precompute {

struct IndexEntry {
  std::string file;
  int64_t shard_index = 0;
  int64_t first_seq = 0;
  int64_t seq_count = 0;
  int64_t num_samples = 0;                                // samples with at least one embedding
  int64_t num_failures = 0;                               // failure records
  int64_t failed_samples = 0;                             // samples with a failure record
  std::array<int64_t, kNumModalities> modality_counts{};  // samples embedded per modality
  uint64_t bytes = 0;
  std::string sha256;
};

// The part of a split job's input that a rank folder covers (docs/distributed.md).
struct IndexRank {
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t first_seq = 0;
  int64_t end_seq = 0;
};

struct OutputIndex {
  ShardMeta meta;             // output id, modalities, dtype, fingerprint
  int64_t total_samples = 0;  // samples in the input
  int64_t shard_size = 0;
  std::string input;               // manifest or folder path, for the record
  // The input's identity: a SHA-256 over its first `input_samples` samples (ids, paths, texts),
  // so that a resume can tell an input that only grew from one that changed. -1: not known (an
  // index rebuilt from shards, whose ids were checked one by one instead).
  int64_t input_samples = -1;
  std::string input_sha256;
  // The settings a text model folder may decide, each with its value and source (Note [Where a
  // text setting comes from] in encoders/bert/text_settings.cpp); empty without text, and in an
  // index written before the field existed.
  std::vector<SettingOrigin> model_settings;
  std::vector<IndexEntry> shards;  // ascending first_seq, ranges disjoint
  // Set in a rank folder: the shards cover [first_seq, end_seq) of the job's input, not all of
  // it.
  std::optional<IndexRank> rank;

  // The input positions a finished output covers: its rank's span, or [0, total_samples).
  int64_t covers_first() const { return rank ? rank->first_seq : 0; }
  int64_t covers_end() const { return rank ? rank->end_seq : total_samples; }
};

inline constexpr std::string_view kIndexFileName = "index.json";
// The "format" and "format_version" fields of index.json (docs/format.md).
inline constexpr std::string_view kIndexFormat = "precompute-index";
inline constexpr int64_t kIndexFormatVersion = 1;

// The entry of a shard holding `contents`: its range and counts. The caller adds what only the
// written file tells (file, bytes, sha256).
IndexEntry index_entry_for(const ShardContents& contents);

// Why the file of a committed shard no longer matches its record: missing, another size, another
// SHA-256. Empty when it matches. Checked before anything opens the file (HDF5 may misread a
// damaged one).
std::string committed_shard_problem(const std::filesystem::path& output_dir,
                                    const IndexEntry& entry);

// Writes `index` to DIR/index.json atomically, with a checksum over everything it holds so that
// a damaged or edited file is detected even where it still parses. Returns index_sha256() of
// what it wrote. Throws StorageError.
std::string write_index(const std::filesystem::path& output_dir, const OutputIndex& index);

// The SHA-256 of the index.json that write_index() writes for `index`: the files derived from
// an index (dataset.h5, job.json) record it, so that one built from another index is found.
std::string index_sha256(const OutputIndex& index);

// output.keep_columns of a recorded config (full_config_json(), as index.json and every shard
// keep it); empty when it names none or cannot be parsed.
std::vector<std::string> kept_columns_of_config(const std::string& config_json);
// text.max_text_bytes of a recorded config, which bounds what is read of a tar's caption
// member; `fallback` (the key's default) when it is not there.
int64_t max_text_bytes_of_config(const std::string& config_json, int64_t fallback);
// Reads DIR/index.json; std::nullopt when there is none. Throws StorageError when it is damaged
// (not JSON, a field missing or of the wrong type, ranges out of order, a shard file name that
// is not one (a path, ".."), checksum mismatch).
std::optional<OutputIndex> read_index(const std::filesystem::path& output_dir);

}  // namespace precompute
