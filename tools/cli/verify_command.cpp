// `precompute verify OUT [--input MANIFEST]`: proves an output folder whole before a trainer (or
// an archive) relies on it. Every shard's size and SHA-256 against index.json; every shard
// opened and every attribute and dataset read end to end (HDF5 checks each chunk's Fletcher-32);
// the counts in each shard against its index entry; no id twice; and, given the input, every
// input id embedded or holding a failure record. Each problem is one line naming the shard, what
// is wrong and the fix; the exit code says damaged (74) or incomplete (1) apart from clean (0).

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "pipeline/core/error.hpp"
#include "pipeline/input/manifest.hpp"
#include "pipeline/input/tar_index_cache.hpp"
#include "pipeline/resume.hpp"
#include "pipeline/core/sha256.hpp"
#include "storage/dataset_view.hpp"
#include "storage/output_folder.hpp"
#include "storage/shard_schema.hpp"
#include "storage/output_index.hpp"
#include "storage/shard_scan.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

struct VerifyOptions {
  std::string output;
  // A manifest or a folder of media, as `run --input` takes; or tar shards, one or several (as
  // input.tars lists them).
  std::vector<std::string> inputs;
  bool json = false;
  int max_listed = 20;  // ids listed per kind of input problem (all with --json)
};

// kDamaged: bytes on disk are wrong or missing (exit 74). kIncomplete: what is there is sound,
// but it does not account for every input sample (exit 1).
enum class Severity { kDamaged, kIncomplete };

struct Problem {
  Severity severity = Severity::kDamaged;
  std::string shard;  // file name, empty for the output as a whole
  std::string what;
  std::string fix;
};

constexpr char kRerunFix[] =
    "rerun the same `precompute run` command: resuming checks every shard's SHA-256 and redoes "
    "the samples of a damaged (deleted first) or missing one";
constexpr char kDeleteFix[] =
    "delete this file and rerun the same `precompute run` command: resuming redoes the samples "
    "of a missing shard";
constexpr char kResumeFix[] = "rerun the same `precompute run` command to resume";

// JSON text in one form (the index keeps settings as objects, shards as text).
std::string canonical_json(const std::string& text) {
  if (text.empty()) return text;
  const auto parsed = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? text : parsed.dump(-1, ' ', false,
                                                    nlohmann::json::error_handler_t::replace);
}

struct ShardReport {
  const IndexEntry* entry = nullptr;
  bool ok = false;
  int64_t datasets_read = 0;
  int64_t attributes_read = 0;
  uint64_t bytes_read = 0;
  std::string input_sha256;
};

class Verifier {
 public:
  explicit Verifier(const VerifyOptions& o) : o_(o), dir_(o.output) {}

  int run() {
    std::optional<OutputIndex> index;
    try {
      index = read_index(dir_);
    } catch (const StorageError& e) {
      add(Severity::kDamaged, std::string(kIndexFileName), e.what(),
          "rerun the same `precompute run` command: resuming rebuilds index.json from the shards");
      return report(nullptr);
    }
    if (!index) {
      // Shards without an index: a run that lost its index (or never wrote one past its first
      // commit); nothing there is known to be damaged, and a rerun rebuilds the index.
      std::vector<std::string> shards;
      std::error_code error;
      for (const auto& item : std::filesystem::directory_iterator(dir_, error)) {
        if (is_shard_file_name(item.path().filename().string())) {
          shards.push_back(item.path().filename().string());
        }
      }
      PC_CHECK(!error && !shards.empty(), ConfigError, dir_,
               " holds no precompute output (no index.json, no shard); give the folder a run "
               "wrote to");
      add(Severity::kIncomplete, std::string(kIndexFileName),
          fmt::format("is missing, beside {} shard file(s)", shards.size()),
          "rerun the same `precompute run` command: resuming rebuilds index.json from the shards");
      return report(nullptr);
    }
    for (const auto& entry : index->shards) shards_.push_back(check_shard(*index, entry));
    const bool finished = check_coverage(*index);
    check_unrecorded_files(*index);
    check_derived_files(*index, finished);
    if (!o_.inputs.empty()) check_input(*index);
    return report(&*index);
  }

