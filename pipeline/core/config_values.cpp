// Values a config key or a flag gives as text: sizes, memory budgets, failure limits.

#include <fmt/format.h>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <utility>

#include "pipeline/core/config.hpp"
#include "pipeline/core/error.hpp"

namespace precompute {

int64_t MemoryBudget::bytes_of(int64_t total_bytes) const {
  if (bytes > 0) return bytes;
  return static_cast<int64_t>(fraction * static_cast<double>(total_bytes));
}

namespace {

// The number and unit of "4GiB", "1.5 GB", "300"; false when it is not of that form.
bool split_size(const std::string& text, double& number, std::string& unit) {
  size_t used = 0;
  try {
    number = std::stod(text, &used);
  } catch (const std::exception&) {
    return false;
  }
  unit = text.substr(used);
  unit.erase(0, unit.find_first_not_of(' '));
  return std::isfinite(number) && number >= 0;
}

double unit_bytes(const std::string& unit) {
  static const std::array<std::pair<const char*, double>, 9> kUnits = {{
      {"", 1.0}, {"B", 1.0}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
      {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0},
  }};
  for (const auto& [name, factor] : kUnits) {
    if (unit == name) return factor;
  }
  return unit == "TiB" ? 1099511627776.0 : -1.0;
}

}  // namespace

int64_t parse_byte_size(const std::string& text, std::string_view key) {
  double number = 0;
  std::string unit;
  const bool ok = split_size(text, number, unit) && unit_bytes(unit) > 0;
  PC_CHECK(ok && number * unit_bytes(unit) >= 1 && number * unit_bytes(unit) < 9.2e18,
           ConfigError, key, " '", text, "' is not a size; write it like 8GiB, 512MiB, 4GB or "
           "a number of bytes");
  return static_cast<int64_t>(number * unit_bytes(unit));
}

MemoryBudget parse_memory_budget(const std::string& text, std::string_view key) {
  double number = 0;
  std::string unit;
  MemoryBudget budget;
  if (split_size(text, number, unit) && (unit == "%" || (unit.empty() && number <= 1.0))) {
    budget.fraction = unit == "%" ? number / 100.0 : number;
    // Below a thousandth of a card no encoder's weights fit; say so now, not at calibration.
    PC_CHECK(budget.fraction >= 0.001 && budget.fraction <= 1.0, ConfigError, key, " '", text,
             "' must be a fraction of the card from 0.001 to 1 (or 0.1% to 100%), or a size "
             "such as 8GiB");
    return budget;
  }
  try {
    budget.bytes = parse_byte_size(text, key);
  } catch (const ConfigError&) {
    PC_THROW(ConfigError, key, " '", text, "' is neither a size (8GiB, 512MiB, 4GB) nor a "
             "fraction of the card (0.8 or 80%)");
  }
  return budget;
}

std::string format_bytes(int64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b >= 1073741824.0) return fmt::format("{:.2f} GiB", b / 1073741824.0);
  if (b >= 1048576.0) return fmt::format("{:.1f} MiB", b / 1048576.0);
  if (b >= 1024.0) return fmt::format("{:.1f} KiB", b / 1024.0);
  return fmt::format("{} B", bytes);
}

void parse_max_failures(const std::string& text, RunSection& run) {
  // One message for every malformed form: std::stod and std::stoll throw on text that is not a
  // number or does not fit, and NaN fails the range check.
  const auto refuse = [&] {
    PC_THROW(ConfigError, "config key 'run.max_failures' must be a count from -1 (no limit) up, "
             "or a percentage from 0% to 100% such as 1%, got '", text,
             "' (config file or --max-failures)");
  };
  size_t used = 0;
  try {
    if (!text.empty() && text.back() == '%') {
      const double pct = std::stod(text.substr(0, text.size() - 1), &used);
      if (used != text.size() - 1 || !(pct >= 0 && pct <= 100)) refuse();
      run.max_failure_fraction = pct / 100.0;
      run.max_failures = -1;
      return;
    }
    const long long count = std::stoll(text, &used);
    if (used != text.size() || count < -1) refuse();
    run.max_failures = count;
    run.max_failure_fraction = -1.0;
  } catch (const std::logic_error&) {
    refuse();
  }
}

}  // namespace precompute
