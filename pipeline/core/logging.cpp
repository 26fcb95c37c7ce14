#include "pipeline/core/logging.hpp"

#include <spdlog/cfg/env.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

namespace precompute {

void setup_logging(const std::string& level) {
  // May run twice (once at start, once the config's level is known): reuse the logger.
  auto logger = spdlog::get("precompute");
  if (!logger) {
    logger = spdlog::stderr_color_mt("precompute");
    logger->set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
    spdlog::set_default_logger(logger);
  }
  spdlog::set_level(spdlog::level::from_str(level == "warning" ? "warn" : level));
  spdlog::cfg::load_env_levels();
}

bool log_enabled(LogLevel level) {
  switch (level) {
    case LogLevel::kTrace:
      return spdlog::should_log(spdlog::level::trace);
    case LogLevel::kDebug:
      return spdlog::should_log(spdlog::level::debug);
    case LogLevel::kInfo:
      return spdlog::should_log(spdlog::level::info);
    case LogLevel::kWarn:
      return spdlog::should_log(spdlog::level::warn);
    case LogLevel::kError:
      return spdlog::should_log(spdlog::level::err);
  }
  return true;
}

void log_message(LogLevel level, const std::string& message) {
  switch (level) {
    case LogLevel::kTrace:
      spdlog::trace("{}", message);
      break;
    case LogLevel::kDebug:
      spdlog::debug("{}", message);
      break;
    case LogLevel::kInfo:
      spdlog::info("{}", message);
      break;
    case LogLevel::kWarn:
      spdlog::warn("{}", message);
      break;
    case LogLevel::kError:
      spdlog::error("{}", message);
      break;
  }
}

}  // namespace precompute