 private:
  void add(Severity severity, std::string shard, std::string what, std::string fix) {
    problems_.push_back({severity, std::move(shard), std::move(what), std::move(fix)});
  }

  ShardReport check_shard(const OutputIndex& index, const IndexEntry& entry) {
    ShardReport r;
    r.entry = &entry;
    // Size and SHA-256 first: HDF5 is never handed a file whose bytes are known to be wrong.
    if (auto problem = committed_shard_problem(dir_, entry); !problem.empty()) {
      add(Severity::kDamaged, entry.file, problem, kRerunFix);
      return r;
    }
    ShardScan scan;
    try {
      scan = scan_shard(dir_ / entry.file);
    } catch (const StorageError& e) {
      add(Severity::kDamaged, entry.file, fmt::format("cannot be read: {}", e.what()), kDeleteFix);
      return r;
    }
    r.datasets_read = scan.datasets_read;
    r.attributes_read = scan.attributes_read;
    r.bytes_read = scan.bytes_read;
    r.input_sha256 = scan.input_sha256;
    const size_t before = problems_.size();
    const auto mismatch = [&](const std::string& what) {
      add(Severity::kDamaged, entry.file, what + " (index.json and the shard disagree)",
          kDeleteFix);
    };
    if (scan.shard_index != entry.shard_index || scan.first_seq != entry.first_seq ||
        scan.seq_count != entry.seq_count) {
      mismatch(
          fmt::format("holds shard {} of positions {}+{}, index.json records shard {} of {}+{}",
                      scan.shard_index, scan.first_seq, scan.seq_count, entry.shard_index,
                      entry.first_seq, entry.seq_count));
    }
    if (scan.ids.size() != scan.seqs.size() ||
        static_cast<int64_t>(scan.ids.size()) != entry.num_samples) {
      mismatch(fmt::format("holds {} ids and {} seqs, index.json records {} samples",
                           scan.ids.size(), scan.seqs.size(), entry.num_samples));
    }
    if (scan.failure_ids.size() != scan.failure_seqs.size() ||
        static_cast<int64_t>(scan.failure_ids.size()) != entry.num_failures) {
      mismatch(fmt::format("holds {} failure records, index.json records {}",
                           scan.failure_ids.size(), entry.num_failures));
    }
    for (const auto& schema : index.meta.modalities) {
      if (!schema) continue;
      const int m = modality_index(schema->modality);
      if (scan.present[m] != entry.modality_counts[m]) {
        mismatch(fmt::format("has {} {} embeddings, index.json records {}", scan.present[m],
                             modality_name(schema->modality), entry.modality_counts[m]));
      }
    }
    // Kept columns (output.keep_columns): each one there, one row per id, and no other.
    for (const auto& name : index.meta.kept_columns) {
      const auto it = scan.column_rows.find(name);
      if (it == scan.column_rows.end()) {
        mismatch(fmt::format("has no kept column /columns/{}, which the run's "
                             "output.keep_columns names", name));
      } else if (it->second != static_cast<int64_t>(scan.ids.size())) {
        mismatch(fmt::format("/columns/{} has {} rows for {} ids", name, it->second,
                             scan.ids.size()));
      }
    }
    for (const auto& [name, rows] : scan.column_rows) {
      if (std::find(index.meta.kept_columns.begin(), index.meta.kept_columns.end(), name) ==
          index.meta.kept_columns.end()) {
        mismatch(fmt::format("has a column /columns/{} that output.keep_columns does not name",
                             name));
      }
    }
    // The shard's own statements against the index's: an index edited by hand, or a shard of
    // another output (or run with other settings) put in the place of this one's.
    if (scan.output_id != index.meta.output_id) {
      mismatch(fmt::format("carries output id '{}', index.json '{}': it is another output's "
                           "shard", scan.output_id, index.meta.output_id));
    }
    if (scan.config_fingerprint != index.meta.config_fingerprint) {
      mismatch(fmt::format("was made with config fingerprint {}, index.json records {}",
                           scan.config_fingerprint, index.meta.config_fingerprint));
    }
    if (scan.storage_dtype != storage_dtype_name(index.meta.dtype)) {
      mismatch(fmt::format("stores {}, index.json records {}", scan.storage_dtype,
                           storage_dtype_name(index.meta.dtype)));
    }
    for (Modality m : kAllModalities) {
      const auto& schema = index.meta.modalities[modality_index(m)];
      const auto& found = scan.modalities[modality_index(m)];
      if (!schema && !found) continue;
      const std::string name(modality_name(m));
      if (!schema || !found) {
        mismatch(fmt::format("{} a /{} group, index.json {}", found ? "has" : "has no", name,
                             schema ? "lists that modality" : "does not list it"));
        continue;
      }
      const std::string layout(schema->per_step ? shard_schema::kPerStepLayout
                                                : shard_schema::kPooledLayout);
      const auto differs = [&](const char* what, const std::string& shard,
                               const std::string& listed) {
        if (shard != listed) {
          mismatch(fmt::format("/{} has {} '{}', index.json '{}'", name, what, shard, listed));
        }
      };
      differs("dim", std::to_string(found->dim), std::to_string(schema->dim));
      differs("layout", found->layout, layout);
      differs("dtype", found->dtype, std::string(storage_dtype_name(index.meta.dtype)));
      differs("encoder", found->encoder, schema->encoder);
      differs("encoder_sha256", found->encoder_sha256, schema->encoder_sha256);
      differs("pooling", found->pooling, schema->pooling);
      differs("preprocessing", canonical_json(found->preprocessing),
              canonical_json(schema->preprocessing_json));
    }
    for (const auto& problem : scan.digest_problems) mismatch(problem);
    const int64_t end = entry.first_seq + entry.seq_count;
    for (size_t i = 0; i < scan.seqs.size(); ++i) {
      if (scan.seqs[i] < entry.first_seq || scan.seqs[i] >= end ||
          (i > 0 && scan.seqs[i] <= scan.seqs[i - 1])) {
        mismatch(fmt::format("/seq[{}] = {} is not ascending inside [{}, {})", i, scan.seqs[i],
                             entry.first_seq, end));
        break;
      }
    }
    std::set<int64_t> failed;
    for (int64_t seq : scan.failure_seqs) {
      if (seq < entry.first_seq || seq >= end) {
        mismatch(fmt::format("a failure record's seq {} is outside [{}, {})", seq, entry.first_seq,
                             end));
        break;
      }
      failed.insert(seq);
    }
    if (static_cast<int64_t>(failed.size()) != entry.failed_samples) {
      mismatch(fmt::format("has failure records for {} samples, index.json records {}",
                           failed.size(), entry.failed_samples));
    }
    for (const auto& id : scan.ids) {
      const auto [it, inserted] = shard_of_id_.emplace(id, entry.file);
      if (!inserted) {
        add(Severity::kDamaged, entry.file,
            fmt::format("id '{}' is also in {}: an id must be embedded once", id, it->second),
            "rerun with --overwrite into an empty folder (the output was assembled from two "
            "runs)");
      }
    }
    for (const auto& id : scan.failure_ids) failure_ids_.insert(id);
    samples_ += static_cast<int64_t>(scan.ids.size());
    failure_records_ += static_cast<int64_t>(scan.failure_ids.size());
    r.ok = problems_.size() == before;
    return r;
  }

