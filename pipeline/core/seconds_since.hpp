#pragma once
// Seconds on the steady clock since `start`, for durations in logs, rates and estimates.

#include <chrono>

namespace precompute {

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace precompute
