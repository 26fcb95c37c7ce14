#include "pipeline/core/failure.hpp"

#include <array>

namespace precompute {
namespace {

struct CategoryName {
  FailureCategory category;
  std::string_view name;
};

constexpr std::array<CategoryName, 13> kCategoryNames = {{
    {FailureCategory::kMissing, "missing"},
    {FailureCategory::kUnreadable, "unreadable"},
    {FailureCategory::kNoStream, "no_stream"},
    {FailureCategory::kDecodeError, "decode_error"},
    {FailureCategory::kTooLarge, "too_large"},
    {FailureCategory::kTooLong, "too_long"},
    {FailureCategory::kTimeout, "timeout"},
    {FailureCategory::kBadText, "bad_text"},
    {FailureCategory::kEncodeError, "encode_error"},
    {FailureCategory::kOom, "oom"},
    {FailureCategory::kUnsupported, "unsupported"},
    {FailureCategory::kCrashed, "crash"},
    {FailureCategory::kNoInput, "no_input"},
}};

}  // namespace

std::string_view failure_category_name(FailureCategory category) {
  for (const auto& entry : kCategoryNames) {
    if (entry.category == category) return entry.name;
  }
  return "unknown";
}

std::optional<FailureCategory> parse_failure_category(std::string_view name) {
  for (const auto& entry : kCategoryNames) {
    if (entry.name == name) return entry.category;
  }
  return std::nullopt;
}

}  // namespace precompute
