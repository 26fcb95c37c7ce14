#pragma once
// Test media made at test time with the ffmpeg CLI from lavfi sources, so that each test shows
// how its input is made, in a temporary folder removed when the TempDir goes out of scope.

#include <filesystem>
#include <string>

#include "pipeline/core/error.hpp"

namespace precompute::testing {

class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

// Runs `ffmpeg -y -hide_banner -loglevel error ARGS`; fails the calling test (throws) when
// ffmpeg exits non-zero, with the command line in the message.
void run_ffmpeg(const std::string& args);

// What a decode threw: its failure category's name and message, or "none" when it returned.
struct MediaOutcome {
  std::string category;
  std::string message;
};
template <class Decode>
MediaOutcome media_outcome(Decode&& decode) {
  try {
    decode();
  } catch (const MediaError& e) {
    return {std::string(failure_category_name(e.category())), e.what()};
  }
  return {"none", ""};
}

// Quotes a path for the shell.
std::string shell_quote(const std::string& text);

}  // namespace precompute::testing
