#include "storage/job_ranks.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <thread>
#include <cctype>
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

#include "pipeline/core/crash_point.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/atomic_file.hpp"
#include "storage/dataset_view.hpp"
#include "storage/output_folder.hpp"
#include "storage/output_id.hpp"

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

// The SHA-256 of each file, on up to 8 threads: a merge hashes every shard of the job, and one
// core hashes about 1.2 GB/s. A file that cannot be read gets "".
std::vector<std::string> sha256_files(const std::vector<fs::path>& files) {
  std::vector<std::string> digests(files.size());
  std::atomic<size_t> next{0};
  const size_t threads = std::min<size_t>(
      files.size(), std::clamp<size_t>(std::thread::hardware_concurrency(), 1, 8));
  std::vector<std::thread> workers;
  for (size_t t = 0; t < threads; ++t) {
    workers.emplace_back([&] {
      for (size_t i = next++; i < files.size(); i = next++) {
        try {
          digests[i] = sha256_file(files[i]);
        } catch (const Error&) {
          digests[i].clear();
        }
      }
    });
  }
  for (auto& worker : workers) worker.join();
  return digests;
}

bool same_file(const fs::path& a, const fs::path& b) {
  struct stat x{};
  struct stat y{};
  return ::stat(a.c_str(), &x) == 0 && ::stat(b.c_str(), &y) == 0 && x.st_dev == y.st_dev &&
         x.st_ino == y.st_ino;
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

std::string shell_quoted(const std::string& arg) {
  const bool plain = !arg.empty() && std::all_of(arg.begin(), arg.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) != 0 ||
           std::string_view("_./:=@%+,-").find(c) != std::string_view::npos;
  });
  if (plain) return arg;
  std::string quoted = "'";
  for (const char c : arg) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

// The job summary's record of which index.json the last merge wrote (and, while it writes a new
// one, the one before): an index with another digest was written by a run on OUT.
struct JobSummaryDigests {
  std::string output_id;
  std::string index_sha256;
  std::string previous_index_sha256;
};

std::optional<JobSummaryDigests> read_job_summary(const fs::path& output) {
  std::ifstream in(output / kJobSummaryFileName);
  if (!in) return std::nullopt;
  const Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  JobSummaryDigests d;
  const auto text = [&](const char* key) {
    return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
  };
  d.output_id = text("output_id");
  d.index_sha256 = text("index_sha256");
  d.previous_index_sha256 = text("previous_index_sha256");
  return d;
}

// What merging the ranks writes: their shards in input order, with the ranks' settings and
// input. Throws ConfigError naming the rank that disagrees and its rerun command.
OutputIndex merged_index(const JobState& job) {
  OutputIndex merged;
  bool first = true;
  int64_t first_rank = 0;
  for (const auto& r : job.ranks) {
    // A rank without work has nothing to merge, even where its folder holds an earlier job's
    // index (one split otherwise).
    if (!r.index || r.span.empty()) continue;
    const OutputIndex& idx = *r.index;
    const std::string where = rank_folder(job.output, r.rank, job.world_size).string();
    if (first) {
      merged = idx;
      merged.shards.clear();
      merged.rank.reset();
      first = false;
      first_rank = r.rank;
    } else {
      PC_CHECK(idx.meta.config_fingerprint == merged.meta.config_fingerprint, ConfigError,
               "cannot merge ", job.output, ": rank ", r.rank, " (", where, ") was made with "
               "other settings or models than rank ", first_rank, " (config fingerprint ",
               idx.meta.config_fingerprint, " vs ", merged.meta.config_fingerprint,
               "); rerun it with the job's config and --overwrite: ", job.rerun_command(r.rank));
      PC_CHECK(idx.input_sha256 == merged.input_sha256 &&
                   idx.input_samples == merged.input_samples &&
                   idx.total_samples == merged.total_samples && idx.shard_size == merged.shard_size,
               ConfigError, "cannot merge ", job.output, ": rank ", r.rank, " (", where,
               ") read another input or shard size than the other ranks; rerun it over the "
               "job's input with --overwrite: ", job.rerun_command(r.rank));
    }
    for (const auto& e : idx.shards) merged.shards.push_back(e);
  }
  PC_CHECK(!first, ConfigError, "cannot merge ", job.output, ": no rank holds an index");
  std::sort(merged.shards.begin(), merged.shards.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.first_seq < b.first_seq; });
  std::set<std::string> names;
  for (const auto& e : merged.shards) {
    PC_CHECK(names.insert(e.file).second, ConfigError, "cannot merge ", job.output,
             ": two ranks hold a shard named ", e.file, "; rerun the ranks with --overwrite");
  }
  return merged;
}

