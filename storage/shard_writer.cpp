#include "storage/shard_writer.hpp"

#include <fmt/format.h>
#include <hdf5.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/atomic_file.hpp"
#include "storage/shard_file_name.hpp"
#include "storage/fletcher32.hpp"
#include "storage/float16.hpp"
#include "storage/h5_handle.hpp"
#include "storage/hdf5_lock.hpp"
#include "storage/shard_schema.hpp"

namespace precompute {
namespace {

namespace schema = shard_schema;
using std::filesystem::path;

// ---------------------------------------------------------------------------------------------
// Validation: everything the schema promises a reader, checked before HDF5 is called.

// Names the shard and the sample at the start of a validation message.
std::string sample_context(const path& target, const ShardSample& sample, Modality modality) {
  return detail::concat("cannot write ", target, ": the ", modality_name(modality),
                        " embedding of sample '", sample.id, "' (seq ", sample.seq, ")");
}

void check_no_nul(std::string_view text, const path& target, std::string_view what) {
  // HDF5 variable-length strings end at the first NUL; the rest would be lost silently.
  PC_CHECK(text.find('\0') == std::string_view::npos, StorageError, "cannot write ", target, ": ",
           what, " contains a NUL character");
}

// The length of the well-formed UTF-8 sequence that `text` starts with (Unicode's table 3-7:
// no overlong forms, surrogates or code points past U+10FFFF), or 0 when it starts with none.
size_t utf8_sequence_length(std::string_view text) {
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const unsigned char lead = byte(0);
  if (lead < 0x80) return 1;
  size_t length = 0;
  unsigned char second_min = 0x80, second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    if (lead == 0xE0) second_min = 0xA0;
    if (lead == 0xED) second_max = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;
  } else {
    return 0;
  }
  if (text.size() < length || byte(1) < second_min || byte(1) > second_max) return 0;
  for (size_t i = 2; i < length; ++i) {
    if ((byte(i) & 0xC0) != 0x80) return 0;
  }
  return length;
}

// Failure messages quote paths, which are bytes; the dataset is typed UTF-8, and readers such as
// h5py's asstr() refuse to decode anything else, so bad bytes are stored as U+FFFD.
std::string with_invalid_utf8_replaced(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  while (!text.empty()) {
    const size_t length = utf8_sequence_length(text);
    if (length == 0) {
      out += "\xEF\xBF\xBD";
      text.remove_prefix(1);
    } else {
      out.append(text.substr(0, length));
      text.remove_prefix(length);
    }
  }
  return out;
}

void validate_embedding(const ModalitySchema& schema, const ShardSample& sample,
                        const SampleEmbedding& embedding, const path& target) {
  const Modality m = schema.modality;
  PC_ASSERT(embedding.seq == sample.seq, "embedding seq ", embedding.seq, " in sample ",
            sample.seq);
  PC_ASSERT(embedding.rows >= 0 && embedding.steps >= 0);
  PC_ASSERT(embedding.values.size() == static_cast<size_t>(embedding.rows * embedding.dim),
            "values ", embedding.values.size(), " for ", embedding.rows, " x ", embedding.dim);

  PC_CHECK(embedding.dim == schema.dim, StorageError, sample_context(target, sample, m),
           " has dim ", embedding.dim, ", but the run's ", modality_name(m), " schema has dim ",
           schema.dim);
  if (schema.per_step) {
    PC_CHECK(embedding.rows >= 1, StorageError, sample_context(target, sample, m),
             " has no rows; an empty result must be a failure record");
  } else {
    PC_CHECK(embedding.rows == 1, StorageError, sample_context(target, sample, m), " has ",
             embedding.rows, " rows, but the ", modality_name(m),
             " layout is pooled (one row per sample)");
  }
  const bool wants_timestamps = schema.per_step && m != Modality::kText;
  const size_t expected_timestamps = wants_timestamps ? static_cast<size_t>(embedding.rows) : 0;
  PC_CHECK(embedding.timestamps.size() == expected_timestamps, StorageError,
           sample_context(target, sample, m), " has ", embedding.timestamps.size(),
           " timestamps for ", embedding.rows, " rows; expected ", expected_timestamps,
           wants_timestamps ? " (one per step)" : " (only per-step video and audio have them)");
}

void validate_contents(const ShardMeta& meta, const ShardContents& contents, const path& target) {
  PC_ASSERT(contents.shard_index >= 0 && contents.first_seq >= 0 && contents.seq_count >= 0);
  const int64_t end_seq = contents.first_seq + contents.seq_count;
  const auto check_range = [&](int64_t seq, std::string_view id, std::string_view what) {
    PC_CHECK(seq >= contents.first_seq && seq < end_seq, StorageError, "cannot write ", target,
             ": ", what, " '", id, "' has seq ", seq, ", outside the shard's range [",
             contents.first_seq, ", ", end_seq, ")");
  };

  int64_t previous_seq = -1;
  for (const ShardSample& sample : contents.samples) {
    check_range(sample.seq, sample.id, "sample");
    PC_CHECK(sample.seq > previous_seq, StorageError, "cannot write ", target, ": sample '",
             sample.id, "' (seq ", sample.seq, ") is not after seq ", previous_seq,
             "; samples must be in ascending seq order, each once");
    previous_seq = sample.seq;
    check_no_nul(sample.id, target, "a sample id");

    bool has_embedding = false;
    for (Modality m : kAllModalities) {
      const auto& embedding = sample.embeddings[modality_index(m)];
      if (!embedding) continue;
      const auto& schema = meta.modalities[modality_index(m)];
      PC_CHECK(schema.has_value(), StorageError, sample_context(target, sample, m),
               " cannot be stored: the run has no ", modality_name(m), " schema");
      validate_embedding(*schema, sample, *embedding, target);
      has_embedding = true;
    }
    PC_CHECK(has_embedding, StorageError, "cannot write ", target, ": sample '", sample.id,
             "' (seq ", sample.seq, ") has no embedding; it belongs in the failure records only");
    PC_CHECK(sample.columns.size() == meta.kept_columns.size(), StorageError, "cannot write ",
             target, ": sample '", sample.id, "' (seq ", sample.seq, ") has ",
             sample.columns.size(), " kept column values, but the run keeps ",
             meta.kept_columns.size(), " columns");
    for (size_t k = 0; k < sample.columns.size(); ++k) {
      check_no_nul(sample.columns[k], target,
                   detail::concat("kept column '", meta.kept_columns[k], "' of sample '",
                                  sample.id, "'"));
    }
  }
  for (const auto& name : meta.kept_columns) {
    check_no_nul(name, target, "a kept column's name");
    PC_CHECK(!name.empty() && name.find('/') == std::string::npos && name != "." && name != "..",
             StorageError, "cannot write ", target, ": '", name,
             "' cannot name a dataset of /columns");
  }

  std::pair<int64_t, int> previous_failure{-1, -1};
  for (const FailureRecord& failure : contents.failures) {
    check_range(failure.seq, failure.id, "failure record of sample");
    const std::pair<int64_t, int> key{failure.seq, modality_index(failure.modality)};
    PC_CHECK(key >= previous_failure, StorageError, "cannot write ", target,
             ": failure records must be in ascending (seq, modality) order; seq ", failure.seq,
             " (", modality_name(failure.modality), ") is out of order");
    previous_failure = key;
    check_no_nul(failure.id, target, "a failure record's sample id");
    check_no_nul(failure.message, target, "a failure record's message");
  }
}

// ---------------------------------------------------------------------------------------------
// Columns: one modality's datasets as plain vectors, row-aligned with /ids.

struct ModalityColumns {
  std::vector<uint8_t> present;
  std::vector<int32_t> num_steps;
  std::vector<uint8_t> truncated;  // text only
  std::vector<float> values;       // per-step only: one row per step of the present samples
                                   // (pooled rows go straight to the stored type:
                                   // ShardImageBuilder::write_pooled_rows)
  std::vector<int64_t> offsets;    // per-step only: N + 1 row offsets into values
  std::vector<double> timestamps;  // per-step video and audio only: one per step
};

ModalityColumns gather_columns(const ModalitySchema& schema,
                               const std::vector<ShardSample>& samples) {
  const size_t n = samples.size();
  const size_t dim = static_cast<size_t>(schema.dim);
  const bool is_text = schema.modality == Modality::kText;
  ModalityColumns columns;
  columns.present.assign(n, 0);
  columns.num_steps.assign(n, 0);
  if (is_text) columns.truncated.assign(n, 0);
  if (schema.per_step) {
    columns.offsets.reserve(n + 1);
    columns.offsets.push_back(0);
  }

  for (size_t i = 0; i < n; ++i) {
    const auto& embedding = samples[i].embeddings[modality_index(schema.modality)];
    if (embedding) {
      columns.present[i] = 1;
      columns.num_steps[i] = embedding->steps;
      if (is_text) columns.truncated[i] = embedding->truncated ? 1 : 0;
      if (schema.per_step) {
        columns.values.insert(columns.values.end(), embedding->values.begin(),
                              embedding->values.end());
        columns.timestamps.insert(columns.timestamps.end(), embedding->timestamps.begin(),
                                  embedding->timestamps.end());
      }
    }
    if (schema.per_step)
      columns.offsets.push_back(static_cast<int64_t>(columns.values.size() / dim));
  }
  return columns;
}

// ---------------------------------------------------------------------------------------------
// Buffers kept from shard to shard.

// Note [Buffers kept from shard to shard]
// A shard of 8,192 captions x 768 values is 12.6 MB, and building one needs buffers of about
// that size: the rows in the stored type, HDF5's in-memory file, and the image copied out of it.
// Buffers that large, allocated afresh, are fresh mappings from the kernel (main()'s fixed mmap
// threshold, Note [Host memory and glibc malloc] in tools/cli/main.cpp), so each shard would pay
// for first-touching them page by page, about 9,000 page faults, on the one thread that builds
// every shard; those faults held the build to under a third of its rate (tools/bench/shard_bench;
// docs/benchmarks.md, "The shard builder, and the text path's own ceiling"), and a text job
// cannot go faster than its builder however many GPUs embed it. So the builder keeps them: the
// rows in vectors it reuses, the in-memory file in a block that HDF5's core driver takes through
// the file image callbacks (CoreFileBlock: it gives the block back when the file closes, and the
// next shard gets it again), and the image in the caller's string, whose capacity the committer
// hands back after each commit (ShardCommitter). HDF5 still copies the file into the image: a
// copy of pages already resident costs a few milliseconds a shard; the faults cost tens. Memory
// kept between shards: the block and the rows, about two images.

// The block HDF5's core driver keeps one in-memory file in, handed out through the file image
// callbacks and kept for the next file. A request while the block is taken (none with these
// settings: one file at a time, no initial image) is served by malloc, as without callbacks.
class CoreFileBlock {
 public:
  CoreFileBlock() = default;
  CoreFileBlock(const CoreFileBlock&) = delete;
  CoreFileBlock& operator=(const CoreFileBlock&) = delete;
  ~CoreFileBlock() { std::free(block_); }

