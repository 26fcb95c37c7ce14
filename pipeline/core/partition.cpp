#include "pipeline/core/partition.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>
#include <vector>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

// Note [Where the rank comes from]
// A rank and a world size are taken, in this order, from:
//   1. --rank and --world-size (flags beat everything; a scheduler's resubmitted array task sees
//      a count of 1, so the templates always pass --world-size);
//   2. the environment, each source a pair of variables:
//        SLURM_ARRAY_TASK_ID with SLURM_ARRAY_TASK_COUNT (or SLURM_ARRAY_TASK_MAX + 1): arrays
//          are numbered from 0 (--array=0-3), step 1;
//        SLURM_PROCID with SLURM_NTASKS (srun's tasks), only when SLURM_NTASKS > 1 (every batch
//          job has SLURM_PROCID=0, SLURM_NTASKS=1);
//        RANK with WORLD_SIZE (torchrun and most launchers), only when WORLD_SIZE > 1;
//        JOB_COMPLETION_INDEX (a Kubernetes Indexed Job), which has no count;
//   3. run.world_size in the config, for a rank without a count.
// Two environment sources that both apply and disagree are refused: nothing says which one the
// user meant, and a wrong guess writes the wrong part of the job. Values must be plain decimal
// integers; everything else is refused with the variable's name and value.

struct Source {
  int64_t rank = 0;
  std::optional<int64_t> world;
  std::string names;      // "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT"
  std::string rank_name;  // "SLURM_ARRAY_TASK_ID"
};

// A non-negative decimal integer, at most `max`; `what` names the flag or variable.
int64_t parse_count(const std::string& text, const std::string& what, int64_t max) {
  PC_CHECK(!text.empty(), ConfigError, what, " is empty; give a whole number");
  const bool digits = text.find_first_not_of("0123456789") == std::string::npos;
  PC_CHECK(digits || (text[0] == '-' && text.size() > 1 &&
                      text.find_first_not_of("0123456789", 1) == std::string::npos),
           ConfigError, what, " = '", text, "' is not a whole number; give a rank or world size "
           "as plain digits (e.g. 3)");
  PC_CHECK(digits, ConfigError, what, " = ", text, " is negative; ranks count from 0 and a "
           "world size from 1");
  int64_t value = 0;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  PC_CHECK(error == std::errc() && end == text.data() + text.size() && value <= max, ConfigError,
           what, " = ", text, " is too large (at most ", max, ")");
  return value;
}

std::optional<int64_t> env_count(const GetEnv& env, const char* name, int64_t max) {
  const auto value = env(name);
  if (!value) return std::nullopt;
  return parse_count(*value, std::string("environment variable ") + name, max);
}

std::string describe(const Source& s) {
  std::string out = s.names + " (rank " + std::to_string(s.rank);
  if (s.world) out += " of " + std::to_string(*s.world);
  return out + ")";
}

// Every environment source that says this process is one rank of several.
std::vector<Source> environment_sources(const GetEnv& env) {
  std::vector<Source> found;
  constexpr int64_t kMaxRank = kMaxWorldSize - 1;
  if (const auto id = env_count(env, "SLURM_ARRAY_TASK_ID", kMaxRank)) {
    const auto step = env_count(env, "SLURM_ARRAY_TASK_STEP", kMaxWorldSize);
    PC_CHECK(!step || *step <= 1, ConfigError, "SLURM_ARRAY_TASK_STEP = ", *step,
             ": an array job's tasks must be numbered 0, 1, 2, ... (sbatch --array=0-N), or pass "
             "--rank and --world-size");
    Source s{*id, env_count(env, "SLURM_ARRAY_TASK_COUNT", kMaxWorldSize),
             "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT", "SLURM_ARRAY_TASK_ID"};
    if (!s.world) {
      if (const auto max = env_count(env, "SLURM_ARRAY_TASK_MAX", kMaxRank)) {
        s.world = *max + 1;
        s.names = "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_MAX";
      } else {
        s.names = "SLURM_ARRAY_TASK_ID";
      }
    }
    found.push_back(std::move(s));
  }
  if (const auto tasks = env_count(env, "SLURM_NTASKS", kMaxWorldSize); tasks && *tasks > 1) {
    if (const auto id = env_count(env, "SLURM_PROCID", kMaxRank)) {
      found.push_back({*id, *tasks, "SLURM_PROCID and SLURM_NTASKS", "SLURM_PROCID"});
    }
  }
  if (const auto world = env_count(env, "WORLD_SIZE", kMaxWorldSize); world && *world > 1) {
    if (const auto rank = env_count(env, "RANK", kMaxRank)) {
      found.push_back({*rank, *world, "RANK and WORLD_SIZE", "RANK"});
    }
  }
  if (const auto index = env_count(env, "JOB_COMPLETION_INDEX", kMaxRank)) {
    found.push_back({*index, std::nullopt, "JOB_COMPLETION_INDEX", "JOB_COMPLETION_INDEX"});
  }
  return found;
}

}  // namespace

