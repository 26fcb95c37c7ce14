// What a run that dies while a package loads leaves in /tmp, when no supervisor is there to
// clean up after it (Note [Unpacked packages] in encoders/unpacked_packages.cpp): the child
// process plays the run, dying between the load's start and its end as a decoder crash among the
// early samples would, and the test process plays the next run on the machine. A test binary of
// its own, since it forks.

#include "encoders/unpacked_packages.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

namespace precompute {
namespace {

namespace fs = std::filesystem;

// A fresh /tmp/XXXXXX folder, named as LibTorch's loader names its own.
fs::path fresh_tmp_folder() {
  char name[] = "/tmp/XXXXXX";
  if (::mkdtemp(name) == nullptr) return {};
  return name;
}

TEST(UnpackedPackagesTest, ALoadAfterARunDiedLoadingRemovesWhatThatRunUnpacked) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    ::close(fds[0]);
    new PackageUnpacking();  // never destroyed: the process dies during the load
    // What the loader had unpacked when the process died, and a folder of the user's own made
    // meanwhile, which holds a file where an unpacking holds only folders.
    const fs::path unpacked = fresh_tmp_folder();
    std::error_code ec;
    fs::create_directories(unpacked / "model" / "data", ec);
    const fs::path users = fresh_tmp_folder();
    std::ofstream(users / "notes.txt") << "mine\n";
    const std::string names = unpacked.string() + "\n" + users.string() + "\n";
    const bool sent = ::write(fds[1], names.data(), names.size()) ==
                      static_cast<ssize_t>(names.size());
    ::_exit(sent && !unpacked.empty() && !users.empty() ? 0 : 1);
  }
  ::close(fds[1]);
  std::string names;
  char buffer[256];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) names.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  const auto newline = names.find('\n');
  ASSERT_NE(newline, std::string::npos) << names;
  const fs::path unpacked = names.substr(0, newline);
  const fs::path users = names.substr(newline + 1, names.size() - newline - 2);
  const fs::path record =
      fs::path("/tmp/precompute-pt2") / (std::to_string(child) + ".loading");
  ASSERT_TRUE(fs::exists(unpacked / "model" / "data"));
  ASSERT_TRUE(fs::exists(record));

  // The next load cleans up when it finds no other load under way; another test's run may be
  // loading a package right now, so it is given loads until the lock is free.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (fs::exists(unpacked) && std::chrono::steady_clock::now() < deadline) {
    { PackageUnpacking next; }
    if (fs::exists(unpacked)) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_FALSE(fs::exists(unpacked));
  EXPECT_FALSE(fs::exists(record));
  EXPECT_TRUE(fs::exists(users / "notes.txt"));
  std::error_code ec;
  fs::remove_all(users, ec);
  fs::remove_all(unpacked, ec);
}

}  // namespace
}  // namespace precompute
