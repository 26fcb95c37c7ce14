// SampleWatchdog against a stopped process (Note [Paused runs] in
// pipeline/core/pause_clock.cpp), in a child process of its own: the test stops it as a
// scheduler's suspend or a cgroup freezer would, without the SIGCONT handler a run installs,
// so that only the watchdog's own ticks can tell a pause from a stuck decoder. And the failure
// records ContainedPreparer and the real SamplePreparer make together for a sample that is not
// decoded again (Note [Crash containment] in pipeline/crash_containment.cpp).

#include "pipeline/crash_containment.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <filesystem>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/stages/sample_preparer.hpp"

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

// (modality, category) of each failure record, by name.
using Records = std::vector<std::pair<std::string_view, std::string_view>>;

Records records_of(const PreparedSample& prepared) {
  Records records;
  for (const auto& f : prepared.failures) {
    records.emplace_back(modality_name(f.modality), failure_category_name(f.category));
  }
  return records;
}

// Lines with a clip and nothing else (no caption, no audio file): once their media are skipped,
// nothing of the line is left to prepare, and yet each media modality must get exactly one record,
// of the quarantine's category, and no no_input record beside it. The clips do not exist: a decode
// would record them as missing.
TEST(ContainedPreparerTest, ASkippedSampleHasOneRecordPerMediaModality) {
  const auto dir = std::filesystem::temp_directory_path() /
                   ("precompute-contained-test-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  Config config;
  config.video.enabled = true;
  config.video.decoder = VideoDecoderKind::kCpu;
  config.audio.enabled = true;  // from the clip's track: the line has no audio file
  RunStats stats;
  const SamplePreparer preparer(config, stats);
  Quarantine quarantine;
  quarantine[3] = {3, 2, false, "the process crashed (signal 11) twice while preparing it"};
  quarantine[4] = {4, 1, true, "preparing it took longer than run.sample_timeout_s"};
  {
    InflightJournal journal(dir, 1);
    ContainedPreparer contained(preparer, journal, quarantine);
    SampleSpec crashed;
    crashed.seq = 3;
    crashed.id = "crashed";
    crashed.video = dir / "crashed.mp4";
    SampleSpec hung = crashed;
    hung.seq = 4;
    hung.id = "hung";
    hung.video = dir / "hung.mp4";

    const auto c = contained(crashed);
    EXPECT_EQ(records_of(*c), (Records{{"video", "crash"}, {"audio", "crash"}}));
    EXPECT_FALSE(c->video || c->audio || c->text);
    const auto h = contained(hung);
    EXPECT_EQ(records_of(*h), (Records{{"video", "timeout"}, {"audio", "timeout"}}));
    for (const auto& f : h->failures) {
      EXPECT_NE(f.message.find("sample 'hung': preparing it took longer"), std::string::npos)
          << f.message;
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace precompute