  // Whether the shards cover every position the output is for: the whole input, or a rank
  // folder's span of it.
  bool check_coverage(const OutputIndex& index) {
    int64_t covered = 0;
    for (const auto& entry : index.shards) {
      if (entry.first_seq < index.covers_first() ||
          entry.first_seq + entry.seq_count > index.covers_end()) {
        add(Severity::kDamaged, entry.file,
            fmt::format("covers positions {}+{}, outside the output's [{}, {})", entry.first_seq,
                        entry.seq_count, index.covers_first(), index.covers_end()),
            kDeleteFix);
      }
      covered += entry.seq_count;
    }
    const int64_t wanted = index.covers_end() - index.covers_first();
    if (covered != wanted) {
      add(Severity::kIncomplete, "",
          index.rank ? fmt::format("the shards cover {} of the {} samples of rank {} of {}: the "
                                   "rank has not finished",
                                   covered, wanted, index.rank->rank, index.rank->world_size)
                     : fmt::format("the shards cover {} of the input's {} samples: the run has "
                                   "not finished",
                                   covered, wanted),
          kResumeFix);
      return false;
    }
    return true;
  }

  // dataset.h5 and job.json are derived from index.json and must show what it lists (Note [A
  // view names the index it shows] in storage/dataset_view.cpp, Note [Merging ranks] in
  // storage/job_ranks.cpp). While a run goes on the view may lag: then only a note.
  void check_derived_files(const OutputIndex& index, bool finished) {
    const bool merged = std::filesystem::exists(dir_ / kJobSummaryFileName);
    const std::string fix =
        merged ? fmt::format("run `precompute merge {}`: it rebuilds what disagrees", dir_.string())
               : "rerun the same `precompute run` command: it rebuilds dataset.h5";
    if (const auto problem = dataset_view_problem(dir_, index); !problem.empty()) {
      if (finished) {
        add(Severity::kDamaged, std::string(kDatasetViewFileName), problem, fix);
      } else {
        notes_.push_back(fmt::format("{} is not (yet) the view of index.json: {}",
                                     (dir_ / kDatasetViewFileName).string(), problem));
      }
    }
    if (!merged) return;
    std::ifstream in(dir_ / kJobSummaryFileName);
    const auto summary = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    const auto text = [&](const char* key) {
      return summary.is_object() && summary.contains(key) && summary[key].is_string()
                 ? summary[key].get<std::string>()
                 : std::string();
    };
    const std::string digest = sha256_file(dir_ / kIndexFileName);
    if (text("output_id") != index.meta.output_id) {
      add(Severity::kDamaged, std::string(kJobSummaryFileName),
          "belongs to another output than index.json", fix);
    } else if (text("index_sha256") == digest) {
      return;
    } else if (text("previous_index_sha256") == digest) {
      add(Severity::kDamaged, std::string(kJobSummaryFileName),
          "names an index.json that is not yet the folder's: a merge was interrupted", fix);
    } else {
      // A run on the merged output (--retry-failed, say) wrote the index since: job.json is the
      // merge's history, and a merge would not replace that index.
      notes_.push_back(fmt::format("{} describes the merge before a run on this output rewrote "
                                   "index.json", (dir_ / kJobSummaryFileName).string()));
    }
  }

