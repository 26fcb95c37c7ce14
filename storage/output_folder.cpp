#include "storage/output_folder.hpp"

#include <fcntl.h>
#include <spdlog/spdlog.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <exception>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/atomic_file.hpp"
#include "storage/dataset_view.hpp"
#include "storage/output_id.hpp"
#include "storage/shard_reader.hpp"

namespace precompute {

// Note [Resuming from the output folder]
// Only index.json makes a shard committed: a shard file is written, fsynced and renamed into
// place first, then the index that lists it (with its size and SHA-256) replaces the old one.
// So after a crash at any instant the folder holds: committed shards (listed), at most one
// renamed-but-unlisted shard per writer thread, and temporary files. The resume keeps the
// listed shards whose bytes still hash to what was recorded, deletes everything else of ours,
// and the runner redoes the sample ranges not covered. Checking the hash before HDF5 ever opens
// a shard matters: HDF5 may crash or read phantom rows from a damaged file
// (docs/reliability.md).
//
// One writer: the lock is flock() on .precompute.lock, which the kernel releases when the
// holder dies, so a kill -9 never leaves a stale lock. HDF5's own file locks cannot go stale
// here because shards are built in memory and written by our code, never opened for writing by
// HDF5 at their final path.

namespace {

namespace fs = std::filesystem;

constexpr std::string_view kRunFilePrefix = ".precompute.";

bool is_shard_file(const fs::path& file) { return is_shard_file_name(file.filename().string()); }

bool is_temp_file(const fs::path& file) {
  return file.filename().string().rfind(kTempFilePrefix, 0) == 0;
}

std::vector<fs::path> list_run_files(const fs::path& dir) {
  std::error_code ec;
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_run_file(entry.path())) files.push_back(entry.path());
  }
  PC_CHECK(!ec, StorageError, "cannot list output folder ", dir, ": ", ec.message());
  std::sort(files.begin(), files.end());
  return files;
}

void remove_file(const fs::path& file) {
  std::error_code ec;
  fs::remove(file, ec);
  PC_CHECK(!ec, StorageError, "cannot remove ", file, " from the output folder: ", ec.message());
}

