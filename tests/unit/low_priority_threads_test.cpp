// LowPriorityThreads: the threads CPU video decodes run on beside NVDEC (Note [CPU decoders at a
// lower priority] in pipeline/stages/video_decoder_scheduler.cpp).
#include "pipeline/core/low_priority_threads.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/core/error.hpp"

namespace precompute {
namespace {

int own_nice() { return ::getpriority(PRIO_PROCESS, static_cast<id_t>(::gettid())); }

TEST(LowPriorityThreads, RunsTheJobOnAThreadOfLowerPriorityAndLeavesTheCallersAlone) {
  const int caller_nice = own_nice();
  LowPriorityThreads threads(10);
  const auto [job_thread, job_nice] =
      threads.run([] { return std::make_pair(std::this_thread::get_id(), own_nice()); });
  EXPECT_NE(job_thread, std::this_thread::get_id());
  ASSERT_EQ(threads.lowered(), 1) << "setpriority refused to lower a thread's priority";
  EXPECT_EQ(job_nice, std::min(19, caller_nice + 10));
  EXPECT_EQ(own_nice(), caller_nice);
}

TEST(LowPriorityThreads, ReusesAThreadForCallsOneAfterAnother) {
  LowPriorityThreads threads(10);
  std::thread::id first;
  for (int i = 0; i < 5; ++i) {
    const auto id = threads.run([] { return std::this_thread::get_id(); });
    if (i == 0) first = id;
    EXPECT_EQ(id, first);
  }
  EXPECT_EQ(threads.threads(), 1);
}

TEST(LowPriorityThreads, RethrowsTheJobsExceptionAsItWas) {
  LowPriorityThreads threads(10);
  try {
    threads.run([]() -> int {
      throw MediaError(FailureCategory::kTimeout, "clip.mp4: too slow", __FILE__, __LINE__);
    });
    FAIL() << "no exception";
  } catch (const MediaError& e) {
    EXPECT_EQ(e.category(), FailureCategory::kTimeout);
    EXPECT_NE(std::string(e.what()).find("clip.mp4: too slow"), std::string::npos);
  }
  // The thread survives its job's exception and takes the next one.
  EXPECT_EQ(threads.run([] { return 7; }), 7);
  EXPECT_EQ(threads.threads(), 1);
}

TEST(LowPriorityThreads, ACallNeverWaitsBehindAnother) {
  // Eight callers whose jobs each wait until all eight are running: with a queue behind busy
  // threads this would never finish, so the jobs give up after a while and say so.
  constexpr int kCallers = 8;
  LowPriorityThreads threads(10);
  std::mutex mutex;
  std::condition_variable all_in;
  int running = 0;
  std::atomic<int> gave_up{0};
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&] {
      threads.run([&] {
        std::unique_lock<std::mutex> lock(mutex);
        ++running;
        all_in.notify_all();
        if (!all_in.wait_for(lock, std::chrono::seconds(30), [&] { return running == kCallers; })) {
          ++gave_up;
        }
      });
    });
  }
  for (auto& caller : callers) caller.join();
  EXPECT_EQ(gave_up.load(), 0);
  EXPECT_EQ(threads.threads(), kCallers);
  EXPECT_EQ(threads.lowered(), kCallers);
}

TEST(LowPriorityThreads, AnIncrementPastTheLowestPriorityStopsThere) {
  LowPriorityThreads threads(1000);
  EXPECT_EQ(threads.run(own_nice), 19);
  LowPriorityThreads unchanged(-5);  // never raises a priority
  EXPECT_EQ(unchanged.run(own_nice), own_nice());
}

}  // namespace
}  // namespace precompute