// The rank's shard file of a merged entry.
fs::path rank_shard(const JobState& job, const IndexEntry& entry) {
  for (const auto& r : job.ranks) {
    if (r.index && !r.span.empty() && entry.first_seq >= r.span.first_seq &&
        entry.first_seq < r.span.end_seq) {
      return rank_folder(job.output, r.rank, job.world_size) / entry.file;
    }
  }
  return {};
}

// Whether OUT's copy of a merged shard is the rank's file, or holds its bytes; `hash`: compare
// hashes where they are different files (else sizes).
bool shard_in_place(const fs::path& out_file, const fs::path& rank_file, const IndexEntry& entry,
                    bool hash) {
  std::error_code ec;
  const auto size = fs::file_size(out_file, ec);
  if (ec || size != entry.bytes) return false;
  if (same_file(out_file, rank_file)) return true;
  return !hash || sha256_file(out_file) == entry.sha256;
}

// Note [Merging ranks]
// Each rank is a complete, ordinary run over its span of the input, in its own folder. Merging
// makes OUT what one run over the whole input makes: the shards under their own names (a rank
// writes the shards a single run would: k*shard_size is shard k, named by its bytes), index.json
// with the same fields (the ranks share the config, the input and its identity), dataset.h5
// from that index. The shards are hard links to the ranks' files, so nothing is copied and a
// rank folder stays a valid output of its own; a link shares damage, so every merge checks each
// rank's shard against its SHA-256 (a damaged one is the rank's to redo, and the merge names its
// rerun command), and replaces a shard of OUT that is no longer the rank's file and does not
// hold its bytes (after the rank redid it). Order: every shard is in place, then job.json (which
// names the index about to be written and the one before it), then the index, then the view,
// then OUT's shards that the index no longer lists are removed. So a merge killed at any point
// leaves an index that job.json vouches for, and the next merge finds what disagrees (the
// index, the view, job.json, a shard; read_job) and completes it. An index that job.json does
// not vouch for was written by a run on OUT (--retry-failed, say) and is not replaced. OUT's
// lock keeps two merges apart (the last two ranks may finish together).
void assess_merged(JobState& job, bool hash_shards) {
  const fs::path index_file = job.output / kIndexFileName;
  std::error_code ec;
  if (!fs::exists(index_file, ec)) {
    job.merged = MergedKind::kNotMerged;
    return;
  }
  job.merged = MergedKind::kOutOfDate;
  if (!job.all_done()) {
    job.merged_why = "not every rank is done";
    return;
  }
  OutputIndex merged;
  try {
    merged = merged_index(job);
  } catch (const Error& e) {
    job.merged_why = e.what();
    return;
  }
  std::string current;
  try {
    current = sha256_file(index_file);
  } catch (const StorageError& e) {
    job.merged_why = e.what();
    return;
  }
  const std::string wanted = index_sha256(merged);
  const auto summary = read_job_summary(job.output);
  if (current != wanted) {
    bool parses = true;
    try {
      (void)read_index(job.output);
    } catch (const StorageError&) {
      parses = false;  // a damaged index of the merge's: replaced
    }
    const bool vouched = summary && (summary->index_sha256 == current ||
                                     summary->previous_index_sha256 == current);
    if (parses && !vouched) {
      job.merged = MergedKind::kOtherIndex;
      job.merged_why = "its index.json was not written by the last merge (a run on the merged output, "
                       "such as --retry-failed, or another run)";
      return;
    }
    job.merged_why = "it shows an earlier merge of the ranks";
    return;
  }
  for (const auto& e : merged.shards) {
    if (!shard_in_place(job.output / e.file, rank_shard(job, e), e, hash_shards)) {
      job.merged_why = detail::concat(e.file, " is not the rank's shard");
      return;
    }
  }
  if (const auto problem = dataset_view_problem(job.output, merged); !problem.empty()) {
    job.merged_why = std::string(kDatasetViewFileName) + ": " + problem;
    return;
  }
  if (!summary || summary->index_sha256 != wanted || summary->output_id != merged.meta.output_id) {
    job.merged_why = std::string(kJobSummaryFileName) + " does not describe its index.json";
    return;
  }
  job.merged = MergedKind::kCurrent;
  job.merged_why.clear();
}

