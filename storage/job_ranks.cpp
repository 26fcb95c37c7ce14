#include "storage/job_ranks.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <system_error>

#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/atomic_file.hpp"
#include "storage/dataset_view.hpp"
#include "storage/output_folder.hpp"

namespace precompute {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;

std::string iso_time(double unix_seconds) {
  if (unix_seconds <= 0) return "";
  const auto t = static_cast<time_t>(unix_seconds);
  tm utc{};
  gmtime_r(&t, &utc);
  char buffer[32];
  std::strftime(buffer, sizeof(buffer), "%Y-%m-%dT%H:%M:%SZ", &utc);
  return buffer;
}

Json span_json(const RankSpan& s) {
  return {{"first_shard", s.first_shard}, {"end_shard", s.end_shard},
          {"first_seq", s.first_seq},     {"end_seq", s.end_seq}};
}

bool pid_alive(int64_t pid) {
  if (pid <= 0) return false;
  return ::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM;
}

void fsync_folder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  PC_CHECK(fd >= 0, StorageError, "cannot open ", dir, " to sync it: ",
           std::generic_category().message(errno));
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  PC_CHECK(rc == 0, StorageError, "cannot sync folder ", dir, ": ",
           std::generic_category().message(error));
}

// Puts rank shard `from` at `to` (in OUT): a hard link, so nothing is copied and the bytes are
// the rank's own; a copy where the file system has no hard links. Through a temporary name and
// a rename, so `to` is the old file or the new one, never a partial one.
void place_shard(const fs::path& from, const fs::path& to) {
  struct stat a{};
  struct stat b{};
  if (::stat(from.c_str(), &a) == 0 && ::stat(to.c_str(), &b) == 0 && a.st_dev == b.st_dev &&
      a.st_ino == b.st_ino) {
    return;  // linked by an earlier merge
  }
  const fs::path temp = to.parent_path() / (std::string(kTempFilePrefix) +
                                            to.filename().string() + ".merge." +
                                            std::to_string(::getpid()));
  std::error_code ignored;
  fs::remove(temp, ignored);
  if (::link(from.c_str(), temp.c_str()) != 0) {
    const int error = errno;
    PC_CHECK(error == EXDEV || error == EPERM || error == EMLINK || error == ENOTSUP ||
                 error == ENOSYS,
             StorageError, "cannot link ", from, " to ", temp, ": ",
             std::generic_category().message(error));
    std::error_code ec;
    fs::copy_file(from, temp, fs::copy_options::overwrite_existing, ec);
    PC_CHECK(!ec, StorageError, "cannot copy ", from, " to ", temp, ": ", ec.message());
    const int fd = ::open(temp.c_str(), O_RDONLY | O_CLOEXEC);
    const bool synced = fd >= 0 && ::fsync(fd) == 0;
    if (fd >= 0) ::close(fd);
    PC_CHECK(synced, StorageError, "cannot sync ", temp, ": ",
             std::generic_category().message(errno));
  }
  if (::rename(temp.c_str(), to.c_str()) != 0) {
    const int error = errno;
    fs::remove(temp, ignored);
    PC_THROW(StorageError, "cannot rename ", temp, " to ", to, ": ",
             std::generic_category().message(error));
  }
}

bool same_shards(const OutputIndex& a, const OutputIndex& b) {
  if (a.shards.size() != b.shards.size()) return false;
  for (size_t i = 0; i < a.shards.size(); ++i) {
    const auto& x = a.shards[i];
    const auto& y = b.shards[i];
    if (x.file != y.file || x.first_seq != y.first_seq || x.seq_count != y.seq_count ||
        x.bytes != y.bytes || x.sha256 != y.sha256) {
      return false;
    }
  }
  return a.meta.config_fingerprint == b.meta.config_fingerprint &&
         a.total_samples == b.total_samples && a.input_sha256 == b.input_sha256 &&
         a.input_samples == b.input_samples;
}

// Positions of [span) covered by the index's shards, and whether they cover it exactly
// (contiguous, nothing outside).
std::pair<int64_t, bool> coverage(const OutputIndex& index, const RankSpan& span) {
  int64_t done = 0;
  int64_t at = span.first_seq;
  bool exact = true;
  for (const auto& e : index.shards) {  // ascending first_seq
    const int64_t lo = std::max(e.first_seq, span.first_seq);
    const int64_t hi = std::min(e.first_seq + e.seq_count, span.end_seq);
    if (hi > lo) done += hi - lo;
    if (e.first_seq != at || e.first_seq + e.seq_count > span.end_seq) exact = false;
    at = e.first_seq + e.seq_count;
  }
  return {done, exact && at == span.end_seq};
}

}  // namespace

