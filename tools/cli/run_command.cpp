// `precompute run --config FILE [overrides]`

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "encoders/bert/text_settings.hpp"
#include "encoders/package_settings.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/core/logging.hpp"
#include "pipeline/core/partition.hpp"
#include "pipeline/core/pause_clock.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/empty_modalities.hpp"
#include "pipeline/media/nvdec.hpp"
#include "pipeline/report_files.hpp"
#include "pipeline/runner.hpp"
#include "pipeline/summary_file.hpp"
#include "storage/job_ranks.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"
#include "tools/cli/supervisor.hpp"

namespace precompute {
namespace {

// Note [The last rank merges]
// A rank that finishes checks whether every rank of its job is done; the last one merges, so a
// job needs no extra step. Two ranks finishing together may both see every rank done: the
// output's lock lets one merge, and the other finds the output already merged (or, when it gets
// the lock first, merges the same shards again, which writes the same files). Any problem
// here is logged, never the rank's exit code: the rank's own work is committed, and `precompute
// merge OUT` says what is missing.
void merge_if_last(const std::filesystem::path& output, const Partition& partition) {
  try {
    const MergeResult merged = merge_job(output, partition.world_size, /*refuse=*/false);
    if (merged.already) {
      spdlog::info("{} already shows every rank's shards", output.string());
    } else if (!merged.merged) {
      spdlog::info("rank {} of {} is done; the job is merged when every rank is:{}",
                   partition.rank, partition.world_size, merged.waiting_for);
    }
  } catch (const OutputLockedError&) {
    spdlog::info("another rank is merging {}", output.string());
  } catch (const Error& e) {
    spdlog::warn("this rank is done, but merging the job failed: {}; run `precompute merge {}`",
                 e.what(), output.string());
  }
}

// run.max_failures as a message shows it: "5", "50%".
std::string failure_limit(const RunSection& run) {
  return run.max_failure_fraction >= 0 ? fmt::format("{:g}%", 100 * run.max_failure_fraction)
                                       : std::to_string(run.max_failures);
}

// The exit code of a run that ended without an error (`error` null) or with one: 3 when failed
// samples exceed the limit, or a modality embedded nothing (Note [A modality that embeds
// nothing]).
int run_exit_code(const RunSummary& summary, const std::exception* error, const RunSection& run) {
  if (error != nullptr) {
    const auto* e = dynamic_cast<const Error*>(error);
    return e != nullptr ? exit_code_for(*e) : kExitInternal;
  }
  return summary.over_failure_limit(run) || !summary.empty_modalities.empty()
             ? kExitTooManyFailures
             : kExitOk;
}

// A summary at run.summary_json for an end the run did not report itself (Note [Reporting a
// run's end] in pipeline/runner.cpp): a refusal before the output changed, a rank without work,
// a child the supervisor saw die or gave up on. Only that file: the output folder is not this
// process's to write then. A summary that cannot be written is a warning beside the end's own
// exit code.
void report_unreported_end(RunSummary summary, const Config& config, const Partition& partition,
                           int exit_code, const std::string& message) {
  if (config.run.summary_json.empty()) return;
  summary.output = partition.split()
                       ? rank_folder(config.output.path, partition.rank, partition.world_size)
                       : config.output.path;
  summary.rank = partition.rank;
  summary.world_size = partition.world_size;
  summary.exit_code = exit_code;
  summary.message = message;
  if (summary.start_up.empty()) summary.start_up = start_up_marks();
  try {
    write_summary_files(summary, config.run.summary_json, /*keep_in_output=*/false);
  } catch (const Error& e) {
    spdlog::warn("cannot write the run's summary: {}", e.what());
  }
}

// How far a command got towards reporting its end (Note [Reporting a run's end] in
// pipeline/runner.cpp): its rank, its report files placed and checked, its summary written.
struct ReportState {
  std::optional<Partition> partition;
  bool placed = false;
  bool reported = false;
};

// A command that failed before its run reported: its summary at run.summary_json when the path
// can be known and checked (the rank taken from the environment again if need be); no summary
// when the path itself is what is wrong.
void report_refusal(Config& config, const PartitionFlags& flags, const ReportState& state,
                    const std::exception& error) {
  Partition partition;
  try {
    partition = state.partition ? *state.partition : resolve_partition(flags);
    if (!state.placed) place_report_files(config, partition);
  } catch (const Error&) {
    return;
  }
  report_unreported_end({}, config, partition, run_exit_code({}, &error, config.run), error.what());
}

// The command once its config is read: checks, the supervisor, the run, the merge.
int run_configured(Config& config, const PartitionFlags& partition_flags,
                   const std::vector<std::string>& command_line, ReportState& state) {
  if (config.text.enabled) resolve_text_settings(config.text);
  resolve_package_settings(config);
  validate(config);
  setup_logging(config.run.log_level);
  // Note [Where a text setting comes from]: each value, once per command.
  for (const EncoderSection* section : {static_cast<const EncoderSection*>(&config.video),
                                        static_cast<const EncoderSection*>(&config.audio),
                                        static_cast<const EncoderSection*>(&config.text)}) {
    for (const auto& s : section->origins) spdlog::info("{}: {} ({})", s.key, s.value, s.source);
  }
  state.partition = resolve_partition(partition_flags);
  const Partition& partition = *state.partition;
  PC_CHECK(!(partition.split() && config.output.retry_failed), ConfigError,
           "--retry-failed is not for one rank: redone shards get new numbers, which would "
           "collide between ranks. Run it on the merged output as one process: precompute run "
           "--config ... --retry-failed --world-size 1 (docs/distributed.md)");
  // Where this process reports (Note [Where a run reports] in pipeline/report_files.cpp).
  place_report_files(config, partition);
  state.placed = true;
  // The folder this process writes: the output, or its rank folder.
  std::filesystem::path folder = config.output.path;
  if (partition.split()) {
    folder = rank_folder(config.output.path, partition.rank, partition.world_size);
    spdlog::info("rank {} of {} (from {}); this rank writes {}", partition.rank,
                 partition.world_size, partition.source, folder.string());
  } else if (!partition.source.empty()) {
    spdlog::info("world size 1 (from {}): one process runs the whole input", partition.source);
  }

  // After this command, run.summary_json holds its summary or nothing: never an older run's.
  remove_earlier_summary(config);
  SharedFlag overwritten;  // Note [Overwrite once] in pipeline/runner.cpp
  SharedFlag quarantined;  // Note [Decoding while the encoders load] in pipeline/early_decoding.cpp
  RunContext context;
  if (config.run.supervise) {
    // Forks before anything starts threads or the GPU; the parent only waits and restarts.
    if (const auto exit_code = supervise(folder, config.run.max_restarts, &quarantined)) {
      state.reported = true;  // by the child, or here
      if (!config.run.summary_json.empty() && !std::filesystem::exists(config.run.summary_json)) {
        report_unreported_end({}, config, partition, *exit_code,
                              "the run ended without writing its summary: it was killed, or "
                              "kept crashing until its supervisor gave up (see the log)");
      }
      return *exit_code;
    }
    // Other runs name the supervisor: stopping it stops the run, killing a child restarts it.
    context.owner_pid = static_cast<int>(::getppid());
  }
  context.overwrite_done = overwritten.is_set();
  context.quarantine_is_this_commands = quarantined.is_set();
  context.after_overwrite = [&overwritten] { overwritten.set(); };
  context.partition = partition;
  context.command = command_line;
  std::error_code no_folder;
  context.working_folder = std::filesystem::current_path(no_folder).string();
  context.exit_code = [&](const RunSummary& summary, const std::exception* error) {
    state.reported = true;
    return run_exit_code(summary, error, config.run);
  };
  install_stop_handlers();
  install_continue_handler();  // Note [Paused runs] in pipeline/core/pause_clock.cpp
  // This process ends with the run (Note [Sessions left to the process's exit]).
  if (!tears_down_at_exit()) NvdecPool::leave_sessions_to_process_exit();
  RunSummary summary = run_precompute(config, context);
  if (!state.reported) {
    summary.exit_code = run_exit_code(summary, nullptr, config.run);
    report_unreported_end(summary, config, partition, summary.exit_code, "");
    state.reported = true;
  }
  spdlog::info("done: {}", format_summary(summary));
  if (partition.split()) merge_if_last(config.output.path, partition);
  if (summary.exit_code == kExitTooManyFailures && summary.over_failure_limit(config.run)) {
    spdlog::error("{} of {} samples failed, over the limit of {} (--max-failures, "
                  "run.max_failures; by default more than half); see `precompute inspect {}` "
                  "for the failure records",
                  summary.output_failed_samples, summary.total_samples,
                  failure_limit(config.run), summary.output.string());
  }
  // Last, so that the log ends with the cause (Note [A modality that embeds nothing]).
  if (summary.exit_code == kExitTooManyFailures && !summary.empty_modalities.empty()) {
    spdlog::error("{} configured modality(ies) embedded nothing, which fails the run whatever "
                  "--max-failures says (exit 3); `precompute inspect {}` lists every failure "
                  "record",
                  summary.empty_modalities.size(), summary.output.string());
    for (const auto& empty : summary.empty_modalities) {
      spdlog::error("{}", describe_empty_modality(empty));
    }
  }
  return summary.exit_code;
}

}  // namespace

CommandFn add_run_command(CLI::App& app, std::vector<std::string> command_line) {
  struct Options {
    std::string config;
    // The flags the config table declares (config_flags()), by long name; a std::map, so that
    // CLI11 may keep pointers into it.
    std::map<std::string, FlagValue, std::less<>> values;
    std::vector<std::pair<std::string, CLI::Option*>> given;
    // Text, so that the environment's values and these get the same checks and messages
    // (resolve_partition).
    std::string rank;
    std::string world_size;
    CLI::Option* rank_option = nullptr;
    CLI::Option* world_size_option = nullptr;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("run", "Embed every sample of the input into HDF5 shards");
  cmd->add_option("-c,--config", o->config, "YAML config (see configs/reference.yaml)")
      ->required();
  // Numbers are range-checked by validate(), with the key, the flag and the allowed range in
  // the message; a flag given is always applied, whatever its value.
  for (const auto& flag : config_flags()) {
    const std::string name(flag.name());
    const std::string names(flag.names);
    const std::string help(flag.help);
    auto& value = o->values[name];
    CLI::Option* option = nullptr;
    switch (flag.kind) {
      case FlagKind::kSwitch:
        value = false;
        option = cmd->add_flag(names, std::get<bool>(value), help);
        break;
      case FlagKind::kInt:
        value = 0;
        option = cmd->add_option(names, std::get<int>(value), help);
        break;
      case FlagKind::kInt64:
        value = int64_t{0};
        option = cmd->add_option(names, std::get<int64_t>(value), help);
        break;
      case FlagKind::kDouble:
        value = 0.0;
        option = cmd->add_option(names, std::get<double>(value), help);
        break;
      case FlagKind::kText:
        value = std::string();
        option = cmd->add_option(names, std::get<std::string>(value), help);
        break;
    }
    o->given.emplace_back(name, option);
  }
  o->rank_option = cmd->add_option(
      "--rank", o->rank,
      "This process's rank (0 to world size - 1) in a job split across processes; default: from "
      "SLURM_ARRAY_TASK_ID, SLURM_PROCID, RANK or JOB_COMPLETION_INDEX (docs/distributed.md)");
  o->world_size_option = cmd->add_option(
      "--world-size", o->world_size,
      "Ranks of the job; default: the environment's count, or run.world_size");

  return [o, command_line = std::move(command_line)]() {
    Config config = load_config(o->config);
    ConfigOverrides overrides;
    for (const auto& [name, option] : o->given) {
      const auto& value = o->values.at(name);
      // An empty text flag (--input "") leaves the file's value, as a flag not given does.
      const auto* text = std::get_if<std::string>(&value);
      if (option->count() > 0 && !(text && text->empty())) overrides.set(name, value);
    }
    apply_overrides(config, overrides);
    PartitionFlags partition_flags;
    if (o->rank_option->count() > 0) partition_flags.rank = o->rank;
    if (o->world_size_option->count() > 0) partition_flags.world_size = o->world_size;
    partition_flags.config_world_size = config.run.world_size;
    ReportState state;
    try {
      return run_configured(config, partition_flags, command_line, state);
    } catch (const std::exception& e) {
      if (!state.reported) report_refusal(config, partition_flags, state, e);
      throw;
    }
  };
}

}  // namespace precompute