// Note [Removing an earlier run's files at once]
// Unlinking a large file frees its extents, milliseconds a file on ext4, so removing a
// 1,000,000-caption run's 125 shards one after another takes over half a second; on up to 8 threads
// it takes half that, even on 2 cores (docs/benchmarks.md, "What bounds it, and the start-up
// timeline"). So the files go on up to 8 threads. Interrupted, any of them may be gone, not a
// prefix: a resume checks every shard the index lists (committed_shard_problem) and redoes those
// that are missing.
void remove_files(const std::vector<fs::path>& files) {
  constexpr size_t kMostAtOnce = 8;
  const size_t threads = std::min(kMostAtOnce, files.size());
  if (threads <= 1) {
    for (const auto& file : files) remove_file(file);
    return;
  }
  std::atomic<size_t> next{0};
  std::mutex failed_mutex;
  std::exception_ptr failed;  // the first error; the others stop taking files
  std::vector<std::thread> workers;
  workers.reserve(threads);
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < files.size(); i = next++) {
        try {
          remove_file(files[i]);
        } catch (...) {
          const std::lock_guard lock(failed_mutex);
          if (!failed) failed = std::current_exception();
          next = files.size();
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  if (failed) std::rethrow_exception(failed);
}

std::string read_lock_holder(int fd) {
  char buffer[32] = {};
  const ssize_t n = ::pread(fd, buffer, sizeof(buffer) - 1, 0);
  std::string pid = n > 0 ? std::string(buffer, static_cast<size_t>(n)) : std::string();
  while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
  const bool digits = !pid.empty() && std::all_of(pid.begin(), pid.end(), [](char c) {
    return c >= '0' && c <= '9';
  });
  return digits ? pid : std::string();
}

int take_lock(const fs::path& dir, int owner_pid) {
  const fs::path file = dir / kLockFileName;
  const int fd = ::open(file.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  PC_CHECK(fd >= 0, OutputFolderError, "cannot create the lock file ", file, ": ",
           std::generic_category().message(errno), "; choose a writable --output");
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    const std::string holder = read_lock_holder(fd);
    ::close(fd);
    // The holder writes its pid just after it takes the lock: a run that looks in between, or
    // a lock file emptied by hand, finds none, and names no process to signal.
    PC_CHECK(error != EWOULDBLOCK, OutputLockedError, "output folder ", dir,
             " is in use by another precompute run",
             holder.empty() ? std::string() : " (pid " + holder + ")",
             "; wait for it to finish, stop it",
             holder.empty() ? std::string() : " (kill " + holder + ")",
             ", or choose another --output");
    PC_THROW(OutputFolderError, "cannot lock the output folder ", dir, " (", file, "): ",
             std::generic_category().message(error));
  }
  // The pid is for the message another run prints; the lock itself is the flock.
  const std::string pid = std::to_string(owner_pid > 0 ? owner_pid : ::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    const int error = errno;
    ::close(fd);
    PC_THROW(OutputFolderError, "output folder ", dir, " is not writable: ",
             std::generic_category().message(error), " (writing ", file, ")");
  }
  return fd;
}

// The shards of a run whose index.json is damaged or gone, rebuilt from what each shard stores
// about itself. Shards that do not open, belong to another run, or hold ids that are not the
// input's at their positions are deleted.
std::optional<OutputIndex> rebuild_index(const fs::path& dir, const std::vector<fs::path>& shards,
                                         const OutputFolder::IdAt& id_at,
                                         const OutputFolder::RangeIdentity& range_identity) {
  std::optional<OutputIndex> index;
  std::set<int64_t> used_indexes;
  for (const auto& file : shards) {
    try {
      const ShardFile shard = read_shard(file);
      const auto& c = shard.contents;
      if (index && shard.meta.config_fingerprint != index->meta.config_fingerprint) {
        PC_THROW(StorageError, "its config fingerprint differs from the other shards'");
      }
      for (const auto& sample : c.samples) {
        const auto expected = id_at(sample.seq);
        PC_CHECK(expected && *expected == sample.id, StorageError, "it holds id '", sample.id,
                 "' at position ", sample.seq, ", where the input has ",
                 expected ? "'" + std::string(*expected) + "'" : std::string("nothing"));
      }
      const std::string identity =
          c.input_sha256.empty() ? std::string()
                                 : range_identity(c.first_seq, c.seq_count, shard.meta.kept_columns);
      if (!identity.empty()) {
        PC_CHECK(c.input_sha256 == identity, StorageError,
                 "the input of its positions [", c.first_seq, ", ", c.first_seq + c.seq_count,
                 ") changed since it was written (an id, path, caption or kept column value)");
      }
      PC_CHECK(used_indexes.insert(c.shard_index).second, StorageError, "its shard index ",
               c.shard_index, " is used twice");
      if (!index) {
        index.emplace();
        index->meta = shard.meta;
      }
      IndexEntry entry = index_entry_for(c);
      entry.file = file.filename().string();
      entry.bytes = fs::file_size(file);
      entry.sha256 = sha256_file(file);
      index->shards.push_back(std::move(entry));
    } catch (const Error& e) {
      spdlog::warn("shard {} cannot be used to rebuild the index ({}); it is removed and its "
                   "samples will be redone", file.string(), e.what());
      remove_file(file);
    }
  }
  if (!index) return std::nullopt;
  std::sort(index->shards.begin(), index->shards.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.first_seq < b.first_seq; });
  // Overlapping ranges cannot come from one run; keep the first of each overlap.
  std::vector<IndexEntry> kept;
  for (auto& entry : index->shards) {
    if (!kept.empty() && entry.first_seq < kept.back().first_seq + kept.back().seq_count) {
      spdlog::warn("shard {} overlaps {}; it is removed", entry.file, kept.back().file);
      remove_file(dir / entry.file);
      continue;
    }
    kept.push_back(std::move(entry));
  }
  index->shards = std::move(kept);
  // What the input was is not known any more; the ids above were checked instead.
  index->input_samples = -1;
  return index;
}

// An index names its shards' files, and a resume deletes the damaged ones: read_index() counts
// an index that names anything but a shard of this folder (a path, "..") as damaged, so it is
// rebuilt from the shards; one of another output, too.
std::optional<OutputIndex> read_checked_index(const fs::path& dir, const std::string& output_id) {
  auto index = read_index(dir);
  PC_CHECK(!index || index->meta.output_id == output_id, StorageError, "index file ",
           dir / kIndexFileName, " is damaged: its output_id is not the one its file carries");
  return index;
}

// Note [Foreign output folders]
// A run deletes only names it makes (is_run_file), inside its folder, and only files that carry
// the folder's output id (Note [Proving a file is ours] in output_id.cpp). Still, pointing
// --output at a folder of other things is almost always a mistake (a typo, the dataset folder),
// so a folder that holds files but no trace of a run (a proven file of ours, a journal) is
// refused, naming a few of the files; --overwrite accepts it and leaves those files alone.
//
// Files with the tool's names are proven before anything else: every one must carry the
// folder's id (its index's, or the one its files agree on), so a user's own dataset.h5, an HDF5
// file of theirs named like a shard, or a shard of an output of other settings copied in is
// refused by name (exit 73) instead of being overwritten, deleted or read as the output's, with
// --overwrite too.

