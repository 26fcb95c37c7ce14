#pragma once
// A failure record: why one modality of one sample produced no embedding. Every sample of a run
// ends up embedded or recorded here (Note [Nothing is lost] in
// pipeline/stages/shard_assembler.cpp).

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "pipeline/core/modality.hpp"

namespace precompute {

enum class FailureCategory : uint8_t {
  kMissing,      // the file does not exist
  kUnreadable,   // exists but cannot be opened or read (permissions, not a regular file)
  kNoStream,     // no video (or audio) stream where one was asked for
  kDecodeError,  // the container or codec failed, or nothing could be decoded
  kTooLarge,     // over a configured size cap (pixels, bytes)
  kTooLong,      // over the configured duration cap
  kTimeout,      // over the per-sample time limit
  kBadText,      // empty or unusable caption
  kEncodeError,  // the encoder failed on the batch holding this sample
  kOom,          // did not fit in device memory even alone
  kUnsupported,  // a codec or format this build cannot handle
  kCrashed,      // the process crashed (or hung) twice while this sample was being prepared
  kNoInput,      // the sample gives no input that any configured modality uses
};

std::string_view failure_category_name(FailureCategory category);
std::optional<FailureCategory> parse_failure_category(std::string_view name);

struct FailureRecord {
  int64_t seq = 0;  // manifest position of the sample
  std::string id;
  Modality modality = Modality::kVideo;
  FailureCategory category = FailureCategory::kDecodeError;
  std::string message;  // names the input and, where there is one, the fix
};

}  // namespace precompute
