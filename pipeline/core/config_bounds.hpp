#pragma once
// The range of a numeric config key, and the messages that quote it.

#include <cstdint>
#include <string>
#include <string_view>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Config bounds]
// Every number a config file or a `run` flag sets has a range (the key lists in config.hpp).
// validate() checks them after the flags are applied, and the readers quote the same range when
// the YAML number does not fit the field at all (99999999999 for an int, 1e10 for any integer).
// The ranges are far beyond real use; they exist so that nothing downstream overflows or runs
// away: seconds become int64 clock ticks (wait_for and the watchdog's 2 * sample_timeout_s + 5
// wrap into the past beyond about 292 years, so every wait ends at once), audio seconds are
// multiplied by sample rates, thread counts become threads started at once, and counts are summed
// into batch, shard and in-flight limits. NaN fails every comparison, so each check asks
// "inside?", never "outside?".
struct Bound {
  bool integer = false;
  double lo = 0;
  double hi = 0;
  bool above_lo = false;  // lo itself is refused (a limit of 0 s would refuse every sample)
  std::string_view zero;  // when set, 0 is allowed besides [lo, hi] and means this
  std::string_view note;  // units and special values, shown after the range

  constexpr Bound zero_means(std::string_view z) const {
    Bound b = *this;
    b.zero = z;
    return b;
  }
  constexpr Bound noted(std::string_view n) const {
    Bound b = *this;
    b.note = n;
    return b;
  }
};

// An integer in [lo, hi].
constexpr Bound count(double lo, double hi) {
  Bound b;
  b.integer = true;
  b.lo = lo;
  b.hi = hi;
  return b;
}

// A real number in [lo, hi].
constexpr Bound number(double lo, double hi) {
  Bound b = count(lo, hi);
  b.integer = false;
  return b;
}

// A real number in (lo, hi].
constexpr Bound above(double lo, double hi) {
  Bound b = number(lo, hi);
  b.above_lo = true;
  return b;
}

// "an integer from 0 to 1024 (0: one per core)" and the like.
std::string range_text(const Bound& b);
// Where a wrong value came from: the file, or also `flag` when one sets the key.
std::string origin_text(std::string_view flag);
bool in_bounds(const Bound& b, double value);

// A value as a message shows it: the shortest text that reads back as the same number.
std::string value_text(int value);
std::string value_text(int64_t value);
std::string value_text(float value);
std::string value_text(double value);

// Throws ConfigError naming `key` (the element, for a list), its range and `value`.
template <class T>
void check_bound(std::string_view key, const Bound& b, std::string_view flag, T value) {
  PC_CHECK(in_bounds(b, static_cast<double>(value)), ConfigError, "config key '", key,
           "' must be ", range_text(b), ", got ", value_text(value), origin_text(flag));
}

}  // namespace precompute