[[noreturn]] void refuse_unproven(const fs::path& file, const std::string& why) {
  PC_THROW(OutputFolderError, "output folder ", file.parent_path(), " holds ",
           file.filename(), ", which ", why,
           "; precompute deletes or replaces only files it can prove it wrote there, so nothing "
           "was changed. Move that file out of the folder, or choose another --output");
}

// The folder's output id ("" when it holds no marked file), after proving every file with one
// of the tool's names carries it.
std::string prove_folder(const fs::path& dir) {
  std::vector<fs::path> marked;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    if (is_marked_file_name(entry.path().filename().string())) marked.push_back(entry.path());
  }
  PC_CHECK(!ec, OutputFolderError, "cannot list output folder ", dir, ": ", ec.message());
  std::sort(marked.begin(), marked.end());
  // The index names the folder's id; without one, the first marked file does.
  std::stable_partition(marked.begin(), marked.end(),
                        [](const fs::path& f) { return f.filename() == kIndexFileName; });
  std::string id;
  for (const auto& file : marked) {
    std::error_code status_error;
    if (!fs::is_regular_file(fs::symlink_status(file, status_error))) {
      refuse_unproven(file, "is not a regular file (a link, a folder)");
    }
    std::optional<std::string> found;
    try {
      found = find_output_id(file);
    } catch (const StorageError& e) {
      refuse_unproven(file, std::string("cannot be read (") + e.what() + ")");
    }
    if (!found) {
      refuse_unproven(file, "carries no output id: precompute did not write it (or wrote it "
                            "before outputs were marked, or damage erased the id)");
    }
    if (id.empty()) id = *found;
    if (*found != id) {
      refuse_unproven(file, detail::concat("belongs to another output (it carries ", *found,
                                           ", this folder's files ", id, ")"));
    }
  }
  return id;
}

void check_not_foreign(const fs::path& dir) {
  std::vector<std::string> foreign;
  bool ours = false;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    const auto name = entry.path().filename().string();
    if (name == kLockFileName || is_temp_file(entry.path())) continue;
    // Marked files are proven by prove_folder; rank.json is only in rank folders the tool makes.
    if (is_marked_file_name(name) || is_run_file(entry.path()) || name == kRankRecordFileName) {
      ours = true;
    } else {
      foreign.push_back(name);
    }
  }
  PC_CHECK(!ec, OutputFolderError, "cannot list output folder ", dir, ": ", ec.message());
  if (ours || foreign.empty()) return;
  std::sort(foreign.begin(), foreign.end());
  std::string names;
  for (size_t i = 0; i < foreign.size() && i < 3; ++i) names += (i ? ", " : "") + foreign[i];
  if (foreign.size() > 3) names += fmt::format(" and {} more", foreign.size() - 3);
  PC_THROW(OutputFolderError, "output folder ", dir, " is not empty and holds no earlier "
           "precompute run (", names, "); choose a new or empty folder with --output, or pass "
           "--overwrite to write there anyway (only precompute's own files are ever removed)");
}

}  // namespace

bool is_marked_file_name(std::string_view name) {
  return is_shard_file_name(name) || name == kIndexFileName || name == kDatasetViewFileName ||
         name == kJobSummaryFileName || name == kRunSummaryFileName;
}

bool is_run_file(const fs::path& file) {
  const auto name = file.filename().string();
  if (name == kLockFileName || name == kRankRecordFileName) return false;
  return is_shard_file(file) || name == kIndexFileName || name == kDatasetViewFileName ||
         name == kJobSummaryFileName || name == kRunSummaryFileName || is_temp_file(file) ||
         name.rfind(kRunFilePrefix, 0) == 0;
}

OutputFolder OutputFolder::open(const fs::path& dir, const OutputFolderOptions& options) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  PC_CHECK(!ec, OutputFolderError, "cannot create output folder ", dir, ": ", ec.message(),
           "; choose a writable location with --output");
  PC_CHECK(fs::is_directory(dir), OutputFolderError, "output path ", dir,
           " exists but is not a folder; choose another --output");
  OutputFolder folder(dir, take_lock(dir, options.owner_pid));
  folder.output_id_ = prove_folder(dir);  // Note [Foreign output folders]
  if (!options.allow_foreign) check_not_foreign(dir);

  // Prove the folder is writable now, not after an hour of decoding.
  const auto probe = dir / ".precompute.write-probe";
  try {
    write_file_atomically(probe, "probe");
  } catch (const StorageError& e) {
    PC_THROW(OutputFolderError, "output folder ", dir, " is not writable: ", e.what());
  }
  fs::remove(probe, ec);
  return folder;
}