fs::path rank_folder(const fs::path& output, int64_t rank, int64_t world_size) {
  char name[64];
  std::snprintf(name, sizeof(name), "rank-%05lld-of-%05lld", static_cast<long long>(rank),
                static_cast<long long>(world_size));
  return output / kRanksFolderName / name;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string host_name() {
  char buffer[256] = {};
  if (::gethostname(buffer, sizeof(buffer) - 1) != 0) return "unknown";
  return buffer;
}

void write_rank_record(const fs::path& folder, const RankRecord& r) {
  Json j = {{"format", "precompute-rank"},
            {"rank", r.rank},
            {"world_size", r.world_size},
            {"total_samples", r.total_samples},
            {"shard_size", r.shard_size},
            {"span", span_json(r.span)},
            {"state", r.state},
            {"pid", r.pid},
            {"host", r.host},
            {"config", r.config},
            {"started", iso_time(r.started)},
            {"finished", iso_time(r.finished)},
            {"started_unix", r.started},
            {"finished_unix", r.finished},
            {"attempts", r.attempts},
            {"processed", r.processed},
            {"seconds", r.seconds},
            {"message", r.message}};
  write_file_atomically(folder / kRankRecordFileName, j.dump(2) + "\n");
}

std::optional<RankRecord> read_rank_record(const fs::path& folder) {
  std::ifstream in(folder / kRankRecordFileName);
  if (!in) return std::nullopt;
  const Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    RankRecord r;
    r.rank = j.at("rank").get<int64_t>();
    r.world_size = j.at("world_size").get<int64_t>();
    r.total_samples = j.at("total_samples").get<int64_t>();
    r.shard_size = j.at("shard_size").get<int64_t>();
    const auto& s = j.at("span");
    r.span = {s.at("first_shard").get<int64_t>(), s.at("end_shard").get<int64_t>(),
              s.at("first_seq").get<int64_t>(), s.at("end_seq").get<int64_t>()};
    r.state = j.at("state").get<std::string>();
    r.pid = j.at("pid").get<int64_t>();
    r.host = j.at("host").get<std::string>();
    r.config = j.at("config").get<std::string>();
    r.started = j.at("started_unix").get<double>();
    r.finished = j.at("finished_unix").get<double>();
    r.attempts = j.at("attempts").get<int64_t>();
    r.processed = j.at("processed").get<int64_t>();
    r.seconds = j.at("seconds").get<double>();
    r.message = j.at("message").get<std::string>();
    return r;
  } catch (const nlohmann::json::exception&) {
    return std::nullopt;
  }
}

std::string_view rank_state_name(RankState::Kind kind) {
  switch (kind) {
    case RankState::Kind::kNotStarted: return "not started";
    case RankState::Kind::kRunning: return "running";
    case RankState::Kind::kStopped: return "stopped";
    case RankState::Kind::kFailed: return "failed";
    case RankState::Kind::kDone: return "done";
  }
  return "unknown";
}

int64_t JobState::done() const {
  int64_t n = 0;
  for (const auto& r : ranks) n += r.done;
  return n;
}

std::string JobState::rerun_command(int64_t rank) const {
  return "precompute run --config " + (config.empty() ? std::string("CONFIG") : config) +
         " --rank " + std::to_string(rank) + " --world-size " + std::to_string(world_size) +
         " (under SLURM: sbatch --array=" + std::to_string(rank) +
         " tools/slurm/precompute.sbatch " + (config.empty() ? std::string("CONFIG") : config) +
         " " + std::to_string(world_size) + ")";
}

