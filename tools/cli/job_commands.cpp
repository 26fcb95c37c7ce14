// `precompute merge OUT` and `precompute status OUT`: the two commands of a job split into ranks
// (docs/distributed.md). merge checks that every rank is complete with one config and one input,
// then makes OUT one output (storage/job_ranks.hpp); status shows each rank's state and the total.

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "pipeline/core/error.hpp"
#include "storage/job_ranks.hpp"
#include "storage/output_index.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"

namespace precompute {
namespace {

struct JobOptions {
  std::string output;
  int64_t world_size = 0;  // 0: the one found in OUT/ranks
  bool json = false;
};

std::optional<int64_t> chosen_world(const JobOptions& o) {
  PC_CHECK(o.world_size >= 0 && o.world_size <= kMaxWorldSize, ConfigError, "--world-size ",
           o.world_size, ": give 1 to ", kMaxWorldSize, " (or leave it out)");
  if (o.world_size == 0) return std::nullopt;
  return o.world_size;
}

std::string percent(int64_t done, int64_t total) {
  return total > 0 ? fmt::format("{:.1f}%", 100.0 * static_cast<double>(done) /
                                                static_cast<double>(total))
                   : "-";
}

}  // namespace

CommandFn add_merge_command(CLI::App& app) {
  auto o = std::make_shared<JobOptions>();
  auto* cmd = app.add_subcommand("merge",
                                 "Make the ranks of a split job one output (the last rank to "
                                 "finish does it by itself)");
  cmd->add_option("output", o->output, "Output folder of the job")->required();
  cmd->add_option("--world-size", o->world_size,
                  "The job's ranks, when the folder holds ranks of several world sizes");
  return [o]() {
    const MergeResult result = merge_job(o->output, chosen_world(*o), /*refuse=*/false);
    if (!result.merged) {
      std::cerr << "cannot merge " << o->output << ": not every rank is done:"
                << result.waiting_for << "\n";
      return kExitVerifyIncomplete;
    }
    std::cout << (result.already ? "already merged: " : "merged: ") << o->output
              << " shows every rank's shards; check it with `precompute verify " << o->output
              << "`\n";
    return kExitOk;
  };
}

CommandFn add_status_command(CLI::App& app) {
  auto o = std::make_shared<JobOptions>();
  auto* cmd = app.add_subcommand("status", "Show each rank of a split job and the total done");
  cmd->add_option("output", o->output, "Output folder of the job")->required();
  cmd->add_option("--world-size", o->world_size,
                  "The job's ranks, when the folder holds ranks of several world sizes");
  cmd->add_flag("--json", o->json, "Print JSON");
  return [o]() {
    const std::filesystem::path out = o->output;
    if (!std::filesystem::exists(out / kRanksFolderName) && o->world_size == 0) {
      // One process: its index tells the progress.
      const auto index = read_index(out);
      PC_CHECK(index.has_value(), ConfigError, out, " holds no run (no index.json, no ranks/)");
      int64_t done = 0;
      for (const auto& e : index->shards) done += e.seq_count;
      if (o->json) {
        std::cout << nlohmann::ordered_json{{"output", out.string()},
                                            {"world_size", 1},
                                            {"done", done},
                                            {"total", index->total_samples}}
                         .dump(2)
                  << "\n";
      } else {
        std::cout << fmt::format("{}: one process, {} of {} samples done ({})\n", out.string(),
                                 done, index->total_samples, percent(done, index->total_samples));
      }
      return kExitOk;
    }
    const JobState job = read_job(out, chosen_world(*o));
    const auto merged_words = [&]() -> std::string {
      switch (job.merged) {
        case MergedKind::kNotMerged: return "not merged yet";
        case MergedKind::kCurrent: return "merged";
        case MergedKind::kOutOfDate:
          return "not merged: " + out.string() + " " + job.merged_why +
                 (job.all_done() ? "; run `precompute merge " + out.string() + "`" : "");
        case MergedKind::kOtherIndex: return "not merged: " + out.string() + " " + job.merged_why;
      }
      return "";
    };
    if (o->json) {
      nlohmann::ordered_json ranks = nlohmann::ordered_json::array();
      for (const auto& r : job.ranks) {
        nlohmann::ordered_json item = {{"rank", r.rank},
                                       {"state", rank_state_name(r.kind)},
                                       {"first_seq", r.span.first_seq},
                                       {"end_seq", r.span.end_seq},
                                       {"done", r.done},
                                       {"samples", r.span.samples()},
                                       {"problem", r.problem}};
        if (r.record) {
          item["pid"] = r.record->pid;
          item["host"] = r.record->host;
          item["message"] = r.record->message;
        }
        if (r.kind != RankState::Kind::kDone) item["rerun"] = job.rerun_command(r.rank);
        ranks.push_back(std::move(item));
      }
      std::cout << nlohmann::ordered_json{{"output", out.string()},
                                          {"world_size", job.world_size},
                                          {"other_world_sizes", job.other_world_sizes},
                                          {"done", job.done()},
                                          {"total", job.total_samples},
                                          {"merged", job.merged == MergedKind::kCurrent},
                                          {"merge_state", merged_words()},
                                          {"ranks", std::move(ranks)}}
                       .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
                << "\n";
      return kExitOk;
    }
    std::cout << fmt::format("{}: a job of {} rank(s)", out.string(), job.world_size);
    if (job.total_samples >= 0) {
      std::cout << fmt::format(" over {} samples in shards of {}", job.total_samples,
                               job.shard_size);
    }
    std::cout << "\n";
    for (const int64_t w : job.other_world_sizes) {
      std::cout << fmt::format("  (its ranks/ also holds the folders of a job of {} rank(s); "
                               "pass --world-size {} to see that one)\n", w, w);
    }
    for (const auto& r : job.ranks) {
      std::string line = fmt::format("  rank {:>5}: {}", r.rank, rank_state_name(r.kind));
      if (r.kind == RankState::Kind::kRunning && r.record) {
        line += fmt::format(" (pid {} on {})", r.record->pid, r.record->host);
      }
      if (r.kind == RankState::Kind::kStopped && r.record) {
        line += fmt::format(" (last run: pid {} on {})", r.record->pid, r.record->host);
      }
      if (job.total_samples >= 0) {
        line += r.span.empty() ? std::string(", no work")
                               : fmt::format(", {} of {} samples (positions {} to {})", r.done,
                                             r.span.samples(), r.span.first_seq,
                                             r.span.end_seq - 1);
      }
      if (r.kind == RankState::Kind::kFailed && r.record) line += ": " + r.record->message;
      if (!r.problem.empty()) line += ": " + r.problem;
      if (r.kind != RankState::Kind::kDone && r.kind != RankState::Kind::kRunning) {
        line += "\n      rerun it: " + job.rerun_command(r.rank);
      }
      std::cout << line << "\n";
    }
    if (job.total_samples >= 0) {
      std::cout << fmt::format("total: {} of {} samples done ({}); {}\n", job.done(),
                               job.total_samples, percent(job.done(), job.total_samples),
                               merged_words());
    } else {
      std::cout << "total: no rank has started\n";
    }
    return kExitOk;
  };
}

}  // namespace precompute
