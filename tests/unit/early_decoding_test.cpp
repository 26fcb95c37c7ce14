// EarlyDecoding (pipeline/early_decoding.hpp): the first samples prepared while the encoders load,
// handed to the graph by position, each prepared at most once. Prepare is a function of the test
// that records its calls and can be held back, so that each state a position can be in when the
// graph asks for it (not started, being prepared, done) is reached on purpose. Part of graph_test,
// so that tools/test_sanitized.sh runs it under ASan+UBSan and TSan.

#include "pipeline/early_decoding.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pipeline/core/stop_request.hpp"

namespace precompute {
namespace {

std::vector<SampleSpec> make_input(int64_t n) {
  std::vector<SampleSpec> input;
  for (int64_t i = 0; i < n; ++i) {
    SampleSpec s;
    s.seq = i;
    s.id = "s";
    s.id += std::to_string(i);
    input.push_back(s);
  }
  return input;
}

// A prepare function that records the positions it was called for and, while held, keeps every
// call waiting until release().
class Recorder {
 public:
  EarlyDecoding::Prepare prepare() {
    return [this](const SampleSpec& spec) {
      std::unique_lock lock(mutex_);
      calls_.push_back(spec.seq);
      started_.notify_all();
      released_.wait(lock, [&] { return !held_; });
      if (spec.seq == throws_at_) throw std::runtime_error("cannot prepare " + spec.id);
      auto sample = std::make_shared<PreparedSample>();
      sample->seq = spec.seq;
      sample->order = spec.order;
      sample->id = spec.id;
      return PreparedSamplePtr(std::move(sample));
    };
  }
  void hold() {
    const std::lock_guard lock(mutex_);
    held_ = true;
  }
  void release() {
    {
      const std::lock_guard lock(mutex_);
      held_ = false;
    }
    released_.notify_all();
  }
  void throw_at(int64_t seq) { throws_at_ = seq; }
  // Waits until `n` calls have started.
  void wait_for_calls(size_t n) {
    std::unique_lock lock(mutex_);
    started_.wait(lock, [&] { return calls_.size() >= n; });
  }
  std::vector<int64_t> calls() {
    const std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable started_;
  std::condition_variable released_;
  bool held_ = false;
  int64_t throws_at_ = -1;
  std::vector<int64_t> calls_;
};

TEST(EarlyDecodingTest, HandsOutEachEarlyPositionOnceInThePlansOrder) {
  const auto input = make_input(10);
  Recorder recorder;
  std::atomic<int> prepared{0};
  std::atomic<int> taken{0};
  EarlyDecoding early(input, {2, 5, 7}, recorder.prepare(), 2, [&] { ++prepared; },
                      [&] { ++taken; });
  recorder.wait_for_calls(3);  // each is being prepared or done: take() waits for it
  for (const int64_t seq : {2, 5, 7}) {
    const auto sample = early.take(seq);
    ASSERT_NE(sample, nullptr) << seq;
    EXPECT_EQ(sample->seq, seq);
    EXPECT_EQ(sample->id, input[static_cast<size_t>(seq)].id);
    EXPECT_EQ(early.take(seq), nullptr) << "position " << seq << " handed out twice";
  }
  // Order is the place among the early positions, as the graph numbers a plan's positions.
  EXPECT_EQ(prepared.load(), 3);
  EXPECT_EQ(taken.load(), 3);
  EXPECT_EQ(early.take(0), nullptr) << "a position that was not early";
  EXPECT_EQ(early.take(6), nullptr);
  EXPECT_EQ(early.prepared(), 3);
  auto calls = recorder.calls();
  std::sort(calls.begin(), calls.end());
  EXPECT_EQ(calls, (std::vector<int64_t>{2, 5, 7})) << "each prepared exactly once";
}

TEST(EarlyDecodingTest, AnEndWithNothingBeingPreparedLeavesOtherDecodesAlone) {
  const auto input = make_input(4);
  Recorder recorder;
  {
    EarlyDecoding early(input, {0, 1}, recorder.prepare(), 2);
    recorder.wait_for_calls(2);
    ASSERT_NE(early.take(0), nullptr);
    ASSERT_NE(early.take(1), nullptr);
  }
  EXPECT_FALSE(decodes_cut_short());
}

TEST(EarlyDecodingTest, NumbersSamplesByTheirPlaceAmongTheEarlyPositions) {
  const auto input = make_input(10);
  Recorder recorder;
  EarlyDecoding early(input, {4, 8, 9}, recorder.prepare(), 1);
  recorder.wait_for_calls(3);
  EXPECT_EQ(early.take(4)->order, 0);
  EXPECT_EQ(early.take(8)->order, 1);
  EXPECT_EQ(early.take(9)->order, 2);
}

TEST(EarlyDecodingTest, APositionNotStartedYetIsLeftToTheCallerAndNeverStarted) {
  const auto input = make_input(10);
  Recorder recorder;
  recorder.hold();
  EarlyDecoding early(input, {0, 1, 2}, recorder.prepare(), 1);
  recorder.wait_for_calls(1);  // the one thread is held inside position 0
  EXPECT_EQ(early.take(2), nullptr) << "position 2 waits for a thread: the caller prepares it";
  EXPECT_FALSE(early.idle_since().has_value()) << "a sample is being prepared";
  recorder.release();
  EXPECT_NE(early.take(0), nullptr) << "waited for while being prepared";
  EXPECT_NE(early.take(1), nullptr);
  EXPECT_EQ(early.take(2), nullptr);
  EXPECT_EQ(recorder.calls(), (std::vector<int64_t>{0, 1})) << "position 2 is the caller's";
}

TEST(EarlyDecodingTest, SaysWhenItsThreadsRanOutOfWork) {
  const auto input = make_input(4);
  Recorder recorder;
  recorder.hold();
  const auto before = EarlyDecoding::Clock::now();
  EarlyDecoding early(input, {0, 1, 2, 3}, recorder.prepare(), 2);
  recorder.wait_for_calls(2);
  EXPECT_FALSE(early.idle_since().has_value());
  recorder.release();
  recorder.wait_for_calls(4);
  for (const int64_t seq : {0, 1, 2, 3}) ASSERT_NE(early.take(seq), nullptr);
  // Taking the last sample means it was done; the thread that ended it marks the time just after.
  for (int i = 0; i < 1000 && !early.idle_since(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_TRUE(early.idle_since().has_value());
  EXPECT_GE(*early.idle_since(), before);
  EXPECT_LE(*early.idle_since(), EarlyDecoding::Clock::now());
}

TEST(EarlyDecodingTest, NoPositionsMeansIdleFromTheStart) {
  const auto input = make_input(3);
  Recorder recorder;
  EarlyDecoding early(input, {}, recorder.prepare(), 4);
  EXPECT_TRUE(early.idle_since().has_value());
  EXPECT_EQ(early.take(0), nullptr);
  EXPECT_TRUE(recorder.calls().empty());
}

TEST(EarlyDecodingTest, APreparationsErrorReachesTheGraphWhenItTakesThePosition) {
  const auto input = make_input(3);
  Recorder recorder;
  recorder.throw_at(1);
  std::atomic<int> prepared{0};
  EarlyDecoding early(input, {0, 1, 2}, recorder.prepare(), 2, [&] { ++prepared; });
  recorder.wait_for_calls(3);
  EXPECT_NE(early.take(0), nullptr);
  EXPECT_THROW(early.take(1), std::runtime_error);
  EXPECT_NE(early.take(2), nullptr);
  EXPECT_EQ(prepared.load(), 2) << "the sample that threw is not counted as prepared";
}

TEST(EarlyDecodingTest, EndingStartsNothingMoreAndWaitsForTheSamplesBeingPrepared) {
  const auto input = make_input(50);
  std::vector<int64_t> positions;
  for (int64_t i = 0; i < 50; ++i) positions.push_back(i);
  Recorder recorder;
  recorder.hold();
  std::thread release;
  {
    EarlyDecoding early(input, positions, recorder.prepare(), 3);
    recorder.wait_for_calls(3);
    release = std::thread([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      recorder.release();
    });
  }  // the destructor returns once the three held samples ended
  release.join();
  const auto calls = recorder.calls().size();
  EXPECT_GE(calls, 3U);
  EXPECT_LT(calls, 50U) << "ending early decoding must not prepare every position";
  // The samples being prepared are dropped: decodes end at their next check (Deadline).
  EXPECT_TRUE(decodes_cut_short());
}

}  // namespace
}  // namespace precompute
