#include "pipeline/core/crash_point.hpp"

#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <string>

namespace precompute {
namespace {

struct CrashSetting {
  std::string point;  // empty: no crash point armed
  long nth = 1;
};

const CrashSetting& setting() {
  static const CrashSetting parsed = [] {
    CrashSetting s;
    const char* value = std::getenv("PRECOMPUTE_CRASH_AT");
    if (value == nullptr) return s;
    std::string text(value);
    if (const auto at = text.find('@'); at != std::string::npos) {
      s.nth = std::strtol(text.c_str() + at + 1, nullptr, 10);
      text.resize(at);
    }
    s.point = text;
    return s;
  }();
  return parsed;
}

}  // namespace

void crash_point(std::string_view point) {
  const auto& s = setting();
  if (s.point.empty() || s.point != point) return;
  static std::atomic<long> reached{0};
  if (reached.fetch_add(1) + 1 == s.nth) ::raise(SIGKILL);
}

}  // namespace precompute
