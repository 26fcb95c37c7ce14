// DedicatedThread: every task runs on the same thread, not the caller's; the caller waits for it
// and gets its exception; callers taking turns from many threads still reach that one thread.
#include "pipeline/core/dedicated_thread.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace precompute {
namespace {

TEST(DedicatedThread, RunsEveryTaskOnItsOwnThreadAndWaitsForIt) {
  DedicatedThread thread;
  std::set<std::thread::id> ran_on;
  int value = 0;
  for (int i = 0; i < 5; ++i) {
    thread.run([&] {
      ran_on.insert(std::this_thread::get_id());
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      value += 1;
    });
    EXPECT_EQ(value, i + 1);  // done before run() returned
  }
  ASSERT_EQ(ran_on.size(), 1u);
  EXPECT_EQ(*ran_on.begin(), thread.id());
  EXPECT_NE(thread.id(), std::this_thread::get_id());
}

TEST(DedicatedThread, RethrowsTheTasksExceptionInTheCallerAndKeepsWorking) {
  DedicatedThread thread;
  EXPECT_THROW(thread.run([] { throw std::runtime_error("out of memory"); }),
               std::runtime_error);
  bool ran = false;
  thread.run([&] { ran = true; });
  EXPECT_TRUE(ran);
}

TEST(DedicatedThread, CallersOnManyThreadsTakingTurnsReachTheSameThread) {
  DedicatedThread thread;
  std::mutex turn;  // the owner's hand-over: one caller at a time
  std::mutex seen_mutex;
  std::set<std::thread::id> seen;
  std::atomic<int> count{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 8; ++c) {
    callers.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        std::lock_guard lock(turn);
        thread.run([&] {
          std::lock_guard seen_lock(seen_mutex);
          seen.insert(std::this_thread::get_id());
          count.fetch_add(1);
        });
      }
    });
  }
  for (auto& c : callers) c.join();
  EXPECT_EQ(count.load(), 400);
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(*seen.begin(), thread.id());
}

}  // namespace
}  // namespace precompute