std::optional<std::string> process_env(const char* name) {
  const char* value = std::getenv(name);
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

Partition resolve_partition(const PartitionFlags& flags, const GetEnv& env) {
  constexpr int64_t kMaxRank = kMaxWorldSize - 1;
  std::optional<int64_t> flag_rank;
  std::optional<int64_t> flag_world;
  if (flags.rank) flag_rank = parse_count(*flags.rank, "--rank", kMaxRank);
  if (flags.world_size) {
    flag_world = parse_count(*flags.world_size, "--world-size", kMaxWorldSize);
    PC_CHECK(*flag_world >= 1, ConfigError, "--world-size 0: a job has at least 1 rank");
  }
  const std::vector<Source> sources = environment_sources(env);
  // Environment sources must agree, unless the flags decide both values.
  if (!(flag_rank && flag_world) && sources.size() > 1) {
    for (size_t i = 1; i < sources.size(); ++i) {
      const bool same_rank = sources[i].rank == sources[0].rank;
      const bool same_world = !sources[i].world || !sources[0].world ||
                              *sources[i].world == *sources[0].world;
      PC_CHECK((flag_rank || same_rank) && (flag_world || same_world), ConfigError,
               "the environment names two different ranks: ", describe(sources[0]), " and ",
               describe(sources[i]), "; pass --rank and --world-size to say which part of the "
               "job this process runs");
    }
  }

  Partition p;
  std::string rank_from;
  std::string world_from;
  std::optional<int64_t> rank;
  std::optional<int64_t> world;
  if (flag_rank) {
    rank = flag_rank;
    rank_from = "--rank";
  } else if (!sources.empty()) {
    rank = sources[0].rank;
    rank_from = sources[0].rank_name;
  }
  if (flag_world) {
    world = flag_world;
    world_from = "--world-size";
  } else {
    for (const auto& s : sources) {
      if (s.world && !world) {
        world = s.world;
        world_from = s.names;
      }
    }
    if (flags.config_world_size > 0) {
      PC_CHECK(!world || *world == flags.config_world_size, ConfigError, "run.world_size = ",
               flags.config_world_size, " disagrees with the environment's ", world_from, " (",
               *world, " ranks); remove run.world_size or pass --world-size");
      if (!world) {
        world = flags.config_world_size;
        world_from = "run.world_size";
      }
    }
  }
  // --world-size 1 runs one process over the whole input, whatever the environment says.
  if (flag_world && *flag_world == 1 && !flag_rank) {
    p.source = "--world-size";
    return p;
  }
  if (!rank) {
    PC_CHECK(!world || *world == 1, ConfigError, "a world size of ", *world, " (from ",
             world_from, ") but no rank: pass --rank R (0 to ", *world - 1, "), or run under a "
             "scheduler that sets one (SLURM_ARRAY_TASK_ID, SLURM_PROCID, RANK, "
             "JOB_COMPLETION_INDEX)");
    return p;  // one process, the whole input
  }
  PC_CHECK(world.has_value(), ConfigError, "rank ", *rank, " (from ", rank_from,
           ") but no world size: pass --world-size N (the number of ranks of the job), or set "
           "run.world_size in the config");
  PC_CHECK(*world >= 1, ConfigError, "a world size of 0 (from ", world_from,
           "): a job has at least 1 rank");
  std::string hint;
  if (world_from.rfind("SLURM_ARRAY", 0) == 0) {
    hint = "; array tasks are numbered from 0 (sbatch --array=0-" + std::to_string(*world - 1) +
           "), and a resubmitted task sees only its own count: pass --world-size";
  }
  PC_CHECK(*rank < *world, ConfigError, "rank ", *rank, " (from ", rank_from,
           ") is not below the world size ", *world, " (from ", world_from,
           "); ranks run from 0 to world size - 1", hint);
  p.rank = *rank;
  p.world_size = *world;
  const bool one_source = !flag_rank && !sources.empty() && world_from == sources[0].names;
  p.source = one_source ? world_from : rank_from + " and " + world_from;
  return p;
}

// Note [Splitting a job into ranks]
// The input's S = ceil(total / shard_size) shard slots are split into world_size runs of
// consecutive slots, rank r taking [floor(r * S / W), floor((r + 1) * S / W)): sizes differ by at
// most one shard, and a rank's part depends on the input's length and shard_size alone, so a
// rank rerun alone (after a crash, on another node) does exactly its own part again. With more
// ranks than shards some ranks get none and exit 0 at once.
RankSpan rank_span(int64_t total_samples, int64_t shard_size, int64_t rank, int64_t world_size) {
  PC_ASSERT(total_samples >= 0 && shard_size >= 1 && world_size >= 1 && rank >= 0 &&
                rank < world_size,
            "bad rank span: ", total_samples, " samples, shards of ", shard_size, ", rank ", rank,
            " of ", world_size);
  const int64_t shards = (total_samples + shard_size - 1) / shard_size;
  // shards < 2^63 / 1e9 and world_size <= 1e5: the products stay far below int64's range.
  RankSpan span;
  span.first_shard = rank * shards / world_size;
  span.end_shard = (rank + 1) * shards / world_size;
  span.first_seq = std::min(total_samples, span.first_shard * shard_size);
  span.end_seq = std::min(total_samples, span.end_shard * shard_size);
  return span;
}

}  // namespace precompute