  // For H5Pset_file_image_callbacks; `this` must outlive every file opened with them.
  H5FD_file_image_callbacks_t callbacks() {
    H5FD_file_image_callbacks_t c{};
    c.image_malloc = [](size_t size, H5FD_file_image_op_t, void* self) {
      return static_cast<CoreFileBlock*>(self)->allocate(size);
    };
    c.image_memcpy = [](void* to, const void* from, size_t size, H5FD_file_image_op_t,
                        void*) { return std::memcpy(to, from, size); };
    c.image_realloc = [](void* block, size_t size, H5FD_file_image_op_t, void* self) {
      return static_cast<CoreFileBlock*>(self)->reallocate(block, size);
    };
    c.image_free = [](void* block, H5FD_file_image_op_t, void* self) -> herr_t {
      static_cast<CoreFileBlock*>(self)->release(block);
      return 0;
    };
    // The property list copies its callbacks' user data as it is copied: all copies are `this`.
    c.udata_copy = [](void* self) { return self; };
    c.udata_free = [](void*) -> herr_t { return 0; };
    c.udata = this;
    return c;
  }

  // How many times a file found the block ready (for the tests).
  int64_t reuses() const { return reuses_; }

 private:
  void* allocate(size_t size) {
    if (taken_) return std::malloc(size);
    if (capacity_ < size) {
      std::free(block_);
      block_ = std::malloc(size);
      capacity_ = block_ != nullptr ? size : 0;
      if (block_ == nullptr) return nullptr;
    } else {
      ++reuses_;
    }
    taken_ = true;
    return block_;
  }
  void* reallocate(void* block, size_t size) {
    if (block == nullptr) return allocate(size);
    if (block != block_ || !taken_) return std::realloc(block, size);
    if (size <= capacity_) return block_;
    void* grown = std::realloc(block_, size);
    if (grown == nullptr) return nullptr;  // block_ is still valid, and still taken
    block_ = grown;
    capacity_ = size;
    return block_;
  }
  void release(void* block) {
    if (block != nullptr && block == block_ && taken_) {
      taken_ = false;
      return;
    }
    std::free(block);
  }

