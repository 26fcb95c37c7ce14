#include "storage/shard_scan.hpp"

#include <hdf5.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/modality.hpp"
#include "storage/h5_handle.hpp"
#include "storage/shard_schema.hpp"

namespace precompute {
namespace {

namespace schema = shard_schema;
using std::filesystem::path;

// What a dataset's rows are kept as, beyond being read.
enum class Keep { kNothing, kIds, kSeqs, kFailureIds, kFailureSeqs, kPresent, kColumn };

// The names of the objects below a group (H5Lvisit's callback cannot throw: names are collected
// first and opened afterwards).
herr_t collect_link(hid_t /*group*/, const char* name, const H5L_info_t* /*info*/, void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

herr_t collect_attribute(hid_t /*object*/, const char* name, const H5A_info_t* /*info*/,
                         void* data) {
  static_cast<std::vector<std::string>*>(data)->emplace_back(name);
  return 0;
}

// Frees what a read of variable-length data allocated, however the block ends.
class VariableLengthBuffer {
 public:
  VariableLengthBuffer(hid_t memory_type, hid_t space, void* data)
      : memory_type_(memory_type), space_(space), data_(data) {}
  ~VariableLengthBuffer() {
    if (data_ != nullptr) H5Dvlen_reclaim(memory_type_, space_, H5P_DEFAULT, data_);
  }
  VariableLengthBuffer(const VariableLengthBuffer&) = delete;
  VariableLengthBuffer& operator=(const VariableLengthBuffer&) = delete;

 private:
  hid_t memory_type_;
  hid_t space_;
  void* data_;
};

class ShardScanner {
 public:
  explicit ShardScanner(const path& file) : file_(file) {}

  ShardScan scan() {
    disable_hdf5_error_printing();
    PC_CHECK(h5_check(H5Fis_hdf5(file_.c_str()), "H5Fis_hdf5", file_) > 0, StorageError, file_,
             " is not an HDF5 file");
    h5_file_ = h5_own(H5Fopen(file_.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", file_);
    read_root_attributes();

    std::vector<std::string> names;
    h5_check(H5Lvisit(h5_file_.get(), H5_INDEX_NAME, H5_ITER_INC, collect_link, &names),
             "H5Lvisit /", file_);
    read_attributes("/");
    for (const auto& name : names) {
      const std::string object_path = "/" + name;
      H5Handle object = h5_own(H5Oopen(h5_file_.get(), object_path.c_str(), H5P_DEFAULT),
                               "H5Oopen " + object_path, file_);
      read_attributes(object_path);
      if (H5Iget_type(object.get()) == H5I_DATASET) read_dataset(object.get(), object_path);
      if (const auto m = parse_modality(name); m && H5Iget_type(object.get()) == H5I_GROUP) {
        read_modality_attributes(*m, object_path);
      }
    }
    return std::move(scan_);
  }

 private:
  void read_root_attributes() {
    const hid_t root = h5_file_.get();
    PC_CHECK(h5_check(H5Aexists(root, schema::kFormatAttr), "H5Aexists", file_) > 0, StorageError,
             file_, " is not a precompute shard: it has no '", schema::kFormatAttr, "' attribute");
    scan_.output_id = read_text_attribute("/", schema::kOutputIdAttr);
    scan_.config_fingerprint = read_text_attribute("/", schema::kConfigFingerprintAttr);
    scan_.storage_dtype = read_text_attribute("/", schema::kStorageDtypeAttr);
    scan_.shard_index = read_int64_attribute("/", schema::kShardIndexAttr);
    scan_.first_seq = read_int64_attribute("/", schema::kFirstSeqAttr);
    scan_.seq_count = read_int64_attribute("/", schema::kSeqCountAttr);
    scan_.input_sha256 = read_text_attribute("/", schema::kInputSha256Attr);
  }

  void read_modality_attributes(Modality m, const std::string& group) {
    ScannedModality& out = scan_.modalities[modality_index(m)].emplace();
    out.dim = read_int64_attribute(group, schema::kDimAttr);
    out.layout = read_text_attribute(group, schema::kLayoutAttr);
    out.dtype = read_text_attribute(group, schema::kDtypeAttr);
    out.encoder = read_text_attribute(group, schema::kEncoderAttr);
    out.encoder_sha256 = read_text_attribute(group, schema::kEncoderSha256Attr);
    out.pooling = read_text_attribute(group, schema::kPoolingAttr);
    out.preprocessing = read_text_attribute(group, schema::kPreprocessingAttr);
  }

  bool has_attribute(const std::string& object_path, const char* name) {
    return h5_check(H5Aexists_by_name(h5_file_.get(), object_path.c_str(), name, H5P_DEFAULT),
                    detail::concat("H5Aexists ", object_path, "@", name), file_) > 0;
  }

  int64_t read_int64_attribute(const std::string& object_path, const char* name) {
    const std::string what = detail::concat(object_path, "@", name);
    H5Handle attribute =
        h5_own(H5Aopen_by_name(h5_file_.get(), object_path.c_str(), name, H5P_DEFAULT, H5P_DEFAULT),
               "H5Aopen " + what, file_);
    int64_t value = 0;
    h5_check(H5Aread(attribute.get(), H5T_NATIVE_INT64, &value), "H5Aread " + what, file_);
    return value;
  }

  // A variable-length string attribute's text; "" when the object has no such attribute.
  std::string read_text_attribute(const std::string& object_path, const char* name) {
    if (!has_attribute(object_path, name)) return {};
    const std::string what = detail::concat(object_path, "@", name);
    H5Handle attribute =
        h5_own(H5Aopen_by_name(h5_file_.get(), object_path.c_str(), name, H5P_DEFAULT, H5P_DEFAULT),
               "H5Aopen " + what, file_);
    H5Handle stored = h5_own(H5Aget_type(attribute.get()), "H5Aget_type " + what, file_);
    PC_CHECK(H5Tget_class(stored.get()) == H5T_STRING &&
                 h5_check(H5Tis_variable_str(stored.get()), "H5Tis_variable_str", file_) > 0,
             StorageError, "shard ", file_, " is damaged: attribute ", what,
             " is not a variable-length string");
    H5Handle type = make_utf8_string_type(file_);
    char* value = nullptr;
    h5_check(H5Aread(attribute.get(), type.get(), &value), "H5Aread " + what, file_);
    std::string text = value ? value : "";
    H5free_memory(value);
    return text;
  }

  // Reads every attribute of the object at `object_path` in full.
  void read_attributes(const std::string& object_path) {
    std::vector<std::string> names;
    h5_check(H5Aiterate_by_name(h5_file_.get(), object_path.c_str(), H5_INDEX_NAME, H5_ITER_INC,
                                nullptr, collect_attribute, &names, H5P_DEFAULT),
             "H5Aiterate " + object_path, file_);
    for (const auto& name : names) {
      const std::string what = detail::concat("attribute '", name, "' of ", object_path);
      H5Handle attribute = h5_own(H5Aopen_by_name(h5_file_.get(), object_path.c_str(), name.c_str(),
                                                  H5P_DEFAULT, H5P_DEFAULT),
                                  "H5Aopen " + what, file_);
      H5Handle type = h5_own(H5Aget_type(attribute.get()), "H5Aget_type " + what, file_);
      H5Handle space = h5_own(H5Aget_space(attribute.get()), "H5Aget_space " + what, file_);
      const hssize_t points = h5_check(H5Sget_simple_extent_npoints(space.get()),
                                       "H5Sget_simple_extent_npoints", file_);
      const size_t size = h5_check(H5Tget_size(type.get()), "H5Tget_size " + what, file_);
      std::vector<unsigned char> buffer(static_cast<size_t>(points) * size);
      const bool variable = type_is_variable(type.get(), what);
      h5_check(H5Aread(attribute.get(), type.get(), buffer.data()), "H5Aread " + what, file_);
      if (variable) H5Dvlen_reclaim(type.get(), space.get(), H5P_DEFAULT, buffer.data());
      ++scan_.attributes_read;
    }
  }

  bool type_is_variable(hid_t type, const std::string& what) {
    const H5T_class_t type_class = H5Tget_class(type);
    if (type_class == H5T_VLEN) return true;
    if (type_class == H5T_STRING) {
      return h5_check(H5Tis_variable_str(type), "H5Tis_variable_str " + what, file_) > 0;
    }
    return h5_check(H5Tdetect_class(type, H5T_VLEN), "H5Tdetect_class " + what, file_) > 0;
  }

  Keep keep_for(std::string_view object_path) {
    if (object_path == detail::concat("/", schema::kIdsDataset)) return Keep::kIds;
    if (object_path == detail::concat("/", schema::kSeqDataset)) return Keep::kSeqs;
    const std::string failures = detail::concat("/", schema::kFailuresGroup, "/");
    if (object_path == failures + schema::kFailureIdDataset) return Keep::kFailureIds;
    if (object_path == failures + schema::kFailureSeqDataset) return Keep::kFailureSeqs;
    const std::string columns = detail::concat("/", schema::kColumnsGroup, "/");
    if (object_path.starts_with(columns) && object_path.size() > columns.size()) {
      return Keep::kColumn;
    }
    for (Modality m : kAllModalities) {
      if (object_path == detail::concat("/", modality_name(m), "/", schema::kPresentDataset)) {
        present_modality_ = m;
        return Keep::kPresent;
      }
    }
    return Keep::kNothing;
  }

  // Reads the dataset end to end in blocks of whole chunks, so that every chunk passes through
  // its filters (Fletcher-32 among them) once, with at most one block in memory.
  void read_dataset(hid_t dataset, const std::string& object_path) {
    const std::string what = "dataset " + object_path;
    H5Handle file_type = h5_own(H5Dget_type(dataset), "H5Dget_type " + what, file_);
    H5Handle file_space = h5_own(H5Dget_space(dataset), "H5Dget_space " + what, file_);
    const int rank = h5_check(H5Sget_simple_extent_ndims(file_space.get()),
                              "H5Sget_simple_extent_ndims " + what, file_);
    std::vector<hsize_t> dims(static_cast<size_t>(std::max(rank, 1)), 1);
    if (rank > 0) {
      h5_check(H5Sget_simple_extent_dims(file_space.get(), dims.data(), nullptr),
               "H5Sget_simple_extent_dims " + what, file_);
    }
    const Keep keep = keep_for(object_path);
    hid_t memory_type = file_type.get();  // no conversion: the bytes as stored
    if (keep == Keep::kSeqs || keep == Keep::kFailureSeqs) memory_type = H5T_NATIVE_INT64;
    if (keep == Keep::kPresent) memory_type = H5T_NATIVE_UINT8;
    const bool variable = type_is_variable(file_type.get(), what);
    PC_CHECK(!((keep == Keep::kIds || keep == Keep::kFailureIds || keep == Keep::kColumn) &&
               !variable),
             StorageError, "shard ", file_, " is damaged: ", what,
             " is not of variable-length strings");
    if (keep == Keep::kColumn) {
      PC_CHECK(rank == 1, StorageError, "shard ", file_, " is damaged: ", what, " has ", rank,
               " dimensions, not 1");
      scan_.column_rows[object_path.substr(std::string_view("/columns/").size())] =
          static_cast<int64_t>(dims[0]);
    }
    const size_t element_size = h5_check(H5Tget_size(memory_type), "H5Tget_size " + what, file_);

    size_t row_elements = 1;
    for (size_t d = 1; d < dims.size(); ++d) row_elements *= static_cast<size_t>(dims[d]);
    const size_t row_bytes = std::max<size_t>(1, row_elements * element_size);
    hsize_t chunk_rows = 1;
    H5Handle create_plist =
        h5_own(H5Dget_create_plist(dataset), "H5Dget_create_plist " + what, file_);
    if (rank > 0 && H5Pget_layout(create_plist.get()) == H5D_CHUNKED) {
      std::vector<hsize_t> chunk(static_cast<size_t>(rank), 1);
      h5_check(H5Pget_chunk(create_plist.get(), rank, chunk.data()), "H5Pget_chunk " + what, file_);
      chunk_rows = std::max<hsize_t>(1, chunk[0]);
    }
    const hsize_t rows = rank > 0 ? dims[0] : 1;
    const hsize_t chunks_per_block =
        std::max<hsize_t>(1, kScanBlockBytes / (row_bytes * static_cast<size_t>(chunk_rows)));
    const hsize_t block_rows = chunk_rows * chunks_per_block;

    // Note [Digests of string datasets] in shard_schema.hpp.
    const bool strings = variable && H5Tget_class(file_type.get()) == H5T_STRING;
    schema::StringsDigest digest;
    std::vector<unsigned char> buffer;
    for (hsize_t start = 0; start < rows; start += block_rows) {
      const hsize_t count = std::min(block_rows, rows - start);
      std::vector<hsize_t> offset(dims.size(), 0), extent = dims;
      offset[0] = start;
      extent[0] = count;
      H5Handle memory_space;
      if (rank > 0) {
        h5_check(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, offset.data(), nullptr,
                                     extent.data(), nullptr),
                 "H5Sselect_hyperslab " + what, file_);
        memory_space = h5_own(H5Screate_simple(rank, extent.data(), nullptr),
                              "H5Screate_simple " + what, file_);
      } else {
        memory_space = h5_own(H5Screate(H5S_SCALAR), "H5Screate " + what, file_);
      }
      const size_t elements = static_cast<size_t>(count) * row_elements;
      buffer.assign(elements * element_size, 0);
      // Frees variable-length data at the end of this block, after its strings are kept (the
      // buffer starts zeroed, so a read that fails half-way frees what it allocated).
      VariableLengthBuffer reclaim(memory_type, memory_space.get(),
                                   variable ? buffer.data() : nullptr);
      h5_check(H5Dread(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT,
                       buffer.data()),
               detail::concat("reading rows ", start, "-", start + count - 1, " of ", what), file_);
      keep_block(keep, buffer, elements);
      if (strings) {
        for (size_t i = 0; i < elements; ++i) {
          const char* value = nullptr;
          std::memcpy(&value, buffer.data() + i * sizeof(char*), sizeof(char*));
          digest.add(value ? std::string_view(value) : std::string_view());
        }
      }
      scan_.bytes_read += buffer.size();
    }
    ++scan_.datasets_read;
    if (strings) {
      const std::string recorded = read_text_attribute(object_path, schema::kStringsSha256Attr);
      if (recorded.empty()) {
        scan_.digest_problems.push_back(
            detail::concat(object_path, " carries no ", schema::kStringsSha256Attr,
                           " attribute (a shard of an older precompute, or not one of ours)"));
      } else if (recorded != digest.hex()) {
        scan_.digest_problems.push_back(detail::concat(
            object_path, " does not match its ", schema::kStringsSha256Attr,
            " attribute: a stored string changed since it was written"));
      }
    }
  }

  void keep_block(Keep keep, const std::vector<unsigned char>& buffer, size_t elements) {
    switch (keep) {
      case Keep::kNothing:
      case Keep::kColumn:
        return;
      case Keep::kIds:
      case Keep::kFailureIds: {
        auto& out = keep == Keep::kIds ? scan_.ids : scan_.failure_ids;
        for (size_t i = 0; i < elements; ++i) {
          const char* value = nullptr;
          std::memcpy(&value, buffer.data() + i * sizeof(char*), sizeof(char*));
          out.emplace_back(value ? value : "");
        }
        return;
      }
      case Keep::kSeqs:
      case Keep::kFailureSeqs: {
        auto& out = keep == Keep::kSeqs ? scan_.seqs : scan_.failure_seqs;
        const size_t first = out.size();
        out.resize(first + elements);
        std::memcpy(out.data() + first, buffer.data(), elements * sizeof(int64_t));
        return;
      }
      case Keep::kPresent:
        for (size_t i = 0; i < elements; ++i) {
          scan_.present[modality_index(present_modality_)] += buffer[i] != 0 ? 1 : 0;
        }
        return;
    }
  }

  const path& file_;
  H5Handle h5_file_;
  ShardScan scan_;
  Modality present_modality_ = Modality::kVideo;  // of the /<modality>/present being read
};

}  // namespace

ShardScan scan_shard(const std::filesystem::path& file) { return ShardScanner(file).scan(); }

}  // namespace precompute
