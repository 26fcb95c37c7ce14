// Where a rank and world size come from (flags, SLURM, torchrun, Kubernetes, the config), every
// refusal, and the split of the input into rank spans.

#include "pipeline/core/partition.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

using Env = std::map<std::string, std::string>;

GetEnv env_of(const Env& env) {
  return [env](const char* name) -> std::optional<std::string> {
    const auto it = env.find(name);
    if (it == env.end()) return std::nullopt;
    return it->second;
  };
}

Partition resolve(const Env& env, std::optional<std::string> rank = std::nullopt,
                  std::optional<std::string> world = std::nullopt, int64_t config_world = 0) {
  return resolve_partition({std::move(rank), std::move(world), config_world}, env_of(env));
}

// The message of the ConfigError `f` throws; fails the test when it throws none.
template <typename F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no ConfigError";
  return "";
}

TEST(Partition, NothingMeansOneProcess) {
  const auto p = resolve({});
  EXPECT_FALSE(p.split());
  EXPECT_EQ(p.world_size, 1);
  EXPECT_TRUE(p.source.empty());
  // A SLURM batch job that is not an array: one task of one.
  EXPECT_FALSE(resolve({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).split());
  EXPECT_FALSE(resolve({{"RANK", "0"}, {"WORLD_SIZE", "1"}}).split());
}

TEST(Partition, FlagsBeatTheEnvironment) {
  const auto p = resolve({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "8"}}, "2",
                         "4");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.source, "--rank and --world-size");
}

TEST(Partition, SlurmArray) {
  auto p = resolve({{"SLURM_ARRAY_TASK_ID", "3"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                    {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}});
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.source, "SLURM_ARRAY_TASK_ID and SLURM_ARRAY_TASK_COUNT");
  p = resolve({{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_MIN", "0"},
               {"SLURM_ARRAY_TASK_MAX", "5"}, {"SLURM_ARRAY_TASK_STEP", "1"}});
  EXPECT_EQ(p.world_size, 6);
  // A resubmitted task sees a count of 1: --world-size gives the real one.
  const Env resubmitted = {{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_COUNT", "1"},
                           {"SLURM_ARRAY_TASK_MIN", "2"}, {"SLURM_ARRAY_TASK_MAX", "2"}};
  EXPECT_NE(refusal([&] { resolve(resubmitted); }).find("pass --world-size"), std::string::npos);
  p = resolve(resubmitted, std::nullopt, "4");
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.world_size, 4);
  EXPECT_EQ(p.source, "SLURM_ARRAY_TASK_ID and --world-size");
  // Arrays count from 0, step 1.
  EXPECT_NE(refusal([&] {
              resolve({{"SLURM_ARRAY_TASK_ID", "4"}, {"SLURM_ARRAY_TASK_COUNT", "4"}});
            }).find("--array=0-3"),
            std::string::npos);
  EXPECT_NE(refusal([&] {
              resolve({{"SLURM_ARRAY_TASK_ID", "2"}, {"SLURM_ARRAY_TASK_STEP", "2"}});
            }).find("SLURM_ARRAY_TASK_STEP"),
            std::string::npos);
}

TEST(Partition, SrunTorchrunAndKubernetes) {
  auto p = resolve({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}});
  EXPECT_EQ(p.rank, 5);
  EXPECT_EQ(p.world_size, 8);
  p = resolve({{"RANK", "1"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(p.source, "RANK and WORLD_SIZE");
  // Kubernetes gives no count: from the flag or the config.
  EXPECT_NE(refusal([&] { resolve({{"JOB_COMPLETION_INDEX", "3"}}); }).find("--world-size"),
            std::string::npos);
  p = resolve({{"JOB_COMPLETION_INDEX", "3"}}, std::nullopt, std::nullopt, 6);
  EXPECT_EQ(p.rank, 3);
  EXPECT_EQ(p.world_size, 6);
  EXPECT_EQ(p.source, "JOB_COMPLETION_INDEX and run.world_size");
  p = resolve({{"JOB_COMPLETION_INDEX", "3"}}, std::nullopt, "5", 6);
  EXPECT_EQ(p.world_size, 5);
}

TEST(Partition, DisagreeingSourcesAreRefused) {
  const Env both = {{"SLURM_ARRAY_TASK_ID", "1"}, {"SLURM_ARRAY_TASK_COUNT", "4"},
                    {"RANK", "3"}, {"WORLD_SIZE", "8"}};
  const auto message = refusal([&] { resolve(both); });
  EXPECT_NE(message.find("SLURM_ARRAY_TASK_ID"), std::string::npos) << message;
  EXPECT_NE(message.find("RANK and WORLD_SIZE"), std::string::npos) << message;
  EXPECT_EQ(resolve(both, "1", "4").rank, 1);
  // Agreeing sources are fine.
  EXPECT_EQ(resolve({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"RANK", "1"},
                     {"WORLD_SIZE", "2"}})
                .rank,
            1);
  EXPECT_NE(refusal([&] {
              resolve({{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}}, std::nullopt, std::nullopt,
                      4);
            }).find("run.world_size"),
            std::string::npos);
}

TEST(Partition, BadValuesAreRefused) {
  for (const char* bad : {"abc", "1e3", " 1", "0x2", "", "1.5"}) {
    EXPECT_NE(refusal([&] { resolve({}, bad, "4"); }).find("--rank"), std::string::npos) << bad;
    EXPECT_NE(refusal([&] { resolve({{"RANK", bad}, {"WORLD_SIZE", "4"}}); }).find("RANK"),
              std::string::npos)
        << bad;
  }
  EXPECT_NE(refusal([&] { resolve({}, "-1", "4"); }).find("negative"), std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, "0", "0"); }).find("at least 1"), std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, "4", "4"); }).find("not below"), std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, "0", "99999999999999999999999"); }).find("too large"),
            std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, "0", "100001"); }).find("too large"), std::string::npos);
  EXPECT_NE(refusal([&] { resolve({{"SLURM_ARRAY_TASK_ID", "-3"}}); }).find("negative"),
            std::string::npos);
  EXPECT_NE(refusal([&] { resolve({{"SLURM_NTASKS", "x"}, {"SLURM_PROCID", "0"}}); })
                .find("SLURM_NTASKS"),
            std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, "2"); }).find("no world size"), std::string::npos);
  EXPECT_NE(refusal([&] { resolve({}, std::nullopt, "4"); }).find("no rank"), std::string::npos);
  EXPECT_EQ(resolve({}, std::nullopt, "1").world_size, 1);
  EXPECT_EQ(resolve({}, "99999", "100000").rank, 99999);
}

