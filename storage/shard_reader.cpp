#include "storage/shard_reader.hpp"

#include <hdf5.h>

#include <optional>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/float16.hpp"
#include "storage/h5_handle.hpp"
#include "storage/output_index.hpp"
#include "storage/shard_schema.hpp"

namespace precompute {
namespace {

// "/name": an object at the file's root. (Built by append: GCC 12 warns falsely, -Wrestrict, on
// `"literal" + std::string`.)
std::string root_path(std::string_view name) {
  std::string path = "/";
  path += name;
  return path;
}

namespace schema = shard_schema;
using std::filesystem::path;

std::string child_path(std::string_view parent, std::string_view name) {
  std::string result(parent);
  if (!result.ends_with('/')) result += '/';
  return result + std::string(name);
}

// Frees the strings HDF5 allocated for a variable-length read, however the copy ends.
class VariableLengthStrings {
 public:
  VariableLengthStrings(size_t count, hid_t memory_type, hid_t space)
      : pointers_(count, nullptr), memory_type_(memory_type), space_(space) {}
  ~VariableLengthStrings() { H5Dvlen_reclaim(memory_type_, space_, H5P_DEFAULT, pointers_.data()); }
  VariableLengthStrings(const VariableLengthStrings&) = delete;
  VariableLengthStrings& operator=(const VariableLengthStrings&) = delete;

  char** data() { return pointers_.data(); }
  std::vector<std::string> to_strings() const {
    std::vector<std::string> strings;
    strings.reserve(pointers_.size());
    for (const char* pointer : pointers_) strings.emplace_back(pointer ? pointer : "");
    return strings;
  }

 private:
  std::vector<char*> pointers_;
  hid_t memory_type_;
  hid_t space_;
};

// Reads one shard file; every problem throws StorageError naming the file.
class ShardFileReader {
 public:
  explicit ShardFileReader(const path& file) : file_(file) {}

  ShardFile read();
  std::vector<FailureRecord> failures_only();

 private:
  [[noreturn]] void damaged(const std::string& what) const {
    PC_THROW(StorageError, "shard ", file_, " is damaged: ", what);
  }
  [[noreturn]] void not_a_shard(const std::string& why) const {
    PC_THROW(StorageError, file_, " is not a precompute shard: ", why);
  }

  void open_and_check_format();
  void read_root_attributes(ShardFile& shard);
  ModalitySchema read_modality_schema(Modality modality, StorageDtype dtype);
  void read_modality(const ModalitySchema& schema, StorageDtype dtype,
                     std::vector<ShardSample>& samples);
  std::vector<FailureRecord> read_failures();

  bool link_exists(const std::string& link_path);
  H5Handle open_dataset(const std::string& dataset_path);
  // The dataset's shape, checked to have `rank` dimensions and, when given, `rows` rows.
  std::vector<hsize_t> checked_shape(hid_t dataset, const std::string& dataset_path, int rank,
                                     std::optional<hsize_t> rows);
  H5Handle open_attribute(const std::string& object_path, const char* name);
  std::string read_string_attribute(const std::string& object_path, const char* name);
  int64_t read_int64_attribute(const std::string& object_path, const char* name);
  template <class T>
  std::vector<T> read_column(const std::string& dataset_path, std::optional<hsize_t> rows);
  std::vector<std::string> read_strings(const std::string& dataset_path,
                                        std::optional<hsize_t> rows);
  std::vector<float> read_embedding_rows(const std::string& dataset_path, hsize_t rows, int64_t dim,
                                         StorageDtype dtype);