  // Shard files the index does not record: left by a crash between rename and record. Not a
  // problem (a resume deletes them, a reader never sees them), but worth a line.
  void check_unrecorded_files(const OutputIndex& index) {
    std::set<std::string> recorded;
    for (const auto& entry : index.shards) recorded.insert(entry.file);
    std::error_code error;
    for (const auto& item : std::filesystem::directory_iterator(dir_, error)) {
      const std::string name = item.path().filename().string();
      if (is_shard_file_name(name) && recorded.count(name) == 0) {
        notes_.push_back(fmt::format("{} is not recorded in index.json (left by a crash); "
                                     "readers ignore it and a resume deletes it",
                                     (dir_ / name).string()));
      }
    }
  }

  void check_input(const OutputIndex& index) {
    for (const auto& value : o_.inputs) {
      PC_CHECK(!value.empty(), ConfigError,
               "--input is empty; give the run's manifest, media folder or tar shards");
    }
    const PathList given{{o_.inputs.begin(), o_.inputs.end()}};
    const InputSection section = input_section_for(given.paths);
    input_text_ = given.text();
    const std::string& input = input_text_;
    // With the run's kept columns: their values are part of each shard's input_sha256; and its
    // caption cap, which bounds the tar captions that are part of it too.
    // Tar indexes kept in the folder spare reading the tars' headers again; verify only reads
    // them (Note [Tar indexes kept in the output folder]).
    TarIndexCache tar_indexes(dir_, /*keep_fresh=*/false);
    const auto samples = read_input(
        section, section.folder.empty() ? index.meta.kept_columns : std::vector<std::string>(),
        nullptr,
        max_text_bytes_of_config(index.meta.config_json, default_text_section().max_text_bytes),
        &tar_indexes);
    input_samples_ = static_cast<int64_t>(samples.size());
    // Positions inside a shard reported damaged above: their ids are not missing, they are in
    // that shard, which the fix given for it redoes.
    std::vector<std::pair<int64_t, int64_t>> damaged_ranges;
    for (const auto& shard : shards_) {
      const IndexEntry& e = *shard.entry;
      if (!shard.ok) {
        damaged_ranges.emplace_back(e.first_seq, e.first_seq + e.seq_count);
        continue;
      }
      if (shard.input_sha256.empty()) continue;
      if (input_identity(samples, e.first_seq, e.seq_count) != shard.input_sha256) {
        add(Severity::kIncomplete, e.file,
            fmt::format("was made from other input samples at positions {}-{} than {} has "
                        "there (an edited or reordered input)",
                        e.first_seq, e.first_seq + e.seq_count - 1, input),
            "verify against the input the run was made from, or rerun with --overwrite");
      }
    }
    const auto in_damaged = [&](int64_t seq) {
      for (const auto& [lo, hi] : damaged_ranges) {
        if (seq >= lo && seq < hi) return true;
      }
      return false;
    };
    std::unordered_set<std::string> input_ids;
    for (const auto& s : samples) {
      input_ids.insert(s.id);
      if (shard_of_id_.count(s.id) > 0 || failure_ids_.count(s.id) > 0) {
        ++accounted_;
      } else if (!in_damaged(s.seq)) {
        missing_.push_back(s.id);
      }
    }
    for (const auto& [id, file] : shard_of_id_) {
      if (input_ids.count(id) == 0) foreign_.emplace_back(id, file);
    }
    std::sort(foreign_.begin(), foreign_.end());
    if (!missing_.empty()) {
      add(Severity::kIncomplete, "",
          fmt::format("{} input id(s) have neither an embedding nor a failure record: {}",
                      missing_.size(), listed(missing_)),
          o_.inputs.size() == 1
              ? fmt::format("{} with --input {} (add --retry-failed to redo failed samples too)",
                            kResumeFix, o_.inputs[0])
              : fmt::format("{}, whose config's input.tars lists {} (add --retry-failed to redo "
                            "failed samples too)",
                            kResumeFix, input));
    }
    if (!foreign_.empty()) {
      std::vector<std::string> names;
      for (const auto& [id, file] : foreign_) names.push_back(fmt::format("{} ({})", id, file));
      add(Severity::kIncomplete, "",
          fmt::format("{} embedded id(s) are not in {}: {}", foreign_.size(), input,
                      listed(names)),
          "verify against the input the run was made from, or rerun with --overwrite");
    }
    (void)index;
  }

