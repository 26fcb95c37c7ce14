// SampleWatchdog against a stopped process (Note [Paused runs] in
// pipeline/core/pause_clock.cpp), in a child process of its own: the test stops it as a
// scheduler's suspend or a cgroup freezer would, without the SIGCONT handler a run installs,
// so that only the watchdog's own ticks can tell a pause from a stuck decoder.

#include "pipeline/crash_containment.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <thread>

namespace precompute {
namespace {

TEST(SampleWatchdogTest, AStopBeforeItsFirstTickIsAPauseNotATimeout) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("precompute-watchdog-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    InflightJournal journal(dir, 1);
    const auto entry = journal.begin(7);
    {
      const SampleWatchdog watchdog(journal, std::chrono::seconds(1));
      // At once, before the watchdog's first tick (it ticks every 0.2 s).
      ::raise(SIGSTOP);
      // Resumed: a few ticks, each of which would end the process (exit 75) if the sample were
      // judged in flight for the 4 s of the stop.
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
    }
    ::_exit(0);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, WUNTRACED), child);
  ASSERT_TRUE(WIFSTOPPED(status)) << "the child did not stop itself";
  // Longer than the sample limit (1 s) and than the stall a tick tells a pause by (3 s).
  std::this_thread::sleep_for(std::chrono::seconds(4));
  ASSERT_EQ(::kill(child, SIGCONT), 0);
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  std::filesystem::remove_all(dir);
  ASSERT_TRUE(WIFEXITED(status)) << "status " << status;
  EXPECT_EQ(WEXITSTATUS(status), 0) << "exit 75: the watchdog took the stop for a stuck sample";
}

}  // namespace
}  // namespace precompute
