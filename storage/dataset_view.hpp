#pragma once
// out/dataset.h5: one HDF5 file that shows every committed shard of the output as single arrays
// (/ids, /seq, and per modality present, num_steps, truncated, and the pooled embeddings or the
// per-step values and timestamps), through HDF5 virtual datasets that point at the shards by
// relative file name, so the folder can move. It stores only the per-step offsets itself; it is
// rebuilt from index.json whenever the index changes (Note [The one-file view] in dataset_view.cpp,
// docs/format.md "One-file view").
//
// Thread-safety: one call at a time per output folder (the caller that writes the index). It
// calls HDF5, whose library here is built thread-safe, so it may run beside the shard builder.

#include <filesystem>
#include <string>
#include <string_view>

#include "storage/output_index.hpp"

namespace precompute {

inline constexpr std::string_view kDatasetViewFileName = "dataset.h5";
// The root attribute holding index_sha256() of the index the view was built from (Note [A view
// names the index it shows] in dataset_view.cpp).
inline constexpr char kViewIndexSha256Attr[] = "index_sha256";

// Writes DIR/dataset.h5 for the shards `index` lists, replacing the file atomically (temporary
// file, fsync, rename). Reads each listed shard's CSR offsets (once per shard content).
// Throws StorageError.
void write_dataset_view(const std::filesystem::path& output_dir, const OutputIndex& index);

// Why DIR/dataset.h5 is not the view of `index` (missing, unreadable, another output's, built
// from another index.json); empty when it is. Opens only the view's root attributes.
std::string dataset_view_problem(const std::filesystem::path& output_dir,
                                 const OutputIndex& index);

// write_dataset_view() for the run's hooks: the view is a convenience, so a failure is logged as
// a warning and never fails the run. Never throws.
void refresh_dataset_view(const std::filesystem::path& output_dir,
                          const OutputIndex& index) noexcept;

}  // namespace precompute