  std::string listed(const std::vector<std::string>& items) const {
    std::string text;
    for (size_t i = 0; i < items.size(); ++i) {
      if (static_cast<int>(i) == o_.max_listed) {
        text += fmt::format(" ... {} more (--json lists all)", items.size() - i);
        break;
      }
      text += (i ? ", " : "") + items[i];
    }
    return text;
  }

  int exit_code() const {
    bool damaged = false, incomplete = false;
    for (const auto& p : problems_) {
      (p.severity == Severity::kDamaged ? damaged : incomplete) = true;
    }
    return damaged ? kExitIoError : incomplete ? kExitVerifyIncomplete : kExitOk;
  }

  int report(const OutputIndex* index) const {
    int64_t datasets = 0, attributes = 0, bad_shards = 0;
    uint64_t bytes = 0;
    for (const auto& s : shards_) {
      datasets += s.datasets_read;
      attributes += s.attributes_read;
      bytes += s.bytes_read;
      bad_shards += s.ok ? 0 : 1;
    }
    const int code = exit_code();
    const char* verdict = code == kExitOk ? "ok" : code == kExitIoError ? "damaged" : "incomplete";
    if (o_.json) {
      nlohmann::json j;
      j["output"] = dir_.string();
      j["ok"] = code == kExitOk;
      j["verdict"] = verdict;
      j["exit_code"] = code;
      j["total_samples"] = index ? index->total_samples : 0;
      j["samples_with_embeddings"] = samples_;
      j["failure_records"] = failure_records_;
      j["datasets_read"] = datasets;
      j["attributes_read"] = attributes;
      j["bytes_read"] = bytes;
      j["shards"] = nlohmann::json::array();
      for (const auto& s : shards_) {
        j["shards"].push_back({{"file", s.entry->file},
                               {"ok", s.ok},
                               {"datasets_read", s.datasets_read},
                               {"bytes_read", s.bytes_read}});
      }
      j["problems"] = nlohmann::json::array();
      for (const auto& p : problems_) {
        j["problems"].push_back(
            {{"severity", p.severity == Severity::kDamaged ? "damaged" : "incomplete"},
             {"shard", p.shard},
             {"problem", p.what},
             {"fix", p.fix}});
      }
      j["notes"] = notes_;
      if (!o_.inputs.empty()) {
        j["input"] = {{"path", input_text_},
                      {"samples", input_samples_},
                      {"accounted_for", accounted_},
                      {"missing_ids", missing_}};
        j["input"]["ids_not_in_input"] = nlohmann::json::array();
        for (const auto& [id, file] : foreign_) {
          j["input"]["ids_not_in_input"].push_back({{"id", id}, {"shard", file}});
        }
      }
      std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      return code;
    }
    for (const auto& p : problems_) {
      const std::string where = p.shard.empty() ? dir_.string() : (dir_ / p.shard).string();
      std::cout << fmt::format("{}: {}: {}\n  fix: {}\n",
                               p.severity == Severity::kDamaged ? "DAMAGED" : "INCOMPLETE", where,
                               p.what, p.fix);
    }
    for (const auto& note : notes_) std::cout << "note: " << note << "\n";
    std::string input_part;
    if (!o_.inputs.empty()) {
      input_part = fmt::format("; input: {} of {} ids accounted for", accounted_, input_samples_);
    }
    std::cout << fmt::format(
        "verify {}: {}: {} shard(s), {} damaged; {} datasets and {} attributes read ({:.1f} MB); "
        "{} samples with embeddings, {} failure records{}; {} problem(s)\n",
        dir_.string(), verdict, shards_.size(), bad_shards, datasets, attributes,
        static_cast<double>(bytes) / 1e6, samples_, failure_records_, input_part, problems_.size());
    return code;
  }