void write_job_summary(const JobState& job, const OutputIndex& merged,
                       const std::string& index_digest, const std::string& previous_digest) {
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
                  // Second, so that it sits in the file's first bytes (Note [Proving a file is
                  // ours] in output_id.cpp).
                  {"output_id", merged.meta.output_id},
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
                  // Note [Merging ranks]: the index this merge writes, and the one before it.
                  {"index_sha256", index_digest},
                  {"previous_index_sha256", previous_digest}};
  write_file_atomically(job.output / kJobSummaryFileName, summary.dump(2) + "\n");
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
            // Second, so that it sits in the file's first bytes (Note [Proving a file is ours]).
            {"output_id", r.output_id},
            {"rank", r.rank},
            {"world_size", r.world_size},
            {"total_samples", r.total_samples},
            {"shard_size", r.shard_size},
            {"span", span_json(r.span)},
            {"state", r.state},
            {"pid", r.pid},
            {"host", r.host},
            {"config", r.config},
            {"command", r.command},
            {"working_folder", r.working_folder},
            {"rank_source", r.rank_source},
            {"overwrite_done", r.overwrite_done},
            {"started", iso_time(r.started)},
            {"finished", iso_time(r.finished)},
            {"started_unix", r.started},
            {"finished_unix", r.finished},
            {"attempts", r.attempts},
            {"processed", r.processed},
            {"seconds", r.seconds},
            {"message", r.message}};
  write_file_atomically(folder / kRankRecordFileName,
                        j.dump(2, ' ', false, Json::error_handler_t::replace) + "\n");
}

