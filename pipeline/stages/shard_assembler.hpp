#pragma once
// The writer stage. It gathers each sample's parts (its outline from the batch router, then one
// embedding or failure per expected modality, in any order), and once every sample of a shard's
// range is complete, hands the shard to the ShardCommitter (Note [Nothing is lost] in
// shard_assembler.cpp). Not thread-safe: it runs in the graph's one serial writer node.

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "pipeline/stages/stage_messages.hpp"
#include "pipeline/stages/shard_committer.hpp"
#include "pipeline/stages/shard_plan.hpp"

namespace precompute {

struct RunStats;

class ShardAssembler {
 public:
  // The identity of the input samples of a range (ShardContents::input_sha256).
  using RangeIdentity = std::function<std::string(int64_t first_seq, int64_t seq_count)>;
  // The kept columns' values of the input sample at a position (ShardSample::columns).
  using SampleColumns = std::function<std::vector<std::string>(int64_t seq)>;

  // Each range of `plan` becomes one shard, handed to `committer` once complete, with the
  // identity of its input when `range_identity` is given, and every sample's kept columns from
  // `columns` when given (preloaded samples too). `plan` must outlive the assembler.
  ShardAssembler(ShardCommitter& committer, const ShardPlan& plan, RunStats& stats,
                 RangeIdentity range_identity = {}, SampleColumns columns = {});

  // Each returns the number of samples the message completed (the in-flight limit is lowered by
  // that much).
  // An encoded batch's embeddings are moved out of it: the message must not be used again.
  int64_t add(const WriterMessage& message);
  int64_t add_outline(SampleOutline outline);
  int64_t add_batch(EncodedBatch batch);

  // Starts a shard with samples kept from its earlier version (--retry-failed redoes only the
  // failed samples of a committed shard); the run then supplies the rest of its range.
  void preload(ShardContents kept);

  // Samples received but not yet handed to the committer.
  size_t samples_held() const;

 private:
  struct PendingSample {
    std::string id;
    bool outlined = false;
    std::array<bool, kNumModalities> expected{};
    std::array<bool, kNumModalities> received{};
    std::array<std::optional<SampleEmbedding>, kNumModalities> embeddings;
    std::vector<FailureRecord> failures;
  };
  struct OpenShard {
    int64_t completed = 0;
    ShardContents contents;
  };

  PendingSample& pending(int64_t seq);
  // Moves a sample into its shard once all its parts are in; returns 1 if it did.
  int64_t complete_if_ready(int64_t seq);
  void submit_shard(int64_t shard_index);

  ShardCommitter* committer_;
  const ShardPlan* plan_;
  RunStats* stats_;
  RangeIdentity range_identity_;
  SampleColumns columns_;
  std::unordered_map<int64_t, PendingSample> pending_;
  std::map<int64_t, OpenShard> open_shards_;
};

}  // namespace precompute
