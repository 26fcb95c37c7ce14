#include "pipeline/core/config_bounds.hpp"

#include <fmt/format.h>

#include <cmath>

namespace precompute {
namespace {

// Bounds are whole numbers up to 1e12 or simple decimals; printed without an exponent.
std::string number_text(double x) {
  if (std::isfinite(x) && x == std::floor(x) && std::abs(x) < 1e15) {
    return std::to_string(static_cast<int64_t>(x));
  }
  return fmt::format("{}", x);
}

}  // namespace

std::string range_text(const Bound& b) {
  std::string text;
  if (!b.zero.empty()) text += fmt::format("0 ({}) or ", b.zero);
  text += b.integer ? "an integer " : "a number ";
  text += b.above_lo ? fmt::format("above {} and at most {}", number_text(b.lo), number_text(b.hi))
                     : fmt::format("from {} to {}", number_text(b.lo), number_text(b.hi));
  if (!b.note.empty()) text += fmt::format(" ({})", b.note);
  return text;
}

std::string origin_text(std::string_view flag) {
  return flag.empty() ? std::string() : fmt::format(" (config file or {})", flag);
}

std::string value_text(int value) { return std::to_string(value); }
std::string value_text(int64_t value) { return std::to_string(value); }
std::string value_text(float value) { return fmt::format("{}", value); }
std::string value_text(double value) { return fmt::format("{}", value); }

bool in_bounds(const Bound& b, double value) {
  if (!b.zero.empty() && value == 0) return true;
  return (b.above_lo ? value > b.lo : value >= b.lo) && value <= b.hi;
}

}  // namespace precompute
