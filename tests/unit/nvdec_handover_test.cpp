// The rule for handing a CPU decode over to an idle NVDEC session (Note [Handing a file over to
// NVDEC] in pipeline/stages/nvdec_handover.cpp), and NVDEC's pace it compares with. The sessions
// themselves need a GPU (tests/gpu/gpu_test.cpp).
#include "pipeline/stages/nvdec_handover.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <thread>
#include <vector>

namespace precompute {
namespace {

TEST(NvdecPace, KnowsNothingBeforeTheFirstFile) {
  const NvdecPace pace;
  EXPECT_FALSE(pace.expected_seconds(10.0));
}

TEST(NvdecPace, ScalesWithTheFileLengthAndFollowsTheLatestFiles) {
  NvdecPace pace;
  pace.add(2.0, 60.0);  // a minute of video in 2 s
  ASSERT_TRUE(pace.expected_seconds(60.0));
  EXPECT_DOUBLE_EQ(*pace.expected_seconds(60.0), 2.0);
  EXPECT_DOUBLE_EQ(*pace.expected_seconds(30.0), 1.0);
  // Files under a second are paced as a second long: a session's time per file has a floor.
  EXPECT_DOUBLE_EQ(*pace.expected_seconds(0.0), *pace.expected_seconds(1.0));
  // Slower files move the estimate toward them, a quarter of the way each.
  pace.add(6.0, 60.0);
  EXPECT_DOUBLE_EQ(*pace.expected_seconds(60.0), 3.0);
  for (int i = 0; i < 40; ++i) pace.add(6.0, 60.0);
  EXPECT_NEAR(*pace.expected_seconds(60.0), 6.0, 1e-3);
}

TEST(NvdecPace, IgnoresWhatNoClockGives) {
  NvdecPace pace;
  pace.add(std::nan(""), 10.0);
  pace.add(-1.0, 10.0);
  pace.add(1.0, std::nan(""));
  pace.add(1.0, -3.0);
  EXPECT_FALSE(pace.expected_seconds(10.0));
  pace.add(1.0, 10.0);
  EXPECT_FALSE(pace.expected_seconds(std::nan("")));
  EXPECT_FALSE(pace.expected_seconds(-1.0));
  EXPECT_TRUE(pace.expected_seconds(std::numeric_limits<double>::infinity()));
}

TEST(NvdecPace, TakesFilesFromManyThreadsAtOnce) {
  NvdecPace pace;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 1000; ++i) {
        pace.add(1.0, 10.0);
        EXPECT_TRUE(pace.expected_seconds(10.0));
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_DOUBLE_EQ(*pace.expected_seconds(10.0), 1.0);
}

TEST(WorthHandingOver, WhenTheCpuHasClearlyLongerToGoThanTheSessionNeeds) {
  // A fifth of the way after 1 s on the CPU: 4 s to go.
  EXPECT_TRUE(worth_handing_over(1.0, 0.2, 1.0));
  EXPECT_TRUE(worth_handing_over(1.0, 0.2, 2.6));
  // A near tie stays on the CPU, whose work would be thrown away.
  EXPECT_FALSE(worth_handing_over(1.0, 0.2, 2.7));
  EXPECT_FALSE(worth_handing_over(1.0, 0.2, 4.0));
  // Nine tenths done after 9 s: 1 s to go, which a session's 0.8 s for the whole file does not
  // beat clearly; 0.6 s does.
  EXPECT_FALSE(worth_handing_over(9.0, 0.9, 0.8));
  EXPECT_TRUE(worth_handing_over(9.0, 0.9, 0.6));
  EXPECT_FALSE(worth_handing_over(5.0, 1.0, 0.0));
  // Nothing read yet: nothing to lose.
  EXPECT_TRUE(worth_handing_over(0.0, 0.0, 100.0));
  EXPECT_TRUE(worth_handing_over(0.3, 0.0, 100.0));
}

TEST(WorthHandingOver, NeverOnFiguresNoClockGives) {
  const double nan = std::nan("");
  const double inf = std::numeric_limits<double>::infinity();
  EXPECT_FALSE(worth_handing_over(1.0, 0.2, nan));
  EXPECT_FALSE(worth_handing_over(1.0, 0.2, -1.0));
  EXPECT_FALSE(worth_handing_over(1.0, 0.2, inf));
  EXPECT_FALSE(worth_handing_over(nan, 0.2, 1.0));
  EXPECT_FALSE(worth_handing_over(-1.0, 0.2, 1.0));
  EXPECT_TRUE(worth_handing_over(1.0, nan, 1.0));  // no share known: as nothing read
  EXPECT_FALSE(worth_handing_over(1.0, 1.5, 1.0));
}

}  // namespace
}  // namespace precompute