  void* block_ = nullptr;
  size_t capacity_ = 0;
  bool taken_ = false;
  int64_t reuses_ = 0;
};

}  // namespace

struct ShardBuildBuffers {
  std::vector<uint16_t> halves;      // rows in float16, pooled or per step
  std::vector<float> floats;         // pooled rows in float32
  std::vector<unsigned char> chunk;  // one chunk and its checksum (Note [Chunks written whole])
  CoreFileBlock file;
};

namespace {

// ---------------------------------------------------------------------------------------------
// HDF5: the file, built in memory.

// An open group and its path, for messages.
struct Group {
  H5Handle handle;
  std::string path;

  std::string child(std::string_view name) const {
    return path.ends_with('/') ? path + std::string(name) : path + "/" + std::string(name);
  }
};

// Builds one shard file in memory and returns its bytes. Every HDF5 failure throws StorageError
// naming `target`, the file the image is for.
class ShardImageBuilder {
 public:
  ShardImageBuilder(const ShardMeta& meta, const path& target, ShardBuildBuffers& buffers)
      : meta_(meta),
        target_(target),
        buffers_(buffers),
        string_type_(make_utf8_string_type(target)),
        float16_type_(make_float16_type(target)) {}

  // The file's bytes into `image` (its capacity reused).
  void build(const ShardContents& contents, std::string& image);