TEST(Partition, SpansCoverTheInputOnceInOrder) {
  for (int64_t total : {0, 1, 7, 8, 9, 100, 1001}) {
    for (int64_t size : {1, 3, 8, 1024}) {
      for (int64_t world : {1, 2, 3, 4, 7, 64}) {
        int64_t at = 0;
        int64_t shard = 0;
        int64_t smallest = INT64_MAX, largest = 0;
        for (int64_t r = 0; r < world; ++r) {
          const auto s = rank_span(total, size, r, world);
          EXPECT_EQ(s.first_seq, at);
          EXPECT_EQ(s.first_shard, shard);
          EXPECT_EQ(s.first_seq, std::min(total, s.first_shard * size));
          at = s.end_seq;
          shard = s.end_shard;
          smallest = std::min(smallest, s.end_shard - s.first_shard);
          largest = std::max(largest, s.end_shard - s.first_shard);
        }
        EXPECT_EQ(at, total);
        EXPECT_EQ(shard, (total + size - 1) / size);
        EXPECT_LE(largest - smallest, 1);  // balanced by shards
      }
    }
  }
  // More ranks than shards: some have no work.
  EXPECT_TRUE(rank_span(10, 8, 0, 4).empty());
  EXPECT_EQ(rank_span(10, 8, 1, 4).samples(), 8);
  EXPECT_EQ(rank_span(10, 8, 3, 4).samples(), 2);
  // Large inputs do not overflow.
  const auto s = rank_span(int64_t{1} << 40, 1, 99999, 100000);
  EXPECT_EQ(s.end_seq, int64_t{1} << 40);
}

}  // namespace
}  // namespace precompute