  const VerifyOptions& o_;
  std::filesystem::path dir_;
  std::vector<ShardReport> shards_;
  std::vector<Problem> problems_;
  std::vector<std::string> notes_;
  std::unordered_map<std::string, std::string> shard_of_id_;  // embedded id -> shard file
  std::unordered_set<std::string> failure_ids_;
  int64_t samples_ = 0;
  int64_t failure_records_ = 0;
  std::string input_text_;  // the --input values, as messages and the JSON name them
  int64_t input_samples_ = 0;
  int64_t accounted_ = 0;
  std::vector<std::string> missing_;                          // input ids the output lacks
  std::vector<std::pair<std::string, std::string>> foreign_;  // (id, shard) not in the input
};

}  // namespace

CommandFn add_verify_command(CLI::App& app) {
  auto o = std::make_shared<VerifyOptions>();
  auto* cmd = app.add_subcommand(
      "verify", "Check an output folder end to end: every shard's bytes, datasets and counts");
  cmd->add_option("output", o->output, "Output folder of a run")->required();
  cmd->add_option("-i,--input", o->inputs,
                  "The run's input (manifest, folder or tar shards; tars may be given several "
                  "times, in the order of the run's input.tars): every id must be embedded or "
                  "failed");
  cmd->add_flag("--json", o->json, "Print JSON (every problem and id listed)");
  cmd->add_option("--list", o->max_listed, "Ids to list per input problem (default 20)")
      ->check(CLI::NonNegativeNumber);
  return [o]() { return Verifier(*o).run(); };
}

}  // namespace precompute
