#include "storage/output_folder.hpp"

#include <spdlog/spdlog.h>

#include <string>
#include <system_error>

#include "pipeline/core/error.hpp"
#include "storage/atomic_file.hpp"
#include "storage/output_index.hpp"

namespace precompute {
namespace {

bool is_precompute_file(const std::filesystem::path& file) {
  const auto name = file.filename().string();
  const bool shard = name.rfind("shard-", 0) == 0 && file.extension() == ".h5";
  return shard || name == kIndexFileName || name.rfind(kTempFilePrefix, 0) == 0;
}

}  // namespace

void prepare_output_folder(const std::filesystem::path& dir, bool overwrite) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  PC_CHECK(!ec, OutputFolderError, "cannot create output folder ", dir, ": ", ec.message(),
           "; choose a writable location with --output");
  PC_CHECK(std::filesystem::is_directory(dir), OutputFolderError, "output path ", dir,
           " exists but is not a folder; choose another --output");

  std::vector<std::filesystem::path> ours;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (entry.is_regular_file() && is_precompute_file(entry.path())) ours.push_back(entry.path());
  }
  PC_CHECK(!ec, OutputFolderError, "cannot list output folder ", dir, ": ", ec.message());
  const bool previous_run = std::any_of(ours.begin(), ours.end(), [](const auto& p) {
    return p.filename().string().rfind(kTempFilePrefix, 0) != 0;
  });
  PC_CHECK(!previous_run || overwrite, OutputFolderError, "output folder ", dir,
           " already holds a precompute run (index.json or shard files); pass --overwrite to "
           "replace it, or choose another --output");
  for (const auto& file : ours) {
    std::filesystem::remove(file, ec);
    PC_CHECK(!ec, OutputFolderError, "cannot remove ", file,
             " from the output folder: ", ec.message());
  }
  if (!ours.empty())
    spdlog::info("removed {} file(s) of an earlier run from {}", ours.size(), dir.string());

  // Prove the folder is writable now, not after an hour of decoding.
  const auto probe = dir / ".precompute-write-probe";
  try {
    write_file_atomically(probe, "probe");
  } catch (const StorageError& e) {
    PC_THROW(OutputFolderError, "output folder ", dir, " is not writable: ", e.what());
  }
  std::filesystem::remove(probe, ec);
}

}  // namespace precompute