  const path& file_;
  H5Handle h5_file_;
};

ShardFile ShardFileReader::read() {
  open_and_check_format();
  ShardFile shard;
  read_root_attributes(shard);
  ShardContents& contents = shard.contents;

  const std::vector<std::string> ids = read_strings(root_path(schema::kIdsDataset), {});
  const std::vector<int64_t> seqs =
      read_column<int64_t>(root_path(schema::kSeqDataset), ids.size());
  const int64_t end_seq = contents.first_seq + contents.seq_count;
  contents.samples.resize(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    if (seqs[i] < contents.first_seq || seqs[i] >= end_seq || (i > 0 && seqs[i] <= seqs[i - 1])) {
      damaged(detail::concat("/seq[", i, "] = ", seqs[i], " is not ascending inside [",
                             contents.first_seq, ", ", end_seq, ")"));
    }
    contents.samples[i].seq = seqs[i];
    contents.samples[i].id = ids[i];
  }

  for (Modality m : kAllModalities) {
    if (!link_exists(root_path(modality_name(m)))) continue;
    ModalitySchema modality_schema = read_modality_schema(m, shard.meta.dtype);
    read_modality(modality_schema, shard.meta.dtype, contents.samples);
    shard.meta.modalities[modality_index(m)] = std::move(modality_schema);
  }
  contents.failures = read_failures();
  return shard;
}

std::vector<FailureRecord> ShardFileReader::failures_only() {
  open_and_check_format();
  return read_failures();
}

void ShardFileReader::open_and_check_format() {
  std::error_code error;
  const auto status = std::filesystem::status(file_, error);
  PC_CHECK(status.type() != std::filesystem::file_type::not_found, StorageError,
           "cannot read shard ", file_, ": no such file");
  PC_CHECK(!error, StorageError, "cannot read shard ", file_, ": ", error.message());
  PC_CHECK(status.type() == std::filesystem::file_type::regular, StorageError, "cannot read shard ",
           file_, ": not a regular file");
  if (h5_check(H5Fis_hdf5(file_.c_str()), "H5Fis_hdf5", file_) == 0) {
    not_a_shard("not an HDF5 file");
  }
  h5_file_ = h5_own(H5Fopen(file_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", file_);

  if (h5_check(H5Aexists(h5_file_.get(), schema::kFormatAttr), "H5Aexists", file_) == 0) {
    not_a_shard(detail::concat("it has no '", schema::kFormatAttr, "' attribute"));
  }
  const std::string format = read_string_attribute("/", schema::kFormatAttr);
  if (format != schema::kShardFormat) {
    not_a_shard(detail::concat("its format is '", format, "', not '", schema::kShardFormat, "'"));
  }
  const int64_t version = read_int64_attribute("/", schema::kFormatVersionAttr);
  PC_CHECK(version == schema::kShardFormatVersion, StorageError, "shard ", file_,
           " has format version ", version, "; this precompute reads version ",
           schema::kShardFormatVersion, " only");
}

void ShardFileReader::read_root_attributes(ShardFile& shard) {
  ShardMeta& meta = shard.meta;
  if (h5_check(H5Aexists(h5_file_.get(), schema::kOutputIdAttr), "H5Aexists", file_) > 0) {
    meta.output_id = read_string_attribute("/", schema::kOutputIdAttr);
  }
  meta.tool_version = read_string_attribute("/", schema::kToolVersionAttr);
  meta.config_fingerprint = read_string_attribute("/", schema::kConfigFingerprintAttr);
  meta.config_json = read_string_attribute("/", schema::kConfigAttr);
  meta.kept_columns = kept_columns_of_config(meta.config_json);
  const std::string dtype = read_string_attribute("/", schema::kStorageDtypeAttr);
  const auto parsed_dtype = schema::parse_storage_dtype(dtype);
  if (!parsed_dtype) damaged(detail::concat("unknown storage_dtype '", dtype, "'"));
  meta.dtype = *parsed_dtype;

  ShardContents& contents = shard.contents;
  contents.shard_index = read_int64_attribute("/", schema::kShardIndexAttr);
  contents.first_seq = read_int64_attribute("/", schema::kFirstSeqAttr);
  contents.seq_count = read_int64_attribute("/", schema::kSeqCountAttr);
  if (h5_check(H5Aexists(h5_file_.get(), schema::kInputSha256Attr), "H5Aexists", file_) > 0) {
    contents.input_sha256 = read_string_attribute("/", schema::kInputSha256Attr);
  }
  if (contents.shard_index < 0 || contents.first_seq < 0 || contents.seq_count < 0) {
    damaged("negative shard_index, first_seq or seq_count");
  }
}

ModalitySchema ShardFileReader::read_modality_schema(Modality modality, StorageDtype dtype) {
  const std::string group = root_path(modality_name(modality));
  ModalitySchema result;
  result.modality = modality;
  result.encoder = read_string_attribute(group, schema::kEncoderAttr);
  result.encoder_sha256 = read_string_attribute(group, schema::kEncoderSha256Attr);
  result.pooling = read_string_attribute(group, schema::kPoolingAttr);
  result.preprocessing_json = read_string_attribute(group, schema::kPreprocessingAttr);
  result.dim = read_int64_attribute(group, schema::kDimAttr);
  if (result.dim <= 0) damaged(detail::concat(group, " has dim ", result.dim));

  const std::string layout = read_string_attribute(group, schema::kLayoutAttr);
  if (layout != schema::kPooledLayout && layout != schema::kPerStepLayout) {
    damaged(detail::concat(group, " has unknown layout '", layout, "'"));
  }
  result.per_step = layout == schema::kPerStepLayout;

  const std::string group_dtype = read_string_attribute(group, schema::kDtypeAttr);
  if (group_dtype != storage_dtype_name(dtype)) {
    damaged(detail::concat(group, " has dtype '", group_dtype,
                           "' but the shard's storage_dtype is '", storage_dtype_name(dtype), "'"));
  }
  return result;
}

void ShardFileReader::read_modality(const ModalitySchema& modality_schema, StorageDtype dtype,
                                    std::vector<ShardSample>& samples) {
  const Modality m = modality_schema.modality;
  const std::string group = root_path(modality_name(m));
  const hsize_t n = samples.size();
  const size_t dim = static_cast<size_t>(modality_schema.dim);
  const bool is_text = m == Modality::kText;

  const auto present = read_column<uint8_t>(child_path(group, schema::kPresentDataset), n);
  const auto num_steps = read_column<int32_t>(child_path(group, schema::kNumStepsDataset), n);
  std::vector<uint8_t> truncated;
  if (is_text) truncated = read_column<uint8_t>(child_path(group, schema::kTruncatedDataset), n);

  std::vector<float> values;
  std::vector<int64_t> offsets;
  std::vector<double> timestamps;
  if (modality_schema.per_step) {
    const std::string offsets_path = child_path(group, schema::kOffsetsDataset);
    offsets = read_column<int64_t>(offsets_path, n + 1);
    if (offsets[0] != 0) damaged(detail::concat(offsets_path, "[0] is ", offsets[0], ", not 0"));
    for (size_t i = 0; i < n; ++i) {
      // A present sample has at least one row, an absent one none.
      const int64_t rows = offsets[i + 1] - offsets[i];
      if (rows < 0 || (rows > 0) != (present[i] != 0)) {
        damaged(detail::concat(offsets_path, " does not match ", group, "/present at row ", i));
      }
    }
    const auto total_rows = static_cast<hsize_t>(offsets.back());
    values = read_embedding_rows(child_path(group, schema::kValuesDataset), total_rows,
                                 modality_schema.dim, dtype);
    if (!is_text) {
      timestamps = read_column<double>(child_path(group, schema::kTimestampsDataset), total_rows);
    }
  } else {
    values = read_embedding_rows(child_path(group, schema::kEmbeddingsDataset), n,
                                 modality_schema.dim, dtype);
  }

  for (size_t i = 0; i < n; ++i) {
    if (!present[i]) continue;
    const size_t first_row = modality_schema.per_step ? static_cast<size_t>(offsets[i]) : i;
    const size_t end_row = modality_schema.per_step ? static_cast<size_t>(offsets[i + 1]) : i + 1;
    SampleEmbedding embedding;
    embedding.seq = samples[i].seq;
    embedding.rows = static_cast<int64_t>(end_row - first_row);
    embedding.dim = modality_schema.dim;
    embedding.values.assign(values.begin() + static_cast<std::ptrdiff_t>(first_row * dim),
                            values.begin() + static_cast<std::ptrdiff_t>(end_row * dim));
    if (!timestamps.empty()) {
      embedding.timestamps.assign(timestamps.begin() + static_cast<std::ptrdiff_t>(first_row),
                                  timestamps.begin() + static_cast<std::ptrdiff_t>(end_row));
    }
    embedding.steps = num_steps[i];
    embedding.truncated = is_text && truncated[i] != 0;
    samples[i].embeddings[modality_index(m)] = std::move(embedding);
  }
}

std::vector<FailureRecord> ShardFileReader::read_failures() {
  const std::string group = root_path(schema::kFailuresGroup);
  const auto seqs = read_column<int64_t>(child_path(group, schema::kFailureSeqDataset), {});
  const hsize_t count = seqs.size();
  const auto ids = read_strings(child_path(group, schema::kFailureIdDataset), count);
  const auto modalities = read_strings(child_path(group, schema::kFailureModalityDataset), count);
  const auto categories = read_strings(child_path(group, schema::kFailureCategoryDataset), count);
  const auto messages = read_strings(child_path(group, schema::kFailureMessageDataset), count);

  std::vector<FailureRecord> failures(count);
  for (size_t i = 0; i < count; ++i) {
    const auto modality = parse_modality(modalities[i]);
    if (!modality)
      damaged(detail::concat("failure ", i, " has unknown modality '", modalities[i], "'"));
    const auto category = parse_failure_category(categories[i]);
    if (!category)
      damaged(detail::concat("failure ", i, " has unknown category '", categories[i], "'"));
    failures[i] = {seqs[i], ids[i], *modality, *category, messages[i]};
  }
  return failures;
}

bool ShardFileReader::link_exists(const std::string& link_path) {
  return h5_check(H5Lexists(h5_file_.get(), link_path.c_str(), H5P_DEFAULT),
                  "H5Lexists " + link_path, file_) > 0;
}

H5Handle ShardFileReader::open_dataset(const std::string& dataset_path) {
  // H5Lexists fails, rather than saying no, when a group on the way is missing: check each step.
  for (size_t slash = dataset_path.find('/', 1); slash != std::string::npos;
       slash = dataset_path.find('/', slash + 1)) {
    if (!link_exists(dataset_path.substr(0, slash))) {
      damaged(detail::concat("group ", dataset_path.substr(0, slash), " is missing"));
    }
  }
  if (!link_exists(dataset_path)) damaged(detail::concat("dataset ", dataset_path, " is missing"));
  return h5_own(H5Dopen2(h5_file_.get(), dataset_path.c_str(), H5P_DEFAULT),
                "H5Dopen2 " + dataset_path, file_);
}

std::vector<hsize_t> ShardFileReader::checked_shape(hid_t dataset, const std::string& dataset_path,
                                                    int rank, std::optional<hsize_t> rows) {
  H5Handle space = h5_own(H5Dget_space(dataset), "H5Dget_space " + dataset_path, file_);
  const int actual_rank =
      h5_check(H5Sget_simple_extent_ndims(space.get()), "H5Sget_simple_extent_ndims", file_);
  if (actual_rank != rank) {
    damaged(detail::concat(dataset_path, " has ", actual_rank, " dimensions, expected ", rank));
  }
  std::vector<hsize_t> shape(static_cast<size_t>(rank));
  h5_check(H5Sget_simple_extent_dims(space.get(), shape.data(), nullptr),
           "H5Sget_simple_extent_dims " + dataset_path, file_);
  if (rows && shape[0] != *rows) {
    damaged(detail::concat(dataset_path, " has ", shape[0], " rows, expected ", *rows));
  }
  return shape;
}

H5Handle ShardFileReader::open_attribute(const std::string& object_path, const char* name) {
  const std::string attribute_path = child_path(object_path, name);
  const htri_t exists =
      h5_check(H5Aexists_by_name(h5_file_.get(), object_path.c_str(), name, H5P_DEFAULT),
               "H5Aexists_by_name " + attribute_path, file_);
  if (exists == 0) damaged(detail::concat("attribute ", attribute_path, " is missing"));
  return h5_own(
      H5Aopen_by_name(h5_file_.get(), object_path.c_str(), name, H5P_DEFAULT, H5P_DEFAULT),
      "H5Aopen_by_name " + attribute_path, file_);
}

std::string ShardFileReader::read_string_attribute(const std::string& object_path,
                                                   const char* name) {
  const std::string attribute_path = child_path(object_path, name);
  H5Handle attribute = open_attribute(object_path, name);
  H5Handle type = h5_own(H5Aget_type(attribute.get()), "H5Aget_type " + attribute_path, file_);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) <= 0) {
    damaged(detail::concat("attribute ", attribute_path, " is not a variable-length string"));
  }
  H5Handle space = h5_own(H5Aget_space(attribute.get()), "H5Aget_space " + attribute_path, file_);
  if (H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) {
    damaged(detail::concat("attribute ", attribute_path, " is not a single string"));
  }
  H5Handle memory_type = make_utf8_string_type(file_);
  VariableLengthStrings text(1, memory_type.get(), space.get());
  h5_check(H5Aread(attribute.get(), memory_type.get(), text.data()), "H5Aread " + attribute_path,
           file_);
  return text.to_strings().front();
}

int64_t ShardFileReader::read_int64_attribute(const std::string& object_path, const char* name) {
  const std::string attribute_path = child_path(object_path, name);
  H5Handle attribute = open_attribute(object_path, name);
  H5Handle type = h5_own(H5Aget_type(attribute.get()), "H5Aget_type " + attribute_path, file_);
  H5Handle space = h5_own(H5Aget_space(attribute.get()), "H5Aget_space " + attribute_path, file_);
  if (H5Tget_class(type.get()) != H5T_INTEGER ||
      H5Sget_simple_extent_type(space.get()) != H5S_SCALAR) {
    damaged(detail::concat("attribute ", attribute_path, " is not a single integer"));
  }
  int64_t value = 0;
  h5_check(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), "H5Aread " + attribute_path, file_);
  return value;
}

template <class T>
std::vector<T> ShardFileReader::read_column(const std::string& dataset_path,
                                            std::optional<hsize_t> rows) {
  H5Handle dataset = open_dataset(dataset_path);
  const std::vector<hsize_t> shape = checked_shape(dataset.get(), dataset_path, 1, rows);
  std::vector<T> values(shape[0]);
  // Nothing to read for 0 rows, and HDF5 rejects the null buffer of an empty vector.
  if (values.empty()) return values;
  h5_check(
      H5Dread(dataset.get(), H5Type<T>::memory(), H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
      "H5Dread " + dataset_path, file_);
  return values;
}

std::vector<std::string> ShardFileReader::read_strings(const std::string& dataset_path,
                                                       std::optional<hsize_t> rows) {
  H5Handle dataset = open_dataset(dataset_path);
  const std::vector<hsize_t> shape = checked_shape(dataset.get(), dataset_path, 1, rows);
  H5Handle type = h5_own(H5Dget_type(dataset.get()), "H5Dget_type " + dataset_path, file_);
  if (H5Tget_class(type.get()) != H5T_STRING || H5Tis_variable_str(type.get()) <= 0) {
    damaged(detail::concat(dataset_path, " is not a variable-length string dataset"));
  }
  if (shape[0] == 0) return {};
  H5Handle space = h5_own(H5Dget_space(dataset.get()), "H5Dget_space " + dataset_path, file_);
  H5Handle memory_type = make_utf8_string_type(file_);
  VariableLengthStrings strings(shape[0], memory_type.get(), space.get());
  h5_check(H5Dread(dataset.get(), memory_type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, strings.data()),
           "H5Dread " + dataset_path, file_);
  return strings.to_strings();
}

std::vector<float> ShardFileReader::read_embedding_rows(const std::string& dataset_path,
                                                        hsize_t rows, int64_t dim,
                                                        StorageDtype dtype) {
  H5Handle dataset = open_dataset(dataset_path);
  const std::vector<hsize_t> shape = checked_shape(dataset.get(), dataset_path, 2, rows);
  if (shape[1] != static_cast<hsize_t>(dim)) {
    damaged(detail::concat(dataset_path, " has ", shape[1], " columns, but dim is ", dim));
  }
  H5Handle type = h5_own(H5Dget_type(dataset.get()), "H5Dget_type " + dataset_path, file_);
  const size_t element_size = dtype == StorageDtype::kFloat16 ? 2 : 4;
  if (H5Tget_class(type.get()) != H5T_FLOAT || H5Tget_size(type.get()) != element_size) {
    damaged(detail::concat(dataset_path, " is not stored as ", storage_dtype_name(dtype),
                           ", the shard's storage_dtype"));
  }
  const size_t count = static_cast<size_t>(shape[0] * shape[1]);
  std::vector<float> values(count);
  if (count == 0) return values;
  if (dtype == StorageDtype::kFloat32) {
    h5_check(H5Dread(dataset.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
             "H5Dread " + dataset_path, file_);
    return values;
  }
  // Read the halves as they are and widen them here (float16.hpp), as the writer narrowed them.
  H5Handle float16 = make_float16_type(file_);
  std::vector<uint16_t> halves(count);
  h5_check(H5Dread(dataset.get(), float16.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, halves.data()),
           "H5Dread " + dataset_path, file_);
  for (size_t i = 0; i < count; ++i) values[i] = half_to_float(halves[i]);
  return values;
}

}  // namespace

ShardFile read_shard(const std::filesystem::path& file) {
  disable_hdf5_error_printing();
  return ShardFileReader(file).read();
}

std::vector<FailureRecord> read_shard_failures(const std::filesystem::path& file) {
  disable_hdf5_error_printing();
  return ShardFileReader(file).failures_only();
}

}  // namespace precompute
