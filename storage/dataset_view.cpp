#include "storage/dataset_view.hpp"

#include <hdf5.h>
#include <spdlog/spdlog.h>

#include <array>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "storage/atomic_file.hpp"
#include "storage/h5_handle.hpp"
#include "storage/hdf5_lock.hpp"
#include "storage/shard_schema.hpp"

namespace precompute {

// Note [The one-file view]
// dataset.h5 holds HDF5 virtual datasets (VDS, H5Pset_virtual): each maps the rows of the same
// dataset in every committed shard, in the index's order (ascending first_seq), one after the
// other. Source files are named relative ("shard-000012.h5"), and HDF5 looks for a relative
// source next to the view file before anywhere else, so the folder can be moved or copied
// whole. The view is built in memory (core driver, as shards are) and replaces the old one
// atomically, so a reader never sees a half-written view; it only names files the index lists
// at that moment, and it is rebuilt at the start of a run, where a resume may have dropped
// damaged shards, and during and at the end of a run (Note [When the view is rewritten] in
// pipeline/stages/shard_committer.cpp).
//
// CSR offsets cannot be a virtual dataset: a shard's offsets start at 0, and the one-array
// offsets need each shard's shifted by the steps of all shards before it, which a VDS (a pure
// mapping of stored elements) cannot add. So /<modality>/offsets is an ordinary dataset of the
// view, computed from the shards' offsets (8 bytes per sample), while values and timestamps are
// mapped. (num_steps counts encoder input steps, which need not equal the stored rows, so the
// offsets cannot be derived from it.)

namespace {

namespace fs = std::filesystem;
namespace schema = shard_schema;

constexpr std::string_view kViewFormat = "precompute-view";
constexpr int64_t kViewFormatVersion = 1;

// Note [A view names the index it shows]
// dataset.h5 is derived from index.json and must show exactly its shards: a view left from
// another index (a merge killed between the two writes, a view copied from elsewhere) serves
// rows that are missing or twice. So it records the SHA-256 of the index.json it was built from
// (index_sha256()); a resumed run and `precompute merge` rebuild a view that names another, and
// `precompute verify` fails on it. A run rewrites the view less often than the index (Note
// [When the view is rewritten]), so while it runs the two may differ; once it ends they agree.

// Note [Fill values of the view]
// HDF5 reads the rows of a mapped file that is missing as the dataset's fill value, without an
// error. A reader that keeps a view open while a rewrite deletes shards (docs/format.md,
// "One-file view") would read zeros as if they were embeddings of absent samples. So the view's
// fill values are values no shard holds: -1 for seq and num_steps, 255 for the 0/1 flags, NaN
// for vectors and timestamps; such a row says "reopen the view", never a wrong vector.

// The CSR offsets ([N + 1], from 0) of each per-step modality of a shard; empty elsewhere.
using ShardOffsets = std::array<std::vector<int64_t>, kNumModalities>;

// Shards' offsets by their sha256, so a shard is read once per process, not once per commit
// (8 bytes per sample and per-step modality). Guarded by its mutex.
std::mutex offsets_cache_mutex;
std::map<std::string, std::shared_ptr<const ShardOffsets>> offsets_cache;

std::shared_ptr<const ShardOffsets> read_offsets(const fs::path& dir, const IndexEntry& entry,
                                                 const ShardMeta& meta) {
  bool any = false;
  for (const auto& m : meta.modalities) any = any || (m && m->per_step);
  if (!any) return std::make_shared<const ShardOffsets>();
  {
    std::lock_guard lock(offsets_cache_mutex);
    if (const auto it = offsets_cache.find(entry.sha256); it != offsets_cache.end()) {
      return it->second;
    }
  }
  const fs::path file = dir / entry.file;
  auto offsets = std::make_shared<ShardOffsets>();
  H5Handle h5 =
      h5_own(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen (for the view)", file);
  for (const auto& m : meta.modalities) {
    if (!m || !m->per_step) continue;
    const std::string name =
        std::string(modality_name(m->modality)) + "/" + schema::kOffsetsDataset;
    H5Handle dataset =
        h5_own(H5Dopen2(h5.get(), name.c_str(), H5P_DEFAULT), "H5Dopen2 " + name, file);
    H5Handle space = h5_own(H5Dget_space(dataset.get()), "H5Dget_space " + name, file);
    hsize_t rows = 0;
    h5_check(H5Sget_simple_extent_dims(space.get(), &rows, nullptr), "extent of " + name, file);
    PC_CHECK(rows == static_cast<hsize_t>(entry.num_samples) + 1, StorageError, file, " has ", rows,
             " rows in ", name, " for ", entry.num_samples, " samples");
    auto& column = (*offsets)[modality_index(m->modality)];
    column.resize(rows);
    h5_check(H5Dread(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, column.data()),
             "reading " + name, file);
  }
  std::lock_guard lock(offsets_cache_mutex);
  return offsets_cache.emplace(entry.sha256, std::move(offsets)).first->second;
}

// One shard's part of a virtual dataset: its file and how many rows it holds there.
struct SourcePart {
  std::string file;
  int64_t rows = 0;
};

class ViewBuilder {
 public:
  explicit ViewBuilder(fs::path target)
      : target_(std::move(target)),
        string_type_(make_utf8_string_type(target_)),
        float16_type_(make_float16_type(target_)) {}

  std::string build(const OutputIndex& index,
                    const std::vector<std::shared_ptr<const ShardOffsets>>& offsets) {
    H5Handle access = h5_own(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate(file access)", target_);
    h5_check(H5Pset_fapl_core(access.get(), size_t{1} << 20, /*backing_store=*/0),
             "H5Pset_fapl_core", target_);
    H5Handle creation = creation_properties(H5P_FILE_CREATE);
    // As in ShardImageBuilder::build: a name below /dev/null is never found on disk.
    const std::string memory_name = "/dev/null/precompute-in-memory/" + target_.filename().string();
    H5Handle file =
        h5_own(H5Fcreate(memory_name.c_str(), H5F_ACC_TRUNC, creation.get(), access.get()),
               "H5Fcreate (in memory)", target_);
    {
      H5Handle root = h5_own(H5Gopen2(file.get(), "/", H5P_DEFAULT), "H5Gopen2 /", target_);
      write_attribute(root.get(), "format", kViewFormat);
      // Second, so that it sits in the file's first bytes (Note [Proving a file is ours]).
      write_attribute(root.get(), schema::kOutputIdAttr, index.meta.output_id);
      write_attribute(root.get(), "format_version", kViewFormatVersion);
      // What the view was built from (Note [A view names the index it shows]).
      write_attribute(root.get(), kViewIndexSha256Attr, index_sha256(index));
      write_attribute(root.get(), schema::kConfigFingerprintAttr, index.meta.config_fingerprint);
      write_attribute(root.get(), schema::kStorageDtypeAttr, storage_dtype_name(index.meta.dtype));
      write_attribute(root.get(), "num_shards", static_cast<int64_t>(index.shards.size()));

      std::vector<SourcePart> samples;
      for (const auto& entry : index.shards) samples.push_back({entry.file, entry.num_samples});
      // Note [Fill values of the view]: values that no shard stores.
      const int64_t no_seq = -1;
      const int32_t no_steps = -1;
      const uint8_t no_flag = 255;
      const double no_time = std::numeric_limits<double>::quiet_NaN();
      const float no_float = std::numeric_limits<float>::quiet_NaN();
      const uint16_t no_half = 0x7e00;  // a float16 quiet NaN
      const void* no_vector = index.meta.dtype == StorageDtype::kFloat16
                                  ? static_cast<const void*>(&no_half)
                                  : static_cast<const void*>(&no_float);
      add_virtual(root.get(), schema::kIdsDataset, string_type_.get(), 0, samples, nullptr);
      add_virtual(root.get(), schema::kSeqDataset, H5T_STD_I64LE, 0, samples, &no_seq);
      if (!index.meta.kept_columns.empty()) {
        // The kept columns map like /ids: variable-length strings, one row per sample.
        H5Handle properties = creation_properties(H5P_GROUP_CREATE);
        H5Handle group = h5_own(H5Gcreate2(root.get(), schema::kColumnsGroup, H5P_DEFAULT,
                                           properties.get(), H5P_DEFAULT),
                                "H5Gcreate2 columns", target_);
        for (const auto& name : index.meta.kept_columns) {
          add_virtual(group.get(), std::string(schema::kColumnsGroup) + "/" + name,
                      string_type_.get(), 0, samples, nullptr);
        }
      }

      const hid_t embedding_type =
          index.meta.dtype == StorageDtype::kFloat16 ? float16_type_.get() : H5T_IEEE_F32LE;
      for (const auto& m : index.meta.modalities) {
        if (!m) continue;
        const std::string name(modality_name(m->modality));
        H5Handle properties = creation_properties(H5P_GROUP_CREATE);
        H5Handle group =
            h5_own(H5Gcreate2(root.get(), name.c_str(), H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                   "H5Gcreate2 " + name, target_);
        write_attribute(group.get(), schema::kDimAttr, m->dim);
        write_attribute(group.get(), schema::kLayoutAttr,
                        m->per_step ? schema::kPerStepLayout : schema::kPooledLayout);
        write_attribute(group.get(), schema::kDtypeAttr, storage_dtype_name(index.meta.dtype));
        write_attribute(group.get(), schema::kEncoderAttr, m->encoder);
        write_attribute(group.get(), schema::kPoolingAttr, m->pooling);

        const std::string prefix = name + "/";
        add_virtual(group.get(), prefix + schema::kPresentDataset, H5T_STD_U8LE, 0, samples,
                    &no_flag);
        add_virtual(group.get(), prefix + schema::kNumStepsDataset, H5T_STD_I32LE, 0, samples,
                    &no_steps);
        if (m->modality == Modality::kText) {
          add_virtual(group.get(), prefix + schema::kTruncatedDataset, H5T_STD_U8LE, 0, samples,
                      &no_flag);
        }
        if (!m->per_step) {
          add_virtual(group.get(), prefix + schema::kEmbeddingsDataset, embedding_type, m->dim,
                      samples, no_vector);
          continue;
        }
        // The offsets are stored, not mapped (Note [The one-file view]): each shard's shifted
        // by the steps of the shards before it.
        const int k = modality_index(m->modality);
        std::vector<SourcePart> rows;
        std::vector<int64_t> global_offsets{0};
        for (size_t i = 0; i < index.shards.size(); ++i) {
          const auto& shard = (*offsets[i])[k];
          const int64_t shift = global_offsets.back();
          for (size_t j = 1; j < shard.size(); ++j) global_offsets.push_back(shift + shard[j]);
          rows.push_back({index.shards[i].file, shard.empty() ? 0 : shard.back()});
        }
        write_offsets(group.get(), prefix + schema::kOffsetsDataset, global_offsets);
        add_virtual(group.get(), prefix + schema::kValuesDataset, embedding_type, m->dim, rows,
                    no_vector);
        if (m->modality != Modality::kText) {
          add_virtual(group.get(), prefix + schema::kTimestampsDataset, H5T_IEEE_F64LE, 0, rows,
                      &no_time);
        }
      }
    }
    h5_check(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), "H5Fflush (in memory)", target_);
    const ssize_t size =
        h5_check(H5Fget_file_image(file.get(), nullptr, 0), "H5Fget_file_image (size)", target_);
    std::string image(static_cast<size_t>(size), '\0');
    h5_check(H5Fget_file_image(file.get(), image.data(), image.size()), "H5Fget_file_image",
             target_);
    return image;
  }

 private:
  // Without modification times the view of the same shards is the same bytes.
  H5Handle creation_properties(hid_t property_class) {
    H5Handle properties = h5_own(H5Pcreate(property_class), "H5Pcreate", target_);
    h5_check(H5Pset_obj_track_times(properties.get(), false), "H5Pset_obj_track_times", target_);
    return properties;
  }

  // The dataset `path` (relative to the root; the same path in every shard) as a virtual
  // dataset over `parts`, one after the other; `dim` 0 for a column, else [rows, dim].
  // `fill`: the value of rows whose file is missing (Note [Fill values of the view]), in `type`;
  // nullptr for strings, which read as empty.
  void add_virtual(hid_t parent, const std::string& path, hid_t type, int64_t dim,
                   const std::vector<SourcePart>& parts, const void* fill) {
    const std::string operation = "creating the virtual dataset /" + path;
    const int rank = dim > 0 ? 2 : 1;
    hsize_t total = 0;
    for (const auto& part : parts) total += static_cast<hsize_t>(part.rows);
    const hsize_t dims[2] = {total, static_cast<hsize_t>(dim)};
    H5Handle space = h5_own(H5Screate_simple(rank, dims, nullptr), operation, target_);
    H5Handle properties = creation_properties(H5P_DATASET_CREATE);
    h5_check(H5Pset_layout(properties.get(), H5D_VIRTUAL), operation, target_);
    if (fill != nullptr) h5_check(H5Pset_fill_value(properties.get(), type, fill), operation, target_);
    // H5Pset_virtual reads '%' in a source name as the start of a pattern ("%b"); "%%" is a
    // '%' (a kept column may be named "50%").
    std::string source_dataset = "/";
    for (const char ch : path) source_dataset += ch == '%' ? std::string("%%") : std::string(1, ch);
    hsize_t offset = 0;
    for (const auto& part : parts) {
      if (part.rows == 0) continue;
      const hsize_t rows[2] = {static_cast<hsize_t>(part.rows), static_cast<hsize_t>(dim)};
      const hsize_t start[2] = {offset, 0};
      h5_check(H5Sselect_hyperslab(space.get(), H5S_SELECT_SET, start, nullptr, rows, nullptr),
               operation, target_);
      H5Handle source = h5_own(H5Screate_simple(rank, rows, nullptr), operation, target_);
      h5_check(H5Pset_virtual(properties.get(), space.get(), part.file.c_str(),
                              source_dataset.c_str(), source.get()),
               operation, target_);
      offset += rows[0];
    }
    h5_check(H5Sselect_all(space.get()), operation, target_);
    const std::string name = path.substr(path.rfind('/') + 1);
    H5Handle dataset = h5_own(H5Dcreate2(parent, name.c_str(), type, space.get(), H5P_DEFAULT,
                                         properties.get(), H5P_DEFAULT),
                              operation, target_);
  }

  // A plain (not virtual) int64 column, contiguous: it is written whole each time.
  void write_offsets(hid_t parent, const std::string& path, const std::vector<int64_t>& values) {
    const std::string operation = "writing /" + path;
    const hsize_t rows = values.size();
    H5Handle space = h5_own(H5Screate_simple(1, &rows, nullptr), operation, target_);
    H5Handle properties = creation_properties(H5P_DATASET_CREATE);
    const std::string name = path.substr(path.rfind('/') + 1);
    H5Handle dataset = h5_own(H5Dcreate2(parent, name.c_str(), H5T_STD_I64LE, space.get(),
                                         H5P_DEFAULT, properties.get(), H5P_DEFAULT),
                              operation, target_);
    h5_check(
        H5Dwrite(dataset.get(), H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()),
        operation, target_);
  }

  void write_attribute(hid_t object, const char* name, std::string_view value) {
    const std::string operation = std::string("writing attribute ") + name;
    const std::string text(value);
    const char* pointer = text.c_str();
    H5Handle space = h5_own(H5Screate(H5S_SCALAR), operation, target_);
    H5Handle attribute =
        h5_own(H5Acreate2(object, name, string_type_.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
               operation, target_);
    h5_check(H5Awrite(attribute.get(), string_type_.get(), &pointer), operation, target_);
  }

  void write_attribute(hid_t object, const char* name, int64_t value) {
    const std::string operation = std::string("writing attribute ") + name;
    H5Handle space = h5_own(H5Screate(H5S_SCALAR), operation, target_);
    H5Handle attribute =
        h5_own(H5Acreate2(object, name, H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
               operation, target_);
    h5_check(H5Awrite(attribute.get(), H5T_NATIVE_INT64, &value), operation, target_);
  }

  fs::path target_;
  H5Handle string_type_;
  H5Handle float16_type_;
};

}  // namespace

void write_dataset_view(const fs::path& output_dir, const OutputIndex& index) {
  const fs::path target = output_dir / kDatasetViewFileName;
  std::string image;
  {
    const std::lock_guard lock(hdf5_lock());  // Note [One thread in HDF5]
    disable_hdf5_error_printing();
    std::vector<std::shared_ptr<const ShardOffsets>> offsets;
    offsets.reserve(index.shards.size());
    for (const auto& entry : index.shards) {
      offsets.push_back(read_offsets(output_dir, entry, index.meta));
    }
    image = ViewBuilder(target).build(index, offsets);
  }
  write_file_atomically(target, image);
}

std::string dataset_view_problem(const fs::path& output_dir, const OutputIndex& index) {
  const fs::path file = output_dir / kDatasetViewFileName;
  std::error_code error;
  if (!fs::is_regular_file(file, error)) return "it is missing";
  std::string output_id, index_digest;
  try {
    const std::lock_guard lock(hdf5_lock());  // Note [One thread in HDF5]
    disable_hdf5_error_printing();
    H5Handle h5 = h5_own(H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT), "H5Fopen", file);
    const auto text_attribute = [&](const char* name) -> std::string {
      if (h5_check(H5Aexists(h5.get(), name), "H5Aexists", file) <= 0) return {};
      H5Handle attribute = h5_own(H5Aopen(h5.get(), name, H5P_DEFAULT), "H5Aopen", file);
      H5Handle type = h5_own(H5Aget_type(attribute.get()), "H5Aget_type", file);
      if (H5Tis_variable_str(type.get()) <= 0) return {};
      H5Handle memory = make_utf8_string_type(file);
      char* value = nullptr;
      h5_check(H5Aread(attribute.get(), memory.get(), &value), "H5Aread", file);
      std::string text = value ? value : "";
      H5free_memory(value);
      return text;
    };
    output_id = text_attribute(schema::kOutputIdAttr);
    index_digest = text_attribute(kViewIndexSha256Attr);
  } catch (const StorageError& e) {
    return detail::concat("it cannot be read (", e.what(), ")");
  }
  if (output_id != index.meta.output_id) {
    return detail::concat("it belongs to another output (output_id '", output_id, "', not '",
                          index.meta.output_id, "')");
  }
  if (index_digest != index_sha256(index)) {
    return "it was built from another index.json than the folder's (it shows other shards)";
  }
  return {};
}

void refresh_dataset_view(const fs::path& output_dir, const OutputIndex& index) noexcept {
  try {
    write_dataset_view(output_dir, index);
  } catch (const std::exception& e) {
    try {
      spdlog::warn(
          "could not write the one-file view {} ({}); the shards and index.json are "
          "complete, and the next run on this output writes it again",
          (output_dir / kDatasetViewFileName).string(), e.what());
    } catch (...) {
    }
  }
}

}  // namespace precompute
