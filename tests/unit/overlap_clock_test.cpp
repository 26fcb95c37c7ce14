// OverlapClock: the union of overlapping spans, not their sum (Note [An encoder's time in use]
// in pipeline/core/overlap_clock.cpp), with a span still open counted to the time asked.
#include "pipeline/core/overlap_clock.hpp"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

namespace precompute {
namespace {

using Clock = OverlapClock::Clock;
using std::chrono::milliseconds;

TEST(OverlapClock, CountsOverlappingSpansOnceAndGapsNotAtAll) {
  OverlapClock clock;
  const Clock::time_point t0;
  clock.enter(t0);                      // call A: 0-300 ms
  clock.enter(t0 + milliseconds(100));  // call B: 100-500 ms, overlapping A
  clock.leave(t0 + milliseconds(300));
  clock.leave(t0 + milliseconds(500));
  // Idle 500-800 ms.
  clock.enter(t0 + milliseconds(800));  // call C: 800-900 ms
  clock.leave(t0 + milliseconds(900));
  // The calls' sum would be 300 + 400 + 100 = 800 ms; in use: 0-500 and 800-900.
  EXPECT_DOUBLE_EQ(clock.seconds(t0 + milliseconds(1000)), 0.6);
}

TEST(OverlapClock, CountsASpanStillOpenUpToTheTimeAsked) {
  OverlapClock clock;
  const Clock::time_point t0;
  EXPECT_DOUBLE_EQ(clock.seconds(t0), 0.0);
  clock.enter(t0 + milliseconds(200));
  EXPECT_DOUBLE_EQ(clock.seconds(t0 + milliseconds(450)), 0.25);
  clock.leave(t0 + milliseconds(700));
  EXPECT_DOUBLE_EQ(clock.seconds(t0 + milliseconds(2000)), 0.5);
}

TEST(OverlapClock, LeavingWithoutEnteringIsABug) {
  OverlapClock clock;
  EXPECT_THROW(clock.leave(Clock::now()), std::exception);
}

TEST(OverlapClock, ScopesOnManyThreadsNeverCountMoreThanTheWallTime) {
  OverlapClock clock;
  const auto started = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        const OverlapClock::Scope scope(clock);
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  const double wall = std::chrono::duration<double>(Clock::now() - started).count();
  const double in_use = clock.seconds();
  // Four threads each in a scope for >= 10 ms: the sum would pass 40 ms, the union cannot pass
  // the wall time, and at least one thread's own 10 ms lies within it.
  EXPECT_LE(in_use, wall);
  EXPECT_GE(in_use, 0.010);
}

}  // namespace
}  // namespace precompute