 private:
  void write_root(const Group& root, const ShardContents& contents);
  void write_modality(const Group& root, const ModalitySchema& schema,
                      const std::vector<ShardSample>& samples);
  void write_failures(const Group& root, const std::vector<FailureRecord>& failures);
  void write_kept_columns(const Group& root, const std::vector<ShardSample>& samples);

  Group create_group(const Group& parent, std::string_view name);
  void write_attribute(const Group& group, const char* name, std::string_view value);
  // `attribute_path` names the attribute in messages.
  void write_attribute(hid_t object, const std::string& attribute_path, const char* name,
                       std::string_view value);
  void write_attribute(const Group& group, const char* name, int64_t value);
  template <class T>
  void write_column(const Group& group, const char* name, const std::vector<T>& values) {
    write_dataset(group, name, {values.size(), 0}, H5Type<T>::file(), H5Type<T>::memory(),
                  values.data());
  }
  // `link_properties`: how the dataset's name is stored (H5P_DEFAULT: ASCII).
  void write_strings(const Group& group, const char* name, const std::vector<std::string>& values,
                     hid_t link_properties = H5P_DEFAULT);
  void write_embedding_rows(const Group& group, const char* name, const std::vector<float>& values,
                            int64_t dim);
  // One row per sample, zeros where the sample has no embedding of the modality, converted from
  // each sample's vector straight into the stored type (a shard of 8,192 x 768 would otherwise
  // be copied once more as float32 first: 25 MB, a quarter of the build's time).
  void write_pooled_rows(const Group& group, const ModalitySchema& schema,
                         const std::vector<ShardSample>& samples);
  // The rows of a dataset of fixed-size elements, chunk by chunk, checksummed here (Note [Chunks
  // written whole]).
  void write_chunks(hid_t dataset, std::array<hsize_t, 2> shape, hsize_t chunk_rows,
                    size_t row_bytes, const void* data, const std::string& operation);
  // A chunked dataset of `shape` (rows, or rows x columns when columns > 0), growable in rows.
  H5Handle write_dataset(const Group& group, const char* name, std::array<hsize_t, 2> shape,
                         hid_t file_type, hid_t memory_type, const void* data,
                         hid_t link_properties = H5P_DEFAULT);
  H5Handle object_creation_properties(hid_t property_class, std::string_view what);

