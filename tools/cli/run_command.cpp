// `precompute run --config FILE [overrides]`

#include <spdlog/spdlog.h>

#include <unistd.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

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
    // The flags the config table declares (config_flags()), by long name; a std::map, so that
    // CLI11 may keep pointers into it.
    std::map<std::string, FlagValue, std::less<>> values;
    std::vector<std::pair<std::string, CLI::Option*>> given;
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

  return [=]() {
    Config config = load_config(o->config);
    ConfigOverrides overrides;
    for (const auto& [name, option] : o->given) {
      const auto& value = o->values.at(name);
      // An empty text flag (--input "") leaves the file's value, as a flag not given does.
      const auto* text = std::get_if<std::string>(&value);
      if (option->count() > 0 && !(text && text->empty())) overrides.set(name, value);
    }
    apply_overrides(config, overrides);
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
