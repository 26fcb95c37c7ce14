#include "pipeline/resume.hpp"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <nlohmann/json.hpp>
#include <set>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/shard_reader.hpp"

namespace precompute {

// Note [What a resume redoes]
// Committed shards (listed in index.json with a hash that still matches, see
// Note [Resuming from the output folder]) are kept as they are; every other input position is
// planned into shards again (Note [Shard ranges]). Because batches close at shard boundaries and
// are cut in input order, the redone shards hold the same bits an uninterrupted run would have
// written on the same device. A resume must compute the same thing as the earlier run: the
// config fingerprint (encoders' hashes, preprocessing, pooling, storage dtype) must match, and
// the input must be the earlier input, possibly with samples appended; anything else is refused
// with what changed, and --overwrite starts over. --retry-failed also redoes every sample that
// has a failure record: its shard is rebuilt from the kept samples plus the redone ones, written
// under a new number, and the old file is deleted once the index lists the new one.

namespace {

using Json = nlohmann::json;

// A whole file is its path, so that a manifest's identity is what it was before tar members
// existed; a member adds its name and byte range, so a tar rewritten with other bytes for the
// same key reads as another input.
std::string media_identity(const MediaSource& source) {
  if (!source.is_member()) return source.file.string();
  return source.file.string() + "\n" + source.member + "\n" + std::to_string(source.offset) +
         "+" + std::to_string(source.size) + "\n" + source.refusal;
}

void flatten(const Json& value, const std::string& path, std::vector<std::string>& paths) {
  if (value.is_object() && !value.empty()) {
    for (const auto& [key, child] : value.items()) {
      flatten(child, path.empty() ? key : path + "." + key, paths);
    }
  } else {
    paths.push_back(path);
  }
}

Json at_path(const Json& root, const std::string& path) {
  const Json* node = &root;
  size_t start = 0;
  while (start <= path.size()) {
    const size_t dot = path.find('.', start);
    const std::string key = path.substr(start, dot == std::string::npos ? dot : dot - start);
    if (!node->is_object() || !node->contains(key)) return Json();
    node = &(*node)[key];
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  return *node;
}

std::string short_hash(const std::string& hex) { return hex.substr(0, 12); }

}  // namespace

std::string input_identity(const std::vector<SampleSpec>& samples, size_t count) {
  PC_ASSERT(count <= samples.size(), "input identity of ", count, " samples of ",
            samples.size());
  return input_identity(samples, 0, static_cast<int64_t>(count));
}

std::string input_identity(const std::vector<SampleSpec>& samples, int64_t first,
                           int64_t count) {
  if (first < 0 || count < 0 || first + count > static_cast<int64_t>(samples.size())) return "";
  Sha256 hash;
  const auto field = [&](const std::string& text) {
    hash.update(std::to_string(text.size()));
    hash.update(":");
    hash.update(text);
  };
  for (int64_t i = first; i < first + count; ++i) {
    const auto& s = samples[static_cast<size_t>(i)];
    field(s.id);
    field(s.video ? "v" + media_identity(*s.video) : std::string());
    field(s.audio ? "a" + media_identity(*s.audio) : std::string());
    field(s.text ? "t" + *s.text : std::string());
    // Kept columns' values (Note [Kept columns]); none without output.keep_columns, so the
    // identity of an input without them is what it was before they existed.
    for (const auto& value : s.columns) field("c" + value);
  }
  return hash.hex_digest();
}

void check_same_settings(const ShardMeta& previous, const ShardMeta& current,
                         const std::string& current_semantic_json,
                         const std::filesystem::path& output) {
  if (previous.config_fingerprint == current.config_fingerprint) return;
  std::vector<std::string> changes;
  for (Modality m : kAllModalities) {
    const auto& before = previous.modalities[modality_index(m)];
    const auto& now = current.modalities[modality_index(m)];
    const std::string name(modality_name(m));
    if (before.has_value() != now.has_value()) {
      changes.push_back(name + (now ? " is embedded now, not before" : " was embedded before"));
    } else if (before && before->encoder_sha256 != now->encoder_sha256) {
      changes.push_back(name + " encoder " + now->encoder + " (sha256 " +
                        short_hash(before->encoder_sha256) + "... before, " +
                        short_hash(now->encoder_sha256) + "... now)");
    } else if (before && before->preprocessing_json != now->preprocessing_json) {
      changes.push_back(name + " preprocessing (" + before->preprocessing_json + " before, " +
                        now->preprocessing_json + " now)");
    }
  }
  const Json now = Json::parse(current_semantic_json);
  const Json before = Json::parse(previous.config_json.empty() ? "{}" : previous.config_json,
                                  nullptr, /*allow_exceptions=*/false);
  std::vector<std::string> paths;
  flatten(now, "", paths);
  for (const auto& path : paths) {
    const Json old_value = before.is_discarded() ? Json() : at_path(before, path);
    const Json new_value = at_path(now, path);
    if (old_value != new_value) {
      changes.push_back(path + ": " + old_value.dump() + " before, " + new_value.dump() + " now");
    }
  }
  std::string listed;
  for (const auto& c : changes) listed += "\n  - " + c;
  if (changes.empty()) listed = " (the settings fingerprint differs)";
  PC_THROW(ConfigError, "output folder ", output,
           " holds a run made with other settings; what changed:", listed,
           "\nRerun with the earlier settings to resume it, pass --overwrite to start over, or "
           "choose another --output");
}

void check_same_input(const OutputIndex& previous, const std::vector<SampleSpec>& samples,
                      const std::shared_future<std::string>& whole_identity,
                      const std::vector<std::string>& keep_columns,
                      const std::filesystem::path& output) {
  // The kept columns' values are part of the input's identity: another list would read as an
  // edited input below, so it is named for what it is first.
  if (previous.meta.kept_columns != keep_columns) {
    const auto listed = [](const std::vector<std::string>& names) { return Json(names).dump(); };
    PC_THROW(ConfigError, "output folder ", output,
             " holds a run made with other settings; what changed:\n  - output.keep_columns: ",
             listed(previous.meta.kept_columns), " before, ", listed(keep_columns),
             " now\nRerun with the earlier settings to resume it, pass --overwrite to start "
             "over, or choose another --output");
  }
  if (previous.input_samples < 0) return;  // rebuilt index: ids were checked shard by shard
  const auto before = static_cast<size_t>(previous.input_samples);
  PC_CHECK(samples.size() >= before, ConfigError, "output folder ", output, " holds a run over ",
           before, " samples, but the input now has ", samples.size(),
           "; samples may only be appended between runs. Use the earlier input to resume, "
           "--overwrite to start over, or another --output");
  const std::string identity = before == samples.size() && whole_identity.valid()
                                   ? whole_identity.get()
                                   : input_identity(samples, before);
  PC_CHECK(identity == previous.input_sha256, ConfigError,
           "the input changed since the run in ", output, ": its first ", before,
           " samples (ids, paths, texts or kept columns' values) are not the ones processed "
           "before; samples may "
           "only be appended. Use the earlier input to resume, --overwrite to start over, or "
           "another --output");
  if (samples.size() > before) {
    spdlog::info("the input grew from {} to {} samples since the earlier run; the new ones are "
                 "added", before, samples.size());
  }
}

RunPlan plan_run(const std::vector<SampleSpec>& samples, const OutputIndex& index,
                 int64_t shard_size, bool retry_failed, const std::filesystem::path& output,
                 int64_t begin, int64_t end) {
  RunPlan run;
  const auto total = end < 0 ? static_cast<int64_t>(samples.size()) : end;
  std::vector<ShardRange> committed;
  std::vector<const IndexEntry*> redo;
  for (const auto& e : index.shards) {
    if (retry_failed && e.num_failures > 0) {
      redo.push_back(&e);
    } else {
      committed.push_back({e.shard_index, e.first_seq, e.seq_count});
      run.committed_samples += e.seq_count;
    }
  }
  const ShardPlan fresh = ShardPlan::cover(total, shard_size, [&] {
    auto all = committed;
    for (const auto* e : redo) all.push_back({e->shard_index, e->first_seq, e->seq_count});
    return all;
  }(), begin);

  // A redone shard is written under a new number, so that the committed file it replaces stays
  // intact until the index that lists its replacement is in place.
  int64_t next_index = 0;
  for (const auto& e : index.shards) next_index = std::max(next_index, e.shard_index + 1);
  for (const auto& r : fresh.ranges()) next_index = std::max(next_index, r.shard_index + 1);

  std::vector<ShardRange> ranges = fresh.ranges();
  std::vector<int64_t> last_processed(ranges.size());
  for (size_t i = 0; i < ranges.size(); ++i) last_processed[i] = ranges[i].end_seq() - 1;
  std::vector<int64_t> positions;  // every position this run processes
  for (const auto* e : redo) {
    const auto file = output / e->file;
    ShardFile shard = read_shard(file);
    std::set<int64_t> failed;
    for (const auto& f : shard.contents.failures) failed.insert(f.seq);
    const int64_t new_index = next_index++;
    ShardContents kept;
    kept.shard_index = new_index;
    kept.first_seq = e->first_seq;
    kept.seq_count = e->seq_count;
    for (auto& s : shard.contents.samples) {
      if (failed.count(s.seq) == 0) kept.samples.push_back(std::move(s));
    }
    PC_ASSERT(!failed.empty(), "shard ", e->file, " records failures but holds none");
    spdlog::info("--retry-failed: redoing {} failed sample(s) of {}", failed.size(), e->file);
    ranges.push_back({new_index, e->first_seq, e->seq_count});
    last_processed.push_back(*failed.rbegin());
    positions.insert(positions.end(), failed.begin(), failed.end());
    run.kept.push_back(std::move(kept));
  }
  // Ascending ranges, their last positions alongside.
  std::vector<size_t> order(ranges.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(),
            [&](size_t a, size_t b) { return ranges[a].first_seq < ranges[b].first_seq; });
  std::vector<ShardRange> sorted_ranges;
  std::vector<int64_t> sorted_last;
  for (size_t i : order) {
    sorted_ranges.push_back(ranges[i]);
    sorted_last.push_back(last_processed[i]);
  }
  for (const auto& r : fresh.ranges()) {
    for (int64_t seq = r.first_seq; seq < r.end_seq(); ++seq) positions.push_back(seq);
  }
  std::sort(positions.begin(), positions.end());
  run.positions = std::move(positions);
  run.shards = ShardPlan(std::move(sorted_ranges), std::move(sorted_last));
  return run;
}

}  // namespace precompute