  const ShardMeta& meta_;
  const path& target_;
  ShardBuildBuffers& buffers_;
  H5Handle string_type_;
  H5Handle float16_type_;
};

void ShardImageBuilder::build(const ShardContents& contents, std::string& image) {
  // Note [Shard in memory]: the core driver without a backing store keeps the whole file in
  // memory, so HDF5 never writes to the output folder; the image is committed by
  // write_file_atomically() instead (docs/reliability.md, "HDF5 is not crash-safe
  // by itself").
  // The core driver grows its buffer in steps of this size: one step of about the whole image
  // avoids reallocating and copying it as it grows.
  const size_t element_bytes = meta_.dtype == StorageDtype::kFloat16 ? 2 : 4;
  size_t expected_bytes = size_t{1} << 20;
  for (const ShardSample& sample : contents.samples) {
    expected_bytes += sample.id.size() + 64;
    for (const auto& value : sample.columns) expected_bytes += value.size() + 32;
    for (const auto& e : sample.embeddings) {
      if (e) expected_bytes += e->values.size() * element_bytes + e->timestamps.size() * 8;
    }
  }
  H5Handle access = h5_own(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)", target_);
  h5_check(H5Pset_fapl_core(access.get(), expected_bytes, /*backing_store=*/0),
           "H5Pset_fapl_core", target_);
  // Note [Buffers kept from shard to shard].
  H5FD_file_image_callbacks_t callbacks = buffers_.file.callbacks();  // HDF5 copies it
  h5_check(H5Pset_file_image_callbacks(access.get(), &callbacks), "H5Pset_file_image_callbacks",
           target_);
  H5Handle creation = object_creation_properties(H5P_FILE_CREATE, "file");

  // HDF5 first tries to open the name as an existing file, even with the core driver. A path
  // below /dev/null cannot exist, so that probe never reads anything from disk.
  const std::string memory_name = "/dev/null/precompute-in-memory/" + target_.filename().string();
  {
    H5Handle file =
        h5_own(H5Fcreate(memory_name.c_str(), H5F_ACC_TRUNC, creation.get(), access.get()),
               "H5Fcreate (in memory)", target_);
    {
      const Group root{h5_own(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2 /", target_), "/"};
      write_root(root, contents);
      for (const auto& schema : meta_.modalities) {
        if (schema) write_modality(root, *schema, contents.samples);
      }
      write_failures(root, contents.failures);
      if (!meta_.kept_columns.empty()) write_kept_columns(root, contents.samples);
    }
    h5_check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "H5Fflush (in memory)", target_);
    const ssize_t size =
        h5_check(H5Fget_file_image(file.get(), nullptr, 0), "H5Fget_file_image (size)", target_);
    image.resize(static_cast<size_t>(size));
    h5_check(H5Fget_file_image(file.get(), image.data(), image.size()), "H5Fget_file_image",
             target_);
  }
}

void ShardImageBuilder::write_root(const Group& root, const ShardContents& contents) {
  write_attribute(root, schema::kFormatAttr, schema::kShardFormat);
  // First after the format, so that it sits in the file's first bytes (Note [Proving a file is
  // ours] in storage/output_id.cpp).
  write_attribute(root, schema::kOutputIdAttr, meta_.output_id);
  write_attribute(root, schema::kFormatVersionAttr, schema::kShardFormatVersion);
  write_attribute(root, schema::kToolVersionAttr, meta_.tool_version);
  write_attribute(root, schema::kConfigFingerprintAttr, meta_.config_fingerprint);
  write_attribute(root, schema::kConfigAttr, meta_.config_json);
  write_attribute(root, schema::kStorageDtypeAttr, storage_dtype_name(meta_.dtype));
  write_attribute(root, schema::kShardIndexAttr, contents.shard_index);
  write_attribute(root, schema::kFirstSeqAttr, contents.first_seq);
  write_attribute(root, schema::kSeqCountAttr, contents.seq_count);
  if (!contents.input_sha256.empty()) {
    write_attribute(root, schema::kInputSha256Attr, contents.input_sha256);
  }

  std::vector<std::string> ids;
  std::vector<int64_t> seqs;
  ids.reserve(contents.samples.size());
  seqs.reserve(contents.samples.size());
  for (const ShardSample& sample : contents.samples) {
    ids.push_back(sample.id);
    seqs.push_back(sample.seq);
  }
  write_strings(root, schema::kIdsDataset, ids);
  write_column(root, schema::kSeqDataset, seqs);
}

void ShardImageBuilder::write_modality(const Group& root, const ModalitySchema& schema,
                                       const std::vector<ShardSample>& samples) {
  const Group group = create_group(root, modality_name(schema.modality));
  write_attribute(group, schema::kEncoderAttr, schema.encoder);
  write_attribute(group, schema::kEncoderSha256Attr, schema.encoder_sha256);
  write_attribute(group, schema::kPoolingAttr, schema.pooling);
  write_attribute(group, schema::kPreprocessingAttr, schema.preprocessing_json);
  write_attribute(group, schema::kDimAttr, schema.dim);
  write_attribute(group, schema::kLayoutAttr,
                  schema.per_step ? schema::kPerStepLayout : schema::kPooledLayout);
  write_attribute(group, schema::kDtypeAttr, storage_dtype_name(meta_.dtype));

  const ModalityColumns columns = gather_columns(schema, samples);
  write_column(group, schema::kPresentDataset, columns.present);
  write_column(group, schema::kNumStepsDataset, columns.num_steps);
  if (schema.modality == Modality::kText) {
    write_column(group, schema::kTruncatedDataset, columns.truncated);
  }
  if (schema.per_step) {
    write_embedding_rows(group, schema::kValuesDataset, columns.values, schema.dim);
    write_column(group, schema::kOffsetsDataset, columns.offsets);
    if (schema.modality != Modality::kText) {
      write_column(group, schema::kTimestampsDataset, columns.timestamps);
    }
  } else {
    write_pooled_rows(group, schema, samples);
  }
}

void ShardImageBuilder::write_failures(const Group& root,
                                       const std::vector<FailureRecord>& failures) {
  std::vector<int64_t> seqs;
  std::vector<std::string> ids, modalities, categories, messages;
  for (const FailureRecord& failure : failures) {
    seqs.push_back(failure.seq);
    ids.push_back(failure.id);
    modalities.emplace_back(modality_name(failure.modality));
    categories.emplace_back(failure_category_name(failure.category));
    messages.push_back(with_invalid_utf8_replaced(failure.message));
  }
  const Group group = create_group(root, schema::kFailuresGroup);
  write_column(group, schema::kFailureSeqDataset, seqs);
  write_strings(group, schema::kFailureIdDataset, ids);
  write_strings(group, schema::kFailureModalityDataset, modalities);
  write_strings(group, schema::kFailureCategoryDataset, categories);
  write_strings(group, schema::kFailureMessageDataset, messages);
}

// One string dataset per kept column, /columns/<name>, row-aligned with /ids (Note [Kept
// columns] in pipeline/input/manifest.cpp). Names are the config's, stored as UTF-8 link names.
void ShardImageBuilder::write_kept_columns(const Group& root,
                                           const std::vector<ShardSample>& samples) {
  const Group group = create_group(root, schema::kColumnsGroup);
  H5Handle link_properties =
      h5_own(H5Pcreate(H5P_LINK_CREATE), "H5Pcreate(link creation)", target_);
  h5_check(H5Pset_char_encoding(link_properties.get(), H5T_CSET_UTF8), "H5Pset_char_encoding",
           target_);
  std::vector<std::string> values(samples.size());
  for (size_t k = 0; k < meta_.kept_columns.size(); ++k) {
    for (size_t i = 0; i < samples.size(); ++i) values[i] = samples[i].columns[k];
    write_strings(group, meta_.kept_columns[k].c_str(), values, link_properties.get());
  }
}

H5Handle ShardImageBuilder::object_creation_properties(hid_t property_class,
                                                       std::string_view what) {
  H5Handle properties =
      h5_own(H5Pcreate(property_class), fmt::format("H5Pcreate({} creation)", what), target_);
  // Without modification times in object headers, equal contents give byte-identical shards
  // (and equal sha256), so a rerun or a resumed run can be compared with the original.
  h5_check(H5Pset_obj_track_times(properties.get(), false), "H5Pset_obj_track_times", target_);
  return properties;
}

Group ShardImageBuilder::create_group(const Group& parent, std::string_view name) {
  std::string group_path = parent.child(name);
  H5Handle properties = object_creation_properties(H5P_GROUP_CREATE, "group");
  H5Handle group = h5_own(H5Gcreate2(parent.handle.get(), std::string(name).c_str(), H5P_DEFAULT,
                                     properties.get(), H5P_DEFAULT),
                          "H5Gcreate2 " + group_path, target_);
  return {std::move(group), std::move(group_path)};
}

void ShardImageBuilder::write_attribute(const Group& group, const char* name,
                                        std::string_view value) {
  write_attribute(group.handle.get(), group.child(name), name, value);
}

void ShardImageBuilder::write_attribute(hid_t object, const std::string& attribute_path,
                                        const char* name, std::string_view value) {
  const std::string operation = "writing attribute " + attribute_path;
  const std::string text(value);
  const char* pointer = text.c_str();
  H5Handle space = h5_own(H5Screate(H5S_SCALAR), operation, target_);
  H5Handle attribute = h5_own(
      H5Acreate2(object, name, string_type_.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
      operation, target_);
  h5_check(H5Awrite(attribute.get(), string_type_.get(), &pointer), operation, target_);
}

void ShardImageBuilder::write_attribute(const Group& group, const char* name, int64_t value) {
  const std::string operation = "writing attribute " + group.child(name);
  H5Handle space = h5_own(H5Screate(H5S_SCALAR), operation, target_);
  H5Handle attribute = h5_own(
      H5Acreate2(group.handle.get(), name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
      operation, target_);
  h5_check(H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value), operation, target_);
}

void ShardImageBuilder::write_strings(const Group& group, const char* name,
                                      const std::vector<std::string>& values,
                                      hid_t link_properties) {
  std::vector<const char*> pointers;
  pointers.reserve(values.size());
  schema::StringsDigest digest;
  for (const std::string& value : values) {
    pointers.push_back(value.c_str());
    digest.add(value);
  }
  const H5Handle dataset = write_dataset(group, name, {values.size(), 0}, string_type_.get(),
                                         string_type_.get(), pointers.data(), link_properties);
  // Its rows' digest (Note [Digests of string datasets] in shard_schema.hpp).
  write_attribute(dataset.get(), group.child(name) + "@" + schema::kStringsSha256Attr,
                  schema::kStringsSha256Attr, digest.hex());
}

void ShardImageBuilder::write_embedding_rows(const Group& group, const char* name,
                                             const std::vector<float>& values, int64_t dim) {
  const std::array<hsize_t, 2> shape = {values.size() / static_cast<size_t>(dim),
                                        static_cast<hsize_t>(dim)};
  if (meta_.dtype == StorageDtype::kFloat32) {
    write_dataset(group, name, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT, values.data());
    return;
  }
  // Converted here, and written with the file's own type, so HDF5 converts nothing.
  std::vector<uint16_t>& halves = buffers_.halves;  // Note [Buffers kept from shard to shard]
  halves.resize(values.size());
  floats_to_halves(values.data(), halves.data(), values.size());
  write_dataset(group, name, shape, float16_type_.get(), float16_type_.get(), halves.data());
}

void ShardImageBuilder::write_pooled_rows(const Group& group, const ModalitySchema& schema,
                                          const std::vector<ShardSample>& samples) {
  const size_t dim = static_cast<size_t>(schema.dim);
  const std::array<hsize_t, 2> shape = {samples.size(), dim};
  const auto fill = [&](auto* rows, auto convert) {
    for (size_t i = 0; i < samples.size(); ++i) {
      const auto& embedding = samples[i].embeddings[modality_index(schema.modality)];
      if (embedding) convert(embedding->values.data(), rows + i * dim);
    }
  };
  // Note [Buffers kept from shard to shard]: assign() refills them within their capacity.
  if (meta_.dtype == StorageDtype::kFloat32) {
    std::vector<float>& rows = buffers_.floats;
    rows.assign(samples.size() * dim, 0.0f);
    fill(rows.data(), [dim](const float* from, float* to) { std::copy_n(from, dim, to); });
    write_dataset(group, schema::kEmbeddingsDataset, shape, H5T_IEEE_F32LE, H5T_NATIVE_FLOAT,
                  rows.data());
    return;
  }
  std::vector<uint16_t>& rows = buffers_.halves;
  rows.assign(samples.size() * dim, 0);  // 0 is +0.0 in float16 too
  fill(rows.data(), [dim](const float* from, uint16_t* to) { floats_to_halves(from, to, dim); });
  write_dataset(group, schema::kEmbeddingsDataset, shape, float16_type_.get(),
                float16_type_.get(), rows.data());
}

H5Handle ShardImageBuilder::write_dataset(const Group& group, const char* name,
                                          std::array<hsize_t, 2> shape, hid_t file_type,
                                          hid_t memory_type, const void* data,
                                          hid_t link_properties) {
  const std::string operation = "writing dataset " + group.child(name);
  const int rank = shape[1] > 0 ? 2 : 1;
  // Growable rows give every dataset, even one of 0 rows, a valid chunk shape (chunk dimensions
  // must be positive, and may exceed the current size only along an unlimited dimension).
  const std::array<hsize_t, 2> max_shape = {H5S_UNLIMITED, shape[1]};
  const size_t row_bytes = H5Tget_size(file_type) * (rank == 2 ? shape[1] : 1);
  const hsize_t rows_by_bytes = std::max<hsize_t>(1, schema::kMaxChunkBytes / row_bytes);
  const hsize_t chunk_rows = std::clamp<hsize_t>(
      std::min<hsize_t>(static_cast<hsize_t>(meta_.chunk_rows), shape[0]), 1, rows_by_bytes);
  const std::array<hsize_t, 2> chunk = {chunk_rows, shape[1]};

  H5Handle space =
      h5_own(H5Screate_simple(rank, shape.data(), max_shape.data()), operation, target_);
  H5Handle properties = object_creation_properties(H5P_DATASET_CREATE, "dataset");
  h5_check(H5Pset_chunk(properties.get(), rank, chunk.data()), operation, target_);
  // A checksum per chunk, verified by HDF5 on every read: a bit flipped in stored data fails the
  // read instead of giving a wrong vector, which matters where nothing else checks the file (an
  // index rebuilt from the shards; a trainer reading a shard copied elsewhere).
  // (HDF5 filters only fixed-size types: variable-length strings, the ids, kept columns and
  // failure records, live in the global heap, and carry a digest attribute instead: Note
  // [Digests of string datasets].)
  const bool variable_length =
      H5Tget_class(file_type) == H5T_VLEN || H5Tis_variable_str(file_type) > 0;
  if (!variable_length) h5_check(H5Pset_fletcher32(properties.get()), operation, target_);
  H5Handle dataset = h5_own(H5Dcreate2(group.handle.get(), name, file_type, space.get(),
                                       link_properties, properties.get(), H5P_DEFAULT),
                            operation, target_);
  if (shape[0] == 0)
    return dataset;  // nothing to write, and HDF5 rejects the null buffer of an empty vector
  if (!variable_length && h5_check(H5Tequal(file_type, memory_type), operation, target_) > 0) {
    write_chunks(dataset.get(), shape, chunk_rows, row_bytes, data, operation);
    return dataset;
  }
  h5_check(H5Dwrite(dataset.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), operation,
           target_);
  return dataset;
}

// Note [Chunks written whole]
// Through H5Dwrite, HDF5 copies each chunk into a buffer of its own, then the fletcher32 filter
// allocates another for the chunk and its checksum: two fresh buffers of up to a megabyte
// (schema::kMaxChunkBytes) for every chunk of every dataset, each a new mapping (Note [Buffers
// kept from shard to shard]), about 5,700 page faults a shard of 8,192 x 768. Where the stored
// type is the one in memory (no conversion for HDF5 to do), the builder instead copies each
// chunk into one buffer it keeps, appends the checksum the filter would (storage/fletcher32.*,
// HDF5's algorithm, which tests/unit/shard_writer_test.cpp checks against HDF5's own chunks),
// and hands it over with H5Dwrite_chunk as already filtered. Readers see the same dataset:
// same chunks, same filter, every read verified as before. The last chunk is padded with zeros
// to the full chunk, as H5Dwrite stores an edge chunk (the fill value, 0).
void ShardImageBuilder::write_chunks(hid_t dataset, std::array<hsize_t, 2> shape,
                                     hsize_t chunk_rows, size_t row_bytes, const void* data,
                                     const std::string& operation) {
  const size_t chunk_bytes = static_cast<size_t>(chunk_rows) * row_bytes;
  std::vector<unsigned char>& chunk = buffers_.chunk;
  chunk.resize(chunk_bytes + 4);
  const auto* rows = static_cast<const unsigned char*>(data);
  for (hsize_t first = 0; first < shape[0]; first += chunk_rows) {
    const size_t filled = static_cast<size_t>(std::min(chunk_rows, shape[0] - first)) * row_bytes;
    std::memcpy(chunk.data(), rows + static_cast<size_t>(first) * row_bytes, filled);
    std::memset(chunk.data() + filled, 0, chunk_bytes - filled);
    hdf5_fletcher32_append(chunk.data(), chunk_bytes);
    const std::array<hsize_t, 2> offset = {first, 0};
    h5_check(H5Dwrite_chunk(dataset, H5P_DEFAULT, /*filters: all applied*/ 0, offset.data(),
                            chunk.size(), chunk.data()),
             operation, target_);
  }
}

}  // namespace

ShardWriter::ShardWriter(std::filesystem::path output_dir, ShardMeta meta)
    : output_dir_(std::move(output_dir)),
      meta_(std::move(meta)),
      buffers_(std::make_unique<ShardBuildBuffers>()) {
  PC_ASSERT(meta_.chunk_rows > 0, "chunk_rows ", meta_.chunk_rows);
  for (Modality m : kAllModalities) {
    const auto& schema = meta_.modalities[modality_index(m)];
    if (!schema) continue;
    PC_ASSERT(schema->modality == m, "the schema in the ", modality_name(m), " slot is for ",
              modality_name(schema->modality));
    PC_ASSERT(schema->dim > 0, modality_name(m), " dim ", schema->dim);
  }
}

ShardWriter::ShardWriter(ShardWriter&&) noexcept = default;
ShardWriter::~ShardWriter() = default;

int64_t ShardWriter::in_memory_file_reuses() const { return buffers_->file.reuses(); }

CommittedShard ShardWriter::write(const ShardContents& contents) {
  return commit(contents.shard_index, build(contents));
}

std::string ShardWriter::build(const ShardContents& contents) const {
  std::string image;
  build(contents, image);
  return image;
}

void ShardWriter::build(const ShardContents& contents, std::string& image) const {
  // Errors name the shard by its index: its file name comes from its bytes.
  const path target = output_dir_ / fmt::format("shard-{:06d}", contents.shard_index);
  validate_contents(meta_, contents, target);
  const std::lock_guard lock(hdf5_lock());  // Note [One thread in HDF5]
  disable_hdf5_error_printing();
  ShardImageBuilder(meta_, target, *buffers_).build(contents, image);
}

// Note [Hashing while the shard is written]
// Writing the image and hashing it take about as long (tools/bench/shard_bench: about 10 ms each
// for a 12.7 MB shard), and the writing mostly waits for the disk. The image is in memory and does
// not change, so it is hashed on a thread of its own while the temporary file is written and
// synced; the name, which holds the hash (Note [Shard files named by their bytes] in
// shard_file_name.cpp), is needed only for the rename that follows.
CommittedShard ShardWriter::commit(int64_t shard_index, const std::string& image) const {
  CommittedShard committed;
  // A write that throws leaves through the future's destructor, which waits for the hash.
  auto digest = std::async(std::launch::async, [&image] { return sha256_hex(image); });
  const path written = write_named_file_atomically(
      output_dir_, fmt::format("shard-{:06d}.h5", shard_index), image, [&] {
        committed.sha256 = digest.get();
        return shard_file_name(shard_index, committed.sha256);
      });
  committed.file = written.filename().string();
  committed.bytes = image.size();
  return committed;
}

}  // namespace precompute
