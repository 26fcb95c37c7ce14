#pragma once
// A job split into ranks (docs/distributed.md): each rank is an ordinary run in its own folder
// OUT/ranks/rank-RRRRR-of-NNNNN (its own lock, journals, index.json, shards), plus rank.json,
// what the rank says about itself for `precompute status` and the job summary. Merging links
// every rank's shards into OUT under their own names and writes OUT/index.json (and
// OUT/dataset.h5) as one run over the whole input would, plus OUT/job.json (Note [Merging
// ranks] in job_ranks.cpp). The ranks and OUT carry one output id, their settings'
// (storage/output_id.hpp).
//
// Thread-safety: none; one call at a time per output folder. Processes are kept apart by the
// output folder's lock (merge) and each rank folder's lock (runs).

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "pipeline/core/partition.hpp"
#include "storage/output_folder.hpp"
#include "storage/output_index.hpp"

namespace precompute {

inline constexpr std::string_view kRanksFolderName = "ranks";

// OUT/ranks/rank-00003-of-00004.
std::filesystem::path rank_folder(const std::filesystem::path& output, int64_t rank,
                                  int64_t world_size);

// rank.json: written when a rank has passed its start-up checks (state "running") and when it
// ends ("done", "stopped", "failed"); a start-up that is refused leaves it as it was. A run
// writes it through RankLifecycle (storage/rank_lifecycle.hpp) alone.
struct RankRecord {
  std::string output_id;  // of the rank's output (its settings'); empty before its start-up
  int64_t rank = 0;
  int64_t world_size = 1;
  int64_t total_samples = 0;  // of the whole input
  int64_t shard_size = 0;
  RankSpan span;
  std::string state;    // "running", "done", "stopped" (by a signal) or "failed"
  int64_t pid = 0;      // the process to signal (the supervisor when there is one)
  std::string host;
  std::string config;   // the config file, absolute, for the rerun command
  // The command line the rank ran with (argv, as typed), the folder it ran in, and where its
  // rank came from (Partition::source): the rerun command repeats them exactly.
  std::vector<std::string> command;
  std::string working_folder;
  std::string rank_source;
  // Its --overwrite was carried out: a rerun resumes instead of removing the rank's work again.
  bool overwrite_done = false;
  double started = 0;   // Unix time of the first attempt's start
  double finished = 0;  // Unix time of the end of the last attempt; 0: not ended
  int64_t attempts = 0;
  int64_t processed = 0;  // input positions the last attempt that had work processed
  double seconds = 0;     // its time, start-up included
  std::string message;    // why it failed
};

void write_rank_record(const std::filesystem::path& folder, const RankRecord& record);
// std::nullopt when there is none or it does not parse (a record is a convenience).
std::optional<RankRecord> read_rank_record(const std::filesystem::path& folder);

double unix_now();
std::string host_name();

// One rank as `status` and `merge` see it.
struct RankState {
  enum class Kind { kNotStarted, kRunning, kStopped, kFailed, kDone };
  int64_t rank = 0;
  Kind kind = Kind::kNotStarted;
  RankSpan span;
  int64_t done = 0;  // input positions of its span in committed shards
  std::optional<RankRecord> record;
  std::optional<OutputIndex> index;
  std::string problem;  // why it is not done, or why its index cannot be used
};
std::string_view rank_state_name(RankState::Kind kind);

// What OUT shows compared with what a merge of the ranks now would write (Note [Merging ranks]).
enum class MergedKind {
  kNotMerged,   // OUT has no index: not merged yet
  kCurrent,     // OUT shows exactly the ranks' shards, its view and job.json agree with it
  kOutOfDate,   // OUT shows an earlier merge, or its view, job.json or a shard disagrees
  kOtherIndex,  // OUT's index.json was written by a run on OUT, not by a merge
};

struct JobState {
  std::filesystem::path output;
  int64_t world_size = 0;
  int64_t total_samples = -1;  // -1: no rank has said yet
  int64_t shard_size = 0;
  std::string config;  // a rank's config file, for rerun commands
  std::vector<RankState> ranks;
  std::vector<int64_t> other_world_sizes;  // of other jobs' rank folders found in OUT/ranks
  MergedKind merged = MergedKind::kNotMerged;
  std::string merged_why;  // what disagrees, for kOutOfDate and kOtherIndex

  int64_t done() const;
  bool all_done() const;
  // The command that reruns one rank: the command it (or, never started, another rank) ran
  // with, in the folder it ran in, with its rank and world size, and --overwrite only while the
  // removal it asked for has not been carried out.
  std::string rerun_command(int64_t rank) const;
};

// Reads OUT/ranks/* and OUT's own files: every rank's state and what OUT shows, from one set of
// checks that `status` and `merge` share (status checks OUT's shards by size and identity,
// merge also by SHA-256: `hash_shards`). `world_size` picks among several world sizes found;
// without it there must be one. Throws ConfigError when OUT holds no ranks or several world
// sizes.
JobState read_job(const std::filesystem::path& output, std::optional<int64_t> world_size,
                  bool hash_shards = false);

struct MergeResult {
  bool merged = false;          // OUT now shows the whole job
  bool already = false;         // it did before this call; nothing was written
  std::string waiting_for;      // when not merged: the ranks not done, named
};

// Checks that every rank is complete (its shards cover its span exactly, each shard's bytes
// match its rank's index) with one config fingerprint and one input identity, then links the
// shards into OUT, writes OUT/job.json, OUT/index.json and OUT/dataset.h5, and removes OUT's
// shards that the new index does not list. Takes OUT's lock. Idempotent; a merge killed at any
// point is completed by the next one.
// `refuse`: an incomplete job throws ConfigError naming each rank and the command to rerun it
// (precompute merge); otherwise it returns with waiting_for set (a rank that just finished).
// Throws OutputLockedError when another merge holds the lock, OutputFolderError when OUT holds a
// file with one of the tool's names that this job did not write, StorageError on I/O errors or
// a rank's damaged shard (naming its rerun command).
MergeResult merge_job(const std::filesystem::path& output, std::optional<int64_t> world_size,
                      bool refuse);

}  // namespace precompute