std::optional<RankRecord> read_rank_record(const fs::path& folder) {
  std::ifstream in(folder / kRankRecordFileName);
  if (!in) return std::nullopt;
  const Json j = Json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return std::nullopt;
  try {
    RankRecord r;
    r.output_id = j.at("output_id").get<std::string>();
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
    r.command = j.at("command").get<std::vector<std::string>>();
    r.working_folder = j.at("working_folder").get<std::string>();
    r.rank_source = j.at("rank_source").get<std::string>();
    r.overwrite_done = j.at("overwrite_done").get<bool>();
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

bool JobState::all_done() const {
  return !ranks.empty() && std::all_of(ranks.begin(), ranks.end(), [](const RankState& r) {
    return r.kind == RankState::Kind::kDone;
  });
}

std::string JobState::rerun_command(int64_t rank) const {
  const auto suffix = detail::concat(" --rank ", rank, " --world-size ", world_size);
  // The rank's own command, else the job's as another rank ran it.
  const RankRecord* record = nullptr;
  bool own = false;
  if (rank >= 0 && rank < static_cast<int64_t>(ranks.size()) && ranks[rank].record &&
      !ranks[rank].record->command.empty()) {
    record = &*ranks[rank].record;
    own = true;
  }
  for (const auto& r : ranks) {
    if (record) break;
    if (r.record && !r.record->command.empty()) record = &*r.record;
  }
  if (!record) {
    return "precompute run --config " + (config.empty() ? std::string("CONFIG") : config) + suffix;
  }
  // Every argument as typed, but the rank's own flags, and --overwrite once it was carried out
  // (repeating it would remove the rank's committed work).
  std::vector<std::string> args;
  std::string config_arg;
  std::vector<std::string> flags;  // after `run`, but --config, --rank and --world-size
  const auto& command = record->command;
  for (size_t i = 0; i < command.size(); ++i) {
    const std::string& a = command[i];
    const bool takes_value = a == "--rank" || a == "--world-size";
    if (takes_value) {
      ++i;
      continue;
    }
    if (a.rfind("--rank=", 0) == 0 || a.rfind("--world-size=", 0) == 0) continue;
    if (a == "--overwrite" && own && record->overwrite_done) continue;
    args.push_back(a);
    if (i == 0 || (i == 1 && a == "run")) continue;
    if ((a == "-c" || a == "--config") && i + 1 < command.size()) {
      config_arg = command[++i];
      args.push_back(config_arg);
      continue;
    }
    if (a.rfind("--config=", 0) == 0) {
      config_arg = a.substr(std::string_view("--config=").size());
      continue;
    }
    flags.push_back(a);
  }
  std::string text = "cd " + shell_quoted(record->working_folder) + " &&";
  for (const auto& a : args) text += " " + shell_quoted(a);
  text += suffix;
  // A SLURM array task is resubmitted as one, with its flags through the script's
  // PRECOMPUTE_FLAGS (tools/slurm/precompute.sbatch).
  if (record->rank_source.rfind("SLURM_ARRAY_TASK_ID", 0) == 0 && !config_arg.empty()) {
    std::string extra;
    for (const auto& f : flags) extra += (extra.empty() ? "" : " ") + shell_quoted(f);
    text += " (under SLURM: cd " + shell_quoted(record->working_folder) + " && " +
            (extra.empty() ? std::string() : "PRECOMPUTE_FLAGS=" + shell_quoted(extra) + " ") +
            "sbatch --array=" + std::to_string(rank) + " tools/slurm/precompute.sbatch " +
            shell_quoted(config_arg) + " " + std::to_string(world_size) + ")";
  }
  return text;
}

JobState read_job(const fs::path& output, std::optional<int64_t> world_size, bool hash_shards) {
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
  for (int64_t w : worlds) {
    if (w != job.world_size) job.other_world_sizes.push_back(w);
  }

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
      complete = exact && state.index->total_samples == job.total_samples &&
                 state.index->shard_size == job.shard_size;
      if (exact && !complete) {
        state.problem = detail::concat("its index is of an input of ", state.index->total_samples,
                                       " samples in shards of ", state.index->shard_size,
                                       ", the job's of ", job.total_samples, " in shards of ",
                                       job.shard_size);
      }
    }
    // Every committed shard of a complete rank must still be the bytes its index records.
    if (complete) {
      const fs::path folder = rank_folder(output, r, job.world_size);
      for (const auto& e : state.index->shards) {
        std::string problem;
        std::error_code size_error;
        const auto size = fs::file_size(folder / e.file, size_error);
        if (size_error || size != e.bytes) {
          problem = size_error ? "is missing" : "is not the size its index records";
        }
        if (!problem.empty()) {
          state.problem = detail::concat("its shard ", (folder / e.file).string(), " ", problem);
          complete = false;
          break;
        }
      }
    }
    // A rank without work is done whether or not it ran.
    const bool no_work = job.total_samples >= 0 && state.span.empty();
    if (no_work) complete = true;
    const auto& rec = state.record;
    if (!rec && !state.index && state.problem.empty()) {
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
  // Note [Merging ranks]: a done rank's shards hashed, all at once, only once every rank is done
  // (a merge that waits for a rank reads nothing).
  if (hash_shards && job.all_done()) {
    std::vector<std::pair<size_t, const IndexEntry*>> shards;
    std::vector<fs::path> files;
    for (size_t k = 0; k < job.ranks.size(); ++k) {
      const RankState& r = job.ranks[k];
      if (!r.index || r.span.empty()) continue;
      for (const auto& e : r.index->shards) {
        shards.emplace_back(k, &e);
        files.push_back(rank_folder(output, r.rank, job.world_size) / e.file);
      }
    }
    const std::vector<std::string> digests = sha256_files(files);
    for (size_t i = 0; i < shards.size(); ++i) {
      RankState& r = job.ranks[shards[i].first];
      if (digests[i] == shards[i].second->sha256 || r.kind != RankState::Kind::kDone) continue;
      r.kind = RankState::Kind::kStopped;
      r.problem = detail::concat("its shard ", files[i].string(),
                                 " does not hash to the SHA-256 its index records (its bytes "
                                 "changed)");
    }
  }
  assess_merged(job, hash_shards);
  return job;
}

MergeResult merge_job(const fs::path& output, std::optional<int64_t> world_size, bool refuse) {
  MergeResult result;
  // OUT's files are proven (one output id, the index's) before anything there is read or
  // replaced.
  OutputFolderOptions options;
  options.allow_foreign = true;  // OUT holds ranks/
  const OutputFolder lock = OutputFolder::open(output, options);
  const JobState job = read_job(output, world_size, /*hash_shards=*/true);
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
  if (job.merged == MergedKind::kCurrent) {
    result.merged = true;
    result.already = true;
    return result;
  }
  PC_CHECK(job.merged != MergedKind::kOtherIndex, ConfigError, "cannot merge ", output, ": ",
           job.merged_why, "; merging would replace it with the ranks' shards. Move ",
           (output / kIndexFileName), " away to merge anyway");
  const OutputIndex merged = merged_index(job);
  // OUT showed an earlier merge of other settings: its files go first (the index last), so that
  // OUT never holds files of two outputs.
  if (!lock.output_id().empty() && lock.output_id() != merged.meta.output_id) {
    lock.remove_previous_run();
  }

  // What a merge killed before left: its temporary files.
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(output, ec)) {
    if (entry.path().filename().string().rfind(kTempFilePrefix, 0) == 0) {
      fs::remove(entry.path(), ec);
    }
  }
  std::set<std::string> listed;
  for (const auto& e : merged.shards) {
    listed.insert(e.file);
    const fs::path from = rank_shard(job, e);
    const fs::path to = output / e.file;
    if (!shard_in_place(to, from, e, /*hash=*/true)) place_shard(from, to);
  }
  fsync_folder(output);
  crash_point("merge-before-job-summary");
  const std::string wanted = index_sha256(merged);
  std::string current;
  if (fs::exists(output / kIndexFileName)) current = sha256_file(output / kIndexFileName);
  std::string previous = current;
  if (current == wanted) {
    const auto summary = read_job_summary(output);
    previous = summary ? summary->previous_index_sha256 : std::string();
  }
  write_job_summary(job, merged, wanted, previous);
  crash_point("merge-before-index");
  if (current != wanted) write_index(output, merged);
  crash_point("merge-before-view");
  if (!dataset_view_problem(output, merged).empty()) write_dataset_view(output, merged);
  crash_point("merge-before-cleanup");
  // Shards of an earlier merge that the index no longer lists (proven the job's by the lock).
  int removed = 0;
  for (const auto& entry : fs::directory_iterator(output, ec)) {
    const std::string name = entry.path().filename().string();
    if (is_shard_file_name(name) && listed.count(name) == 0) {
      fs::remove(entry.path(), ec);
      ++removed;
    }
  }
  if (removed > 0) fsync_folder(output);
  int64_t embedded = 0, records = 0;
  for (const auto& e : merged.shards) {
    embedded += e.num_samples;
    records += e.num_failures;
  }
  spdlog::info("merged {} rank(s) into {}: {} shards, {} samples ({} with embeddings, {} failure "
               "record(s)); job summary in {}",
               job.world_size, output.string(), merged.shards.size(), merged.total_samples,
               embedded, records, (output / kJobSummaryFileName).string());
  result.merged = true;
  return result;
}

}  // namespace precompute