OutputFolder::OutputFolder(OutputFolder&& other) noexcept
    : dir_(std::move(other.dir_)),
      lock_fd_(std::exchange(other.lock_fd_, -1)),
      output_id_(std::move(other.output_id_)) {}

OutputFolder::~OutputFolder() {
  if (lock_fd_ >= 0) ::close(lock_fd_);
}

void OutputFolder::remove_previous_run(const std::vector<std::string>& keep) const {
  auto files = list_run_files(dir_);
  // The tars' indexes describe the input, not the output, and each is checked against its tar
  // before use (Note [Tar indexes kept in the output folder] in pipeline/input/tar_index_cache.cpp).
  std::erase_if(files, [&](const fs::path& f) {
    const auto name = f.filename().string();
    return name.rfind(kTarIndexFilePrefix, 0) == 0 ||
           std::find(keep.begin(), keep.end(), name) != keep.end();
  });
  // The index goes last: interrupted halfway, the folder is still an earlier run (or a part of
  // one, rebuilt from its shards), never an index pointing at deleted shards.
  const auto index = std::stable_partition(
      files.begin(), files.end(), [](const fs::path& f) { return f.filename() != kIndexFileName; });
  remove_files({files.begin(), index});  // Note [Removing an earlier run's files at once]
  for (auto it = index; it != files.end(); ++it) remove_file(*it);
  if (!files.empty()) {
    spdlog::info("--overwrite: removed {} file(s) of an earlier run from {}", files.size(),
                 dir_.string());
  }
}

std::optional<OutputIndex> OutputFolder::peek_previous_run() const {
  try {
    return read_checked_index(dir_, output_id_);
  } catch (const StorageError&) {
    return std::nullopt;
  }
}

std::optional<OutputIndex> OutputFolder::load_previous_run(
    const IdAt& id_at, const RangeIdentity& range_identity) const {
  std::vector<fs::path> shards;
  int temps = 0;
  for (const auto& file : list_run_files(dir_)) {
    if (is_temp_file(file)) {
      remove_file(file);
      ++temps;
    } else if (is_shard_file(file)) {
      shards.push_back(file);
    }
  }
  if (temps > 0) {
    spdlog::info("removed {} temporary file(s) left by an interrupted run", temps);
  }

  std::optional<OutputIndex> index;
  bool damaged = false;
  try {
    index = read_checked_index(dir_, output_id_);
  } catch (const StorageError& e) {
    spdlog::warn("{}; rebuilding it from the {} shard file(s) in the folder", e.what(),
                 shards.size());
    damaged = true;
  }
  if (!index && !shards.empty() && !damaged) {
    // A run writes its index before its first shard, so shards without one mean the index was
    // deleted afterwards.
    spdlog::warn("{} is missing; rebuilding it from the {} shard file(s) in the folder",
                 (dir_ / kIndexFileName).string(), shards.size());
  }
  if (!index) {
    // The damaged index stays until the rebuilt one replaces it: a crash in between loses
    // nothing.
    index = rebuild_index(dir_, shards, id_at, range_identity);
    if (index) {
      write_index(dir_, *index);
    } else if (damaged) {
      remove_file(dir_ / kIndexFileName);
    }
    return index;
  }

  std::set<std::string> recorded;
  std::vector<IndexEntry> intact;
  for (auto& entry : index->shards) {
    if (const auto problem = committed_shard_problem(dir_, entry); !problem.empty()) {
      spdlog::warn("committed shard {} is damaged: {}; it is removed and its {} samples (from "
                   "position {}) will be redone",
                   (dir_ / entry.file).string(), problem, entry.seq_count, entry.first_seq);
      remove_file(dir_ / entry.file);  // nothing to remove when it is missing
      continue;
    }
    recorded.insert(entry.file);
    intact.push_back(std::move(entry));
  }
  int unrecorded = 0;
  for (const auto& file : shards) {
    if (recorded.count(file.filename().string()) == 0) {
      remove_file(file);
      ++unrecorded;
    }
  }
  if (unrecorded > 0) {
    spdlog::info("removed {} shard file(s) written but not recorded before an interruption",
                 unrecorded);
  }
  const bool dropped = intact.size() != index->shards.size();
  index->shards = std::move(intact);
  if (dropped) write_index(dir_, *index);
  return index;
}

}  // namespace precompute
