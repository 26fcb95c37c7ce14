#pragma once
// The output folder of a run, held for the run's whole life: created if missing, proven
// writable, locked against a second writer, and cleared of what a crashed run left behind
// (Note [Resuming from the output folder] in output_folder.cpp). Fails in seconds, before any
// decoding, with the path and the fix.

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "storage/output_index.hpp"
#include "storage/shard_file_name.hpp"

namespace precompute {

// The lock file in the output folder; it holds the pid of the run that has the lock.
inline constexpr std::string_view kLockFileName = ".precompute.lock";
// A rank folder's record of the rank and a merged output's job summary (storage/job_ranks.hpp).
inline constexpr std::string_view kRankRecordFileName = "rank.json";
inline constexpr std::string_view kJobSummaryFileName = "job.json";
// The summary of the last run that changed the folder (pipeline/summary_file.hpp).
inline constexpr std::string_view kRunSummaryFileName = "summary.json";
// The start of the names of the tars' kept indexes (pipeline/input/tar_index_cache.hpp), which
// --overwrite leaves: they describe the input, not the output.
inline constexpr std::string_view kTarIndexFilePrefix = ".precompute.tar-index.";

struct OutputFolderOptions {
  // Accept a folder that holds files with names precompute does not make and no earlier run of
  // it (for --overwrite, which still removes only precompute's own files; for merge, whose
  // folder holds ranks/). Without it such a folder is refused: it is most likely a wrong
  // --output. Files with the tool's names must carry the folder's output id either way.
  bool allow_foreign = false;
  // The pid that other runs name when this one holds the lock: the process a person should
  // signal to stop the run (the supervisor, not the child it restarts). 0: this process.
  int owner_pid = 0;
};

class OutputFolder {
 public:
  // Creates `dir` (and parents), takes its lock, proves that every file with one of the tool's
  // names carries one output id, the index's (Note [Proving a file is ours] in output_id.cpp), and
  // writes a probe file. Throws OutputLockedError naming the holder's pid when another run has
  // the lock; OutputFolderError when the folder cannot be created or written, holds a file with
  // one of the tool's names that the tool cannot prove it wrote there (naming it), or holds
  // other files and no earlier run (unless options.allow_foreign). Deletes nothing.
  static OutputFolder open(const std::filesystem::path& dir, const OutputFolderOptions& options);

  OutputFolder(OutputFolder&& other) noexcept;
  OutputFolder& operator=(OutputFolder&&) = delete;
  OutputFolder(const OutputFolder&) = delete;
  OutputFolder& operator=(const OutputFolder&) = delete;
  ~OutputFolder();  // releases the lock (the kernel does too when the process dies)

  const std::filesystem::path& path() const { return dir_; }
  // The output id that the files of the earlier output in the folder carry (its index's, or the
  // one its files agree on); empty when the folder holds none.
  const std::string& output_id() const { return output_id_; }

  // Removes every file precompute wrote here (index, shards, temporary files, journals) but
  // the tars' kept indexes and the files named in `keep` (this command's own: the journal of
  // its decodes, a quarantine its supervisor wrote); nothing else in the folder is touched. For
  // --overwrite.
  void remove_previous_run(const std::vector<std::string>& keep = {}) const;

  // Returns the index of an earlier run with only the shards that are intact: each shard's file
  // is checked against the size and SHA-256 recorded for it before anything else reads it, and
  // a damaged or missing one is dropped (and deleted) so that its samples are redone. Temporary
  // files and shard files the index does not record (a crash between rename and record) are
  // deleted. A damaged index.json is rebuilt from the shards themselves, keeping those whose
  // stored ids match `id_at(seq)` (the input's id at a position; nullopt past its end).
  // std::nullopt when the folder holds no earlier run. Throws StorageError when the folder
  // cannot be read or cleaned.
  // A shard that records the identity of its input range (ShardContents::input_sha256) must
  // also match `range_identity(first_seq, seq_count)`, so that a rebuilt index never keeps a
  // shard of a caption or path edited since; a bit flipped in its data fails HDF5's checksum as
  // the shard is read, and the shard is redone too. `kept_columns` are the shard's (its
  // output.keep_columns): the identity covers their values, so a range_identity that cannot
  // compute it for those columns (another list than the run's) returns "", and the shard is
  // kept for the settings check to refuse the run, not deleted as if its input had changed.
  using IdAt = std::function<std::optional<std::string_view>(int64_t seq)>;
  using RangeIdentity = std::function<std::string(
      int64_t first_seq, int64_t seq_count, const std::vector<std::string>& kept_columns)>;
  std::optional<OutputIndex> load_previous_run(const IdAt& id_at,
                                               const RangeIdentity& range_identity) const;

  // The earlier run's index as it is on disk, for the checks that may refuse this run before
  // the folder is changed in any way; std::nullopt when there is none or it is damaged.
  std::optional<OutputIndex> peek_previous_run() const;

 private:
  OutputFolder(std::filesystem::path dir, int lock_fd) : dir_(std::move(dir)), lock_fd_(lock_fd) {}

  std::filesystem::path dir_;
  int lock_fd_ = -1;
  std::string output_id_;
};

// True for the files a run writes into its output folder (shards, index, the one-file view, a
// merge's job.json, the run's summary.json, temporary files, journals; not the lock file, which
// must outlive a
// --overwrite, nor a rank's rank.json, which a rank keeps across one). Only these are ever
// deleted, and only once proven (OutputFolder::open).
bool is_run_file(const std::filesystem::path& file);

// True for the names of the files that carry the folder's output id: shards, index.json,
// dataset.h5, job.json, summary.json. (rank.json lives only in the rank folders the tool makes.)
bool is_marked_file_name(std::string_view name);

}  // namespace precompute
