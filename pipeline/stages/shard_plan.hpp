#pragma once
// Which shards a run writes: the input's sample ranges that no committed shard covers yet, cut
// into shards (Note [Shard ranges] in shard_plan.cpp). The batch router closes batches at the
// end of each range and the assembler collects each range into one shard. Immutable once made,
// so every stage may read it from any thread.

#include <cstdint>
#include <vector>

namespace precompute {

// Input positions [first_seq, first_seq + seq_count), stored as shard `shard_index`.
struct ShardRange {
  int64_t shard_index = 0;
  int64_t first_seq = 0;
  int64_t seq_count = 0;

  int64_t end_seq() const { return first_seq + seq_count; }
  bool operator==(const ShardRange&) const = default;
};

class ShardPlan {
 public:
  // Covers [begin, total_samples) minus `committed` (disjoint ranges, any order, none before
  // `begin`), cut at multiples of `shard_size`. A clean run gets shard k = positions
  // [k*size, (k+1)*size); a rank of a split job covers its span [begin, end) the same way.
  static ShardPlan cover(int64_t total_samples, int64_t shard_size,
                         const std::vector<ShardRange>& committed, int64_t begin = 0);
  // Exactly these ranges (ascending, disjoint). Every position of a range is processed unless
  // `last_processed` gives, per range, the last position the run processes in it (shards
  // redone by --retry-failed process only their failed samples).
  explicit ShardPlan(std::vector<ShardRange> ranges, std::vector<int64_t> last_processed = {});

  const std::vector<ShardRange>& ranges() const { return ranges_; }
  // The range holding `seq`; a bug (InternalError) when no planned range does.
  const ShardRange& range_of(int64_t seq) const;
  // True for the last position of its range that the run processes: its batches close there.
  bool closes_range(int64_t seq) const;
  // Positions in all ranges together.
  int64_t samples() const { return samples_; }

 private:
  std::vector<ShardRange> ranges_;
  std::vector<int64_t> last_processed_;
  int64_t samples_ = 0;
};

}  // namespace precompute
