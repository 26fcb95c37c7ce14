// `precompute run --config FILE [overrides]`

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <memory>

#include "encoders/bert/text_settings.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/logging.hpp"
#include "pipeline/core/pause_clock.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/runner.hpp"
#include "tools/cli/commands.hpp"
#include "tools/cli/exit_codes.hpp"
#include "tools/cli/supervisor.hpp"

namespace precompute {

CommandFn add_run_command(CLI::App& app) {
  struct Options {
    std::string config;
    std::string input, output, device, max_failures, log_level, gpu_memory_budget,
        host_memory_budget;
    int batch_size = 0, decode_threads = -1, torch_threads = -1;
    int64_t shard_size = 0;
    double progress_interval = -1;
    bool overwrite = false;
    bool retry_failed = false;
    bool no_supervisor = false;
  };
  auto o = std::make_shared<Options>();
  auto* cmd = app.add_subcommand("run", "Embed every sample of the input into HDF5 shards");
  cmd->add_option("-c,--config", o->config, "YAML config (see configs/reference.yaml)")
      ->required();
  cmd->add_option("-i,--input", o->input, "Manifest (.jsonl/.csv/.tsv) or media folder");
  cmd->add_option("-o,--output", o->output, "Output folder");
  cmd->add_option("--device", o->device, "Device of every encoder: cpu, cuda, cuda:N");
  // Numbers are range-checked by validate(), with the key, the flag and the allowed range in
  // the message; a flag given is always applied, whatever its value.
  auto* batch_size = cmd->add_option("--batch-size", o->batch_size,
                                     "Samples per batch, every encoder");
  auto* shard_size = cmd->add_option("--shard-size", o->shard_size, "Samples per shard");
  cmd->add_option("--max-failures", o->max_failures,
                  "Failed samples allowed before exit code 3: a count, or a percentage like 1%");
  auto* decode_threads = cmd->add_option("--decode-threads", o->decode_threads,
                                         "Samples decoded at once (0: cores)");
  auto* torch_threads = cmd->add_option("--torch-threads", o->torch_threads,
                                        "LibTorch CPU threads (0: cores)");
  auto* progress_interval = cmd->add_option("--progress-interval", o->progress_interval,
                                            "Seconds between progress lines (0: none)");
  cmd->add_option("--log-level", o->log_level, "trace, debug, info, warn, error, off");
  cmd->add_flag("--overwrite", o->overwrite,
                "Start over: remove an earlier run's files from the output folder (by default "
                "a rerun resumes it)");
  cmd->add_option("--gpu-memory-budget", o->gpu_memory_budget,
                  "Device memory per GPU: a size (8GiB) or a fraction of the card (0.8)");
  cmd->add_option("--host-memory-budget", o->host_memory_budget,
                  "Host memory for decoded samples in flight (e.g. 4GiB)");
  cmd->add_flag("--retry-failed", o->retry_failed,
                "Resume, and also redo the samples that have failure records");
  cmd->add_flag("--no-supervisor", o->no_supervisor,
                "Run in this process, without a supervisor that restarts the run after a "
                "decoder crash (for debuggers)");

  return [=]() {
    Config config = load_config(o->config);
    ConfigOverrides overrides;
    if (!o->input.empty()) overrides.input = o->input;
    if (!o->output.empty()) overrides.output = o->output;
    if (!o->device.empty()) overrides.device = o->device;
    if (batch_size->count() > 0) overrides.batch_size = o->batch_size;
    if (shard_size->count() > 0) overrides.shard_size = o->shard_size;
    if (!o->max_failures.empty()) overrides.max_failures = o->max_failures;
    if (decode_threads->count() > 0) overrides.decode_threads = o->decode_threads;
    if (torch_threads->count() > 0) overrides.torch_threads = o->torch_threads;
    if (!o->log_level.empty()) overrides.log_level = o->log_level;
    overrides.overwrite = o->overwrite;
    overrides.retry_failed = o->retry_failed;
    if (!o->gpu_memory_budget.empty()) overrides.gpu_memory_budget = o->gpu_memory_budget;
    if (!o->host_memory_budget.empty()) overrides.host_memory_budget = o->host_memory_budget;
    overrides.no_supervisor = o->no_supervisor;
    apply_overrides(config, overrides);
    if (progress_interval->count() > 0) config.run.progress_interval_s = o->progress_interval;
    if (config.text.enabled) resolve_text_settings(config.text);
    validate(config);
    setup_logging(config.run.log_level);

    SharedFlag overwritten;  // Note [Overwrite once] in pipeline/runner.cpp
    RunContext context;
    if (config.run.supervise) {
      // Forks before anything starts threads or the GPU; the parent only waits and restarts.
      if (const auto exit_code = supervise(config.output.path, config.run.max_restarts)) {
        return *exit_code;
      }
      // Other runs name the supervisor: stopping it stops the run, killing a child restarts it.
      context.owner_pid = static_cast<int>(::getppid());
    }
    context.overwrite_done = overwritten.is_set();
    context.after_overwrite = [&overwritten] { overwritten.set(); };
    install_stop_handlers();
    install_continue_handler();  // Note [Paused runs] in pipeline/core/pause_clock.cpp
    const auto summary = run_precompute(config, context);
    spdlog::info("done: {}", format_summary(summary));
    if (summary.over_failure_limit(config.run)) {
      spdlog::error("{} of {} samples failed, over the limit (--max-failures); see "
                    "`precompute inspect {}` for the failure records",
                    summary.output_failed_samples, summary.total_samples, summary.output.string());
      return kExitTooManyFailures;
    }
    return kExitOk;
  };
}

}  // namespace precompute
