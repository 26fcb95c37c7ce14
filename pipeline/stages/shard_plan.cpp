#include "pipeline/stages/shard_plan.hpp"

#include <algorithm>
#include <set>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Shard ranges]
// A shard covers a fixed range of input positions, chosen before any sample is decoded, so a
// rerun cuts the same shards whatever finished first (Note [Deterministic batches]). The plan
// cuts every gap between committed ranges at multiples of shard_size: an interrupted clean run
// resumes with exactly the shards it would have written, and an input that grew adds a short
// shard that completes the old last one's slot, then whole ones. A piece aligned on a multiple
// k*shard_size is shard k unless that number is taken; any other piece gets the next number
// above every used one, so numbers stay unique and a rerun picks the same ones.

ShardPlan ShardPlan::cover(int64_t total, int64_t shard_size,
                           const std::vector<ShardRange>& committed, int64_t begin) {
  PC_ASSERT(total >= 0 && shard_size >= 1 && begin >= 0 && begin <= total, "bad shard plan: ",
            total, " samples from ", begin, ", shards of ", shard_size);
  auto done = committed;
  std::sort(done.begin(), done.end(),
            [](const ShardRange& a, const ShardRange& b) { return a.first_seq < b.first_seq; });
  std::set<int64_t> used;
  for (const auto& r : done) used.insert(r.shard_index);

  // The gaps, each cut at multiples of shard_size.
  std::vector<ShardRange> pieces;
  int64_t at = begin;
  const auto cut = [&](int64_t begin, int64_t end) {
    while (begin < end) {
      const int64_t next_boundary = (begin / shard_size + 1) * shard_size;
      const int64_t stop = std::min(end, next_boundary);
      pieces.push_back({-1, begin, stop - begin});
      begin = stop;
    }
  };
  for (const auto& r : done) {
    PC_ASSERT(r.first_seq >= at, "committed shard ranges overlap at position ", r.first_seq);
    cut(at, std::min(r.first_seq, total));
    at = std::max(at, r.end_seq());
  }
  cut(at, total);

  // Aligned whole-slot numbers first, so that they do not depend on the unaligned pieces.
  int64_t next_free = (total + shard_size - 1) / shard_size;
  if (!used.empty()) next_free = std::max(next_free, *used.rbegin() + 1);
  for (auto& p : pieces) {
    const int64_t slot = p.first_seq / shard_size;
    if (p.first_seq % shard_size == 0 && used.insert(slot).second) p.shard_index = slot;
  }
  for (auto& p : pieces) {
    if (p.shard_index >= 0) continue;
    while (used.count(next_free) != 0) ++next_free;
    p.shard_index = next_free;
    used.insert(next_free);
  }
  return ShardPlan(std::move(pieces));
}

ShardPlan::ShardPlan(std::vector<ShardRange> ranges, std::vector<int64_t> last_processed)
    : ranges_(std::move(ranges)), last_processed_(std::move(last_processed)) {
  if (last_processed_.empty()) {
    for (const auto& r : ranges_) last_processed_.push_back(r.end_seq() - 1);
  }
  PC_ASSERT(last_processed_.size() == ranges_.size(), "shard plan: ", last_processed_.size(),
            " last positions for ", ranges_.size(), " ranges");
  for (size_t i = 0; i < ranges_.size(); ++i) {
    PC_ASSERT(last_processed_[i] >= ranges_[i].first_seq &&
                  last_processed_[i] < ranges_[i].end_seq(),
              "shard plan: last position outside its range");
    PC_ASSERT(ranges_[i].seq_count >= 1, "empty shard range");
    PC_ASSERT(i == 0 || ranges_[i].first_seq >= ranges_[i - 1].end_seq(),
              "shard ranges out of order at ", ranges_[i].first_seq);
    samples_ += ranges_[i].seq_count;
  }
}

namespace {

// Index of the range holding `seq`, or -1.
template <class Ranges>
int64_t find_range(const Ranges& ranges, int64_t seq) {
  const auto it = std::upper_bound(
      ranges.begin(), ranges.end(), seq,
      [](int64_t s, const ShardRange& r) { return s < r.first_seq; });
  if (it == ranges.begin() || seq >= std::prev(it)->end_seq()) return -1;
  return std::prev(it) - ranges.begin();
}

}  // namespace

const ShardRange& ShardPlan::range_of(int64_t seq) const {
  const int64_t i = find_range(ranges_, seq);
  PC_ASSERT(i >= 0, "position ", seq, " is in no planned shard");
  return ranges_[static_cast<size_t>(i)];
}

bool ShardPlan::closes_range(int64_t seq) const {
  const int64_t i = find_range(ranges_, seq);
  PC_ASSERT(i >= 0, "position ", seq, " is in no planned shard");
  return last_processed_[static_cast<size_t>(i)] == seq;
}

}  // namespace precompute