JobState read_job(const fs::path& output, std::optional<int64_t> world_size) {
  JobState job;
  job.output = output;
  const fs::path ranks_dir = output / kRanksFolderName;
  static const std::regex kName("rank-([0-9]{5,})-of-([0-9]{5,})");
  std::set<int64_t> worlds;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(ranks_dir, ec)) {
    std::smatch m;
    const std::string name = entry.path().filename().string();
    if (!entry.is_directory() || !std::regex_match(name, m, kName)) continue;
    try {
      worlds.insert(std::stoll(m[2].str()));
    } catch (const std::exception&) {
      // Not one of ours.
    }
  }
  PC_CHECK(!worlds.empty() || world_size.has_value(), ConfigError, output,
           " holds no ranks (no ", ranks_dir, "/rank-*-of-*); run `precompute run --rank R "
           "--world-size N` for each rank first");
  if (world_size) {
    job.world_size = *world_size;
  } else {
    std::string found;
    for (int64_t w : worlds) found += (found.empty() ? "" : ", ") + std::to_string(w);
    PC_CHECK(worlds.size() == 1, ConfigError, output, " holds ranks of jobs of different world "
             "sizes (", found, "); pass --world-size to choose one");
    job.world_size = *worlds.begin();
  }
  PC_CHECK(job.world_size >= 1 && job.world_size <= kMaxWorldSize, ConfigError,
           "--world-size must be 1 to ", kMaxWorldSize);

  // The input's length and shard size: every rank records them.
  std::vector<std::optional<RankRecord>> records(static_cast<size_t>(job.world_size));
  std::vector<std::optional<OutputIndex>> indexes(static_cast<size_t>(job.world_size));
  std::vector<std::string> problems(static_cast<size_t>(job.world_size));
  for (int64_t r = 0; r < job.world_size; ++r) {
    const fs::path folder = rank_folder(output, r, job.world_size);
    if (!fs::exists(folder)) continue;
    records[r] = read_rank_record(folder);
    try {
      indexes[r] = read_index(folder);
    } catch (const StorageError& e) {
      problems[r] = e.what();
    }
    const auto& rec = records[r];
    if (rec && job.total_samples < 0) {
      job.total_samples = rec->total_samples;
      job.shard_size = rec->shard_size;
    }
    if (rec && job.config.empty()) job.config = rec->config;
  }
  for (int64_t r = 0; r < job.world_size; ++r) {
    RankState state;
    state.rank = r;
    state.record = records[r];
    state.index = indexes[r];
    state.problem = problems[r];
    if (job.total_samples >= 0) {
      state.span = rank_span(job.total_samples, job.shard_size, r, job.world_size);
    }
    bool complete = false;
    if (state.index && job.total_samples >= 0) {
      const auto [done, exact] = coverage(*state.index, state.span);
      state.done = done;
      complete = exact;
    }
    // A rank without work is done whether or not it ran.
    const bool no_work = job.total_samples >= 0 && state.span.empty();
    if (no_work) complete = true;
    const auto& rec = state.record;
    if (!rec && !state.index) {
      state.kind = RankState::Kind::kNotStarted;
    } else if (rec && rec->state == "running") {
      const bool here = rec->host == host_name();
      state.kind = here && !pid_alive(rec->pid) ? RankState::Kind::kStopped
                                                : RankState::Kind::kRunning;
      if (state.kind == RankState::Kind::kStopped && complete) state.kind = RankState::Kind::kDone;
    } else if (rec && rec->state == "failed" && !complete) {
      state.kind = RankState::Kind::kFailed;
    } else {
      state.kind = complete ? RankState::Kind::kDone : RankState::Kind::kStopped;
    }
    if (no_work) state.kind = RankState::Kind::kDone;
    job.ranks.push_back(std::move(state));
  }
  // Merged: OUT's index lists exactly the ranks' shards.
  try {
    if (const auto top = read_index(output)) {
      int64_t listed = 0;
      for (const auto& e : top->shards) listed += e.seq_count;
      job.merged = job.total_samples >= 0 && listed == job.total_samples &&
                   top->total_samples == job.total_samples;
    }
  } catch (const StorageError&) {
    job.merged = false;
  }
  return job;
}

