#pragma once
// Logging set-up, and a plain entry point for code that must not include spdlog (the encoders,
// see Note [Two fmt libraries] in cmake/PrecomputeDependencies.cmake). Everything else logs with
// spdlog directly, from .cpp files only. All functions are thread-safe.

#include <string>

namespace precompute {

enum class LogLevel { kTrace, kDebug, kInfo, kWarn, kError };

// Installs the stderr logger. `level` is trace/debug/info/warn/error/off; the environment
// variable SPDLOG_LEVEL, when set, wins (as in spdlog's own convention).
void setup_logging(const std::string& level);

void log_message(LogLevel level, const std::string& message);

// Whether a message of `level` would be written (to skip building one that would not).
bool log_enabled(LogLevel level);

}  // namespace precompute
