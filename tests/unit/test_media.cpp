#include "test_media.hpp"

#include <unistd.h>

#include <cstdlib>
#include <random>
#include <stdexcept>

namespace precompute::testing {

TempDir::TempDir() {
  std::random_device rd;
  const auto base = std::filesystem::temp_directory_path();
  for (int attempt = 0; attempt < 100; ++attempt) {
    auto candidate = base / ("precompute-test-" + std::to_string(::getpid()) + "-" +
                             std::to_string(rd()));
    if (std::filesystem::create_directory(candidate)) {
      path_ = candidate;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary folder under " + base.string());
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string shell_quote(const std::string& text) {
  std::string out = "'";
  for (char c : text) {
    if (c == '\'') {
      out += "'\\''";
    } else {
      out += c;
    }
  }
  return out + "'";
}

void run_ffmpeg(const std::string& args) {
  const std::string command = "ffmpeg -nostdin -y -hide_banner -loglevel error " + args;
  if (std::system(command.c_str()) != 0) {
    throw std::runtime_error("test media command failed: " + command);
  }
}

}  // namespace precompute::testing
