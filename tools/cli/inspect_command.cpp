// `precompute inspect OUT`: what an output folder holds: shards, counts, dims, dtypes and the
// failure records; checks every shard's size and checksum against the index.

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <iostream>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>

#include "pipeline/core/error.hpp"
#include "storage/output_index.hpp"
#include "storage/shard_reader.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

struct InspectOptions {
  std::string output;
  bool json = false;
  int max_failures_listed = 20;
};

struct ShardCheck {
  const IndexEntry* entry = nullptr;
  bool ok = false;
  std::string problem;
  std::vector<FailureRecord> failures;
};

ShardCheck check_shard(const std::filesystem::path& dir, const IndexEntry& entry) {
  ShardCheck check;
  check.entry = &entry;
  const auto file = dir / entry.file;
  check.problem = committed_shard_problem(dir, entry);
  if (!check.problem.empty()) return check;
  try {
    auto shard = read_shard(file);
    if (static_cast<int64_t>(shard.contents.samples.size()) != entry.num_samples) {
      check.problem = fmt::format("{} samples, index says {}", shard.contents.samples.size(),
                                  entry.num_samples);
      return check;
    }
    check.failures = std::move(shard.contents.failures);
  } catch (const StorageError& e) {
    check.problem = e.what();
    return check;
  }
  check.ok = true;
  return check;
}

int inspect(const InspectOptions& o) {
  const std::filesystem::path dir = o.output;
  const auto index = read_index(dir);
  PC_CHECK(index.has_value(), StorageError, dir,
           " holds no precompute output (no index.json); give the folder a run wrote to");
  std::vector<ShardCheck> checks;
  for (const auto& entry : index->shards) checks.push_back(check_shard(dir, entry));

  int64_t samples = 0, failures = 0, bytes = 0, covered = 0;
  std::array<int64_t, kNumModalities> per_modality{};
  std::map<std::string, int64_t> by_category;
  std::vector<const FailureRecord*> failure_list;
  bool all_ok = true;
  for (const auto& c : checks) {
    samples += c.entry->num_samples;
    failures += c.entry->num_failures;
    bytes += static_cast<int64_t>(c.entry->bytes);
    covered += c.entry->seq_count;
    for (int m = 0; m < kNumModalities; ++m) per_modality[m] += c.entry->modality_counts[m];
    all_ok = all_ok && c.ok;
    for (const auto& f : c.failures) {
      ++by_category[std::string(failure_category_name(f.category))];
      failure_list.push_back(&f);
    }
  }
  const bool complete = covered == index->total_samples;

  if (o.json) {
    nlohmann::json j;
    j["output"] = dir.string();
    j["complete"] = complete;
    j["ok"] = all_ok;
    j["total_samples"] = index->total_samples;
    j["samples_with_embeddings"] = samples;
    j["failure_records"] = failures;
    j["bytes"] = bytes;
    j["config_fingerprint"] = index->meta.config_fingerprint;
    j["storage_dtype"] = storage_dtype_name(index->meta.dtype);
    j["columns"] = index->meta.kept_columns;  // output.keep_columns: /columns/<name>
    for (const auto& schema : index->meta.modalities) {
      if (!schema) continue;
      j["modalities"][std::string(modality_name(schema->modality))] = {
          {"dim", schema->dim},
          {"layout", schema->per_step ? "per_step" : "pooled"},
          {"encoder", schema->encoder},
          {"pooling", schema->pooling},
          {"samples", per_modality[modality_index(schema->modality)]}};
    }
    j["shards"] = nlohmann::json::array();
    for (const auto& c : checks) {
      j["shards"].push_back({{"file", c.entry->file},
                             {"first_seq", c.entry->first_seq},
                             {"seq_count", c.entry->seq_count},
                             {"samples", c.entry->num_samples},
                             {"failures", c.entry->num_failures},
                             {"bytes", c.entry->bytes},
                             {"ok", c.ok},
                             {"problem", c.problem}});
    }
    j["failures_by_category"] = by_category;
    j["failures"] = nlohmann::json::array();
    for (const auto* f : failure_list) {
      j["failures"].push_back({{"seq", f->seq},
                               {"id", f->id},
                               {"modality", modality_name(f->modality)},
                               {"category", failure_category_name(f->category)},
                               {"message", f->message}});
    }
    // Ids, paths and failure messages of outputs written before ids were checked (or of paths
    // that are bytes) may not be UTF-8: shown as U+FFFD rather than failing the whole report.
    std::cout << j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << fmt::format("output {}: {} of {} samples in {} shard(s){}, {:.1f} MB, {}\n",
                             dir.string(), covered, index->total_samples, checks.size(),
                             complete ? "" : " (incomplete: rerun the same run command to resume)",
                             static_cast<double>(bytes) / 1e6,
                             storage_dtype_name(index->meta.dtype));
    std::cout << fmt::format("tool {}, config fingerprint {}\n", index->meta.tool_version,
                             index->meta.config_fingerprint.substr(0, 16));
    if (!index->meta.kept_columns.empty()) {
      std::cout << fmt::format("  columns kept: {}\n", fmt::join(index->meta.kept_columns, ", "));
    }
    for (const auto& schema : index->meta.modalities) {
      if (!schema) continue;
      std::cout << fmt::format("  {:<5} dim {:<5} {:<8} pooling {:<5} {} samples  encoder {} "
                               "({})\n",
                               modality_name(schema->modality), schema->dim,
                               schema->per_step ? "per-step" : "pooled", schema->pooling,
                               per_modality[modality_index(schema->modality)], schema->encoder,
                               schema->encoder_sha256.substr(0, 12));
    }
    for (const auto& c : checks) {
      std::cout << fmt::format("  {}  seq {}-{}  {} samples  {} failures  {:.1f} kB  {}\n",
                               c.entry->file, c.entry->first_seq,
                               c.entry->first_seq + c.entry->seq_count - 1, c.entry->num_samples,
                               c.entry->num_failures,
                               static_cast<double>(c.entry->bytes) / 1e3,
                               c.ok ? "ok" : "DAMAGED: " + c.problem);
    }
    std::cout << fmt::format("samples with embeddings: {}; failure records: {}", samples,
                             failures);
    for (const auto& [category, n] : by_category) std::cout << fmt::format(" {} {}", category, n);
    std::cout << "\n";
    int listed = 0;
    for (const auto* f : failure_list) {
      if (listed++ == o.max_failures_listed) {
        std::cout << fmt::format("  ... {} more (--failures N lists more, --json all)\n",
                                 failure_list.size() - static_cast<size_t>(o.max_failures_listed));
        break;
      }
      std::cout << fmt::format("  failed: {} {} {}: {}\n", f->id, modality_name(f->modality),
                               failure_category_name(f->category), f->message);
    }
  }
  return all_ok ? kExitOk : kExitIoError;
}

}  // namespace

CommandFn add_inspect_command(CLI::App& app) {
  auto o = std::make_shared<InspectOptions>();
  auto* cmd = app.add_subcommand(
      "inspect", "Show what an output folder holds; check each shard's size and SHA-256");
  cmd->add_option("output", o->output, "Output folder of a run")->required();
  cmd->add_flag("--json", o->json, "Print JSON (every failure record included)");
  cmd->add_option("--failures", o->max_failures_listed, "Failure records to list (default 20)")
      ->check(CLI::NonNegativeNumber);
  return [o]() { return inspect(*o); };
}

}  // namespace precompute
