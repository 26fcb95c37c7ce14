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
