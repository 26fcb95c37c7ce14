#pragma once
// Resuming into an output folder that holds an earlier run: whether it may be resumed (same
// settings and models, same input or one that only grew), and what is left to do
// (Note [What a resume redoes] in resume.cpp).

#include <cstdint>
#include <filesystem>
#include <future>
#include <string>
#include <vector>

#include "pipeline/core/sample.hpp"
#include "pipeline/stages/shard_plan.hpp"
#include "storage/output_index.hpp"
#include "storage/shard_contents.hpp"

namespace precompute {

// SHA-256 over the first `count` samples of the input: ids, paths, texts and kept columns'
// values, in order.
std::string input_identity(const std::vector<SampleSpec>& samples, size_t count);
// The same over the samples [first, first + count), stored in each shard; "" when the range
// reaches past the input.
std::string input_identity(const std::vector<SampleSpec>& samples, int64_t first, int64_t count);

// Throws ConfigError listing what changed (settings, encoder files) when `previous` was made
// with other settings than `current`; `current_semantic_json` is semantic_config_json() of
// this run.
void check_same_settings(const ShardMeta& previous, const ShardMeta& current,
                         const std::string& current_semantic_json,
                         const std::filesystem::path& output);

// Throws ConfigError when the input is not the earlier run's input, or that input with samples
// appended. Logs what grew.
// Also refuses another output.keep_columns (`keep_columns`) than the earlier run's.
// `whole_identity`: input_identity() of all of `samples`, on its way on another thread; taken
// instead of hashing them again when the input has not grown.
void check_same_input(const OutputIndex& previous, const std::vector<SampleSpec>& samples,
                      const std::shared_future<std::string>& whole_identity,
                      const std::vector<std::string>& keep_columns,
                      const std::filesystem::path& output);

struct RunPlan {
  ShardPlan shards{std::vector<ShardRange>{}};
  std::vector<int64_t> positions;    // input positions (seq) to process, ascending; the
                                     // samples themselves stay in the input, held once
  std::vector<ShardContents> kept;   // --retry-failed: the good samples of each redone shard
  int64_t committed_samples = 0;     // input positions already in committed shards, kept as is
};

// What this run does, given the shards committed so far (`index.shards`), over the input
// positions [begin, end) (a rank's span; end < 0: the whole input).
// `retry_failed` redoes the samples with failure records (reading their shards back).
RunPlan plan_run(const std::vector<SampleSpec>& samples, const OutputIndex& index,
                 int64_t shard_size, bool retry_failed, const std::filesystem::path& output,
                 int64_t begin = 0, int64_t end = -1);

}  // namespace precompute
