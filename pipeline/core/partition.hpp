#pragma once
// Which part of a job this process runs: its rank and the world size, from --rank/--world-size
// or the scheduler's environment (Note [Where the rank comes from] in partition.cpp), and the
// input positions a rank owns (Note [Splitting a job into ranks]). Pure functions; thread-safe.

#include <cstdint>
#include <functional>
#include <optional>
#include <string>

namespace precompute {

// The most ranks a job may have (folder names hold five digits; far beyond real clusters).
inline constexpr int64_t kMaxWorldSize = 100000;

struct Partition {
  int64_t rank = 0;
  int64_t world_size = 1;
  // Where they came from, for the log: "--rank and --world-size",
  // "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT", ...; empty for a single process.
  std::string source;

  // More than one rank: this process writes a rank folder, not the output itself.
  bool split() const { return world_size > 1; }
};

// What the command line says; text as typed, so that "abc", "-1" and "1e3" get the same
// messages as the environment's values.
struct PartitionFlags {
  std::optional<std::string> rank;        // --rank
  std::optional<std::string> world_size;  // --world-size
  int64_t config_world_size = 0;          // run.world_size; 0: not set
};

// Reads one environment variable; std::nullopt when unset.
using GetEnv = std::function<std::optional<std::string>(const char* name)>;
// The process's environment.
std::optional<std::string> process_env(const char* name);

// The rank and world size: flags beat the environment, which beats run.world_size. Throws
// ConfigError (exit 2) naming the flag or variable, its value and the fix for anything that is
// not a valid rank below a valid world size: non-numeric, negative, zero or huge values, a rank
// without a count, environment sources that disagree.
Partition resolve_partition(const PartitionFlags& flags, const GetEnv& env = process_env);

// The input positions [first_seq, end_seq) and shards [first_shard, end_shard) of one rank: the
// input's ceil(total / shard_size) shards split into world_size contiguous, balanced runs. Fixed
// by the input's length and shard_size alone. Empty (first == end) for a rank without work.
struct RankSpan {
  int64_t first_shard = 0;
  int64_t end_shard = 0;
  int64_t first_seq = 0;
  int64_t end_seq = 0;

  bool empty() const { return first_seq >= end_seq; }
  int64_t samples() const { return end_seq - first_seq; }
};
RankSpan rank_span(int64_t total_samples, int64_t shard_size, int64_t rank, int64_t world_size);

}  // namespace precompute