// Note [Merging ranks]
// Each rank is a complete, ordinary run over its span of the input, in its own folder. Merging
// makes OUT what one run over the whole input makes: the shards under their own names (a rank
// writes the shard numbers a single run would: k*shard_size is shard k), index.json with the
// same fields (the ranks share the config, the input and its identity), dataset.h5 from that
// index. The shards are hard links to the ranks' files, so nothing is copied and a rank folder
// stays a valid output of its own (a rerun of a finished rank finds everything committed and
// changes nothing). Order: every shard is in place before the index that lists it, as in a
// run's commit protocol, and the index before the view. OUT's lock keeps two merges apart (the
// last two ranks may finish together); a merge that finds OUT already showing the same shards
// writes nothing, so merging again is harmless.
MergeResult merge_job(const fs::path& output, std::optional<int64_t> world_size, bool refuse) {
  MergeResult result;
  const JobState job = read_job(output, world_size);
  std::string missing;
  for (const auto& r : job.ranks) {
    if (r.kind == RankState::Kind::kDone) continue;
    std::string why(rank_state_name(r.kind));
    if (r.kind == RankState::Kind::kStopped && r.record && !r.record->message.empty()) {
      why += " (" + r.record->message + ")";
    }
    if (r.kind == RankState::Kind::kRunning && r.record) {
      why += " (pid " + std::to_string(r.record->pid) + " on " + r.record->host + ")";
    }
    if (r.kind == RankState::Kind::kFailed && r.record && !r.record->message.empty()) {
      why += ": " + r.record->message;
    }
    if (!r.problem.empty()) why += ": " + r.problem;
    if (job.total_samples >= 0) {
      why += ", " + std::to_string(r.done) + " of " + std::to_string(r.span.samples()) +
             " samples";
    }
    missing += "\n  rank " + std::to_string(r.rank) + " of " + std::to_string(job.world_size) +
               ": " + why + "; rerun it: " + job.rerun_command(r.rank);
  }
  if (!missing.empty()) {
    PC_CHECK(!refuse, ConfigError, "cannot merge ", output, ": not every rank is done:", missing);
    result.waiting_for = missing;
    return result;
  }

  // One config fingerprint, one input; the shards in input order.
  OutputIndex merged;
  bool first = true;
  for (const auto& r : job.ranks) {
    // A rank without work has nothing to merge, even where its folder holds an earlier job's
    // index (one split otherwise).
    if (!r.index || r.span.empty()) continue;
    const OutputIndex& idx = *r.index;
    const std::string where = rank_folder(output, r.rank, job.world_size).string();
    if (first) {
      merged = idx;
      merged.shards.clear();
      first = false;
    } else {
      PC_CHECK(idx.meta.config_fingerprint == merged.meta.config_fingerprint, ConfigError,
               "cannot merge ", output, ": rank ", r.rank, " (", where, ") was made with other "
               "settings or models than rank ", job.ranks.front().rank, " (config fingerprint ",
               idx.meta.config_fingerprint, " vs ", merged.meta.config_fingerprint,
               "); rerun it with the job's config and --overwrite: ", job.rerun_command(r.rank));
      PC_CHECK(idx.input_sha256 == merged.input_sha256 &&
                   idx.input_samples == merged.input_samples &&
                   idx.total_samples == merged.total_samples && idx.shard_size == merged.shard_size,
               ConfigError, "cannot merge ", output, ": rank ", r.rank, " (", where,
               ") read another input or shard size than the other ranks; rerun it over the "
               "job's input with --overwrite: ", job.rerun_command(r.rank));
    }
    for (const auto& e : idx.shards) merged.shards.push_back(e);
  }
  PC_CHECK(!first, ConfigError, "cannot merge ", output, ": no rank holds an index");
  std::sort(merged.shards.begin(), merged.shards.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.first_seq < b.first_seq; });
  std::set<std::string> names;
  for (const auto& e : merged.shards) {
    PC_CHECK(names.insert(e.file).second, ConfigError, "cannot merge ", output,
             ": two ranks hold a shard named ", e.file, " (a rank resumed with --retry-failed?); "
             "rerun the ranks with --overwrite");
  }

  OutputFolderOptions options;
  options.allow_foreign = true;  // OUT holds ranks/ and job.json
  const OutputFolder lock = OutputFolder::open(output, options);
  std::optional<OutputIndex> current;
  try {
    current = read_index(output);
  } catch (const StorageError&) {
    current.reset();
  }
  bool in_place = current && same_shards(*current, merged) &&
                  fs::exists(output / kJobSummaryFileName);
  for (const auto& e : merged.shards) {
    std::error_code ec;
    const auto size = fs::file_size(output / e.file, ec);
    if (ec || size != e.bytes) in_place = false;
  }
  if (in_place) {
    result.merged = true;
    result.already = true;
    return result;
  }
  // An index the last merge did not write (a run on the merged output, --retry-failed say, or
  // a single run's output) is not replaced by the ranks' shards.
  if (current && !same_shards(*current, merged)) {
    std::string merged_sha;
    std::ifstream in(output / kJobSummaryFileName);
    const Json summary = in ? Json::parse(in, nullptr, false) : Json();
    if (summary.is_object() && summary.contains("index_sha256") &&
        summary["index_sha256"].is_string()) {
      merged_sha = summary["index_sha256"].get<std::string>();
    }
    PC_CHECK(!merged_sha.empty() && merged_sha == sha256_file(output / kIndexFileName),
             ConfigError, "cannot merge ", output, ": its index.json was not written by the "
             "last merge (a run on the merged output, such as --retry-failed, or another run); "
             "merging would replace it with the ranks' shards. Move ", (output / kIndexFileName),
             " away to merge anyway");
  }

  // Each rank's shard files, checked against their records by size (`precompute verify` reads
  // them whole), then placed.
  for (const auto& r : job.ranks) {
    if (!r.index || r.span.empty()) continue;
    const fs::path folder = rank_folder(output, r.rank, job.world_size);
    for (const auto& e : r.index->shards) {
      std::error_code ec;
      const auto size = fs::file_size(folder / e.file, ec);
      PC_CHECK(!ec && size == e.bytes, StorageError, "cannot merge ", output, ": shard ",
               (folder / e.file), " is ", ec ? "missing" : "not the size its index records",
               "; rerun rank ", r.rank, " to repair it: ", job.rerun_command(r.rank));
      place_shard(folder / e.file, output / e.file);
    }
  }
  fsync_folder(output);
  write_index(output, merged);
  refresh_dataset_view(output, merged);

  // The job summary.
  Json ranks = Json::array();
  double started = 0;
  double finished = 0;
  int64_t embedded = 0, records = 0, failed = 0, shards = 0;
  for (const auto& r : job.ranks) {
    int64_t r_embedded = 0, r_records = 0, r_failed = 0, r_shards = 0;
    if (r.index && !r.span.empty()) {
      for (const auto& e : r.index->shards) {
        r_embedded += e.num_samples;
        r_records += e.num_failures;
        r_failed += e.failed_samples;
        ++r_shards;
      }
    }
    embedded += r_embedded;
    records += r_records;
    failed += r_failed;
    shards += r_shards;
    Json item = {{"rank", r.rank},
                 {"span", span_json(r.span)},
                 {"samples", r.span.samples()},
                 {"shards", r_shards},
                 {"embedded", r_embedded},
                 {"failure_records", r_records},
                 {"failed_samples", r_failed}};
    if (r.record) {
      const auto& rec = *r.record;
      if (rec.started > 0) started = started > 0 ? std::min(started, rec.started) : rec.started;
      finished = std::max(finished, rec.finished);
      item["host"] = rec.host;
      item["started"] = iso_time(rec.started);
      item["finished"] = iso_time(rec.finished);
      item["attempts"] = rec.attempts;
      item["last_attempt_samples"] = rec.processed;
      item["last_attempt_seconds"] = rec.seconds;
      item["samples_per_s"] = rec.seconds > 0 ? static_cast<double>(rec.processed) / rec.seconds
                                               : 0.0;
    }
    ranks.push_back(std::move(item));
  }
  const double wall = finished > started && started > 0 ? finished - started : 0.0;
  Json summary = {{"format", "precompute-job"},
                  {"world_size", job.world_size},
                  {"total_samples", merged.total_samples},
                  {"shard_size", merged.shard_size},
                  {"config_fingerprint", merged.meta.config_fingerprint},
                  {"input_sha256", merged.input_sha256},
                  {"started", iso_time(started)},
                  {"finished", iso_time(finished)},
                  {"seconds", wall},
                  {"samples_per_s", wall > 0 ? static_cast<double>(merged.total_samples) / wall
                                             : 0.0},
                  {"totals",
                   {{"shards", shards},
                    {"embedded", embedded},
                    {"failure_records", records},
                    {"failed_samples", failed}}},
                  {"ranks", std::move(ranks)},
                  {"index_sha256", sha256_file(output / kIndexFileName)}};
  write_file_atomically(output / kJobSummaryFileName, summary.dump(2) + "\n");
  spdlog::info("merged {} rank(s) into {}: {} shards, {} samples ({} with embeddings, {} failure "
               "record(s)); job summary in {}",
               job.world_size, output.string(), shards, merged.total_samples, embedded, records,
               (output / kJobSummaryFileName).string());
  result.merged = true;
  return result;
}

}  // namespace precompute
