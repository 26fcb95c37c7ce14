// The split of a GPU memory budget over the encoder calls of one device (share_by_need, Note
// [Shares by measured need] in pipeline/memory_budget.cpp): plain arithmetic on the needs that
// the start-up probes measure, so it is checked here without a GPU or LibTorch. The figures are
// those of docs/benchmarks.md, "Three encoders on one GPU: shares by measured need" (ResNet-50,
// a small audio encoder and BERT-base on one H200, two calls each, 282.3 MiB of weights). The
// sample those probes batch is checked here too (largest_sample).

#include "pipeline/memory_budget.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "test_media.hpp"

namespace precompute {

#ifdef PRECOMPUTE_TEST_DEVICE_STUBS
// Without LibTorch (the sanitizer build) encoders/encoder_factory.cpp is not built, but
// memory_budget.cpp, compiled into this test, names its device-memory functions. The split never
// calls them; the rest of apply_memory_budget is not tested here.
std::optional<DeviceMemoryUse> device_memory_use(const std::string&) { return std::nullopt; }
void reset_device_memory_peaks(const std::string&) {}
void release_cached_device_memory(const std::string&) {}
void cap_device_memory(const std::string&, int64_t) {}
#endif

namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;
constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

int64_t mib(double m) { return std::llround(m * static_cast<double>(kMiB)); }

// docs/benchmarks.md: 282.3 MiB of weights; one largest sample per call needs 202.0 MiB (video,
// 16 frames at 224x224), 1 B (audio) and 22.0 MiB (text, 256 tokens); two calls each. The wants
// (a full batch of the config per call) are chosen so that 1 GiB gives the documented shares,
// 268.0 / 1.1 / 101.8 MiB.
const int64_t kWeights = mib(282.3);
const std::vector<EncoderNeed> kMeasured = {
    {Modality::kVideo, 2, mib(202.0), mib(202.0 + 4 * 66.0)},
    {Modality::kAudio, 2, 1, 1 + mib(4 * 1.1)},
    {Modality::kText, 2, mib(22.0), mib(22.0 + 4 * 79.8)},
};

// What the calls take together, or std::nullopt past INT64_MAX.
std::optional<int64_t> total(const std::vector<EncoderNeed>& es, const BudgetSplit& split) {
  int64_t sum = 0;
  for (size_t i = 0; i < es.size(); ++i) {
    int64_t calls_share = 0;
    if (__builtin_mul_overflow(split.shares.at(i), static_cast<int64_t>(std::max(1, es[i].calls)),
                               &calls_share) ||
        __builtin_add_overflow(sum, calls_share, &sum)) {
      return std::nullopt;
    }
  }
  return sum;
}

// The properties every accepted split has: a share per encoder, each call at least its need and
// at most its want, all calls together within what is available.
void expect_within(const std::vector<EncoderNeed>& es, int64_t available,
                   const BudgetSplit& split) {
  ASSERT_FALSE(split.refused()) << split.refusal;
  ASSERT_EQ(split.shares.size(), es.size());
  for (size_t i = 0; i < es.size(); ++i) {
    const int64_t need = std::max<int64_t>(0, es[i].need);
    EXPECT_GE(split.shares[i], need) << "encoder " << i;
    EXPECT_LE(split.shares[i], std::max(need, es[i].want)) << "encoder " << i;
  }
  const auto sum = total(es, split);
  ASSERT_TRUE(sum.has_value()) << "the shares overflow int64";
  EXPECT_LE(*sum, available);
}

// The case: 1 GiB is accepted. Evenly, each of the 6 calls would get (1 GiB - 282.3 MiB)
// / 6 = 123.6 MiB, less than one video call needs (EvenSplitWouldRefuseTheSameBudget), so an even
// split fails this test.
TEST(MemoryBudgetTest, OneGibForResNetAudioAndBertIsSharedByNeed) {
  const int64_t available = kGiB - kWeights;
  const auto split = share_by_need(kMeasured, available, "cuda:0", kGiB);
  ASSERT_NO_FATAL_FAILURE(expect_within(kMeasured, available, split));
  ASSERT_EQ(split.shares.size(), 3u);
  EXPECT_GE(split.shares[0], mib(202.0));
  EXPECT_NEAR(static_cast<double>(split.shares[0]) / kMiB, 268.0, 0.2);
  EXPECT_NEAR(static_cast<double>(split.shares[1]) / kMiB, 1.1, 0.2);
  EXPECT_NEAR(static_cast<double>(split.shares[2]) / kMiB, 101.8, 0.2);
  // Not enough for every full batch: the spare goes out in proportion, nearly all of it used.
  EXPECT_GT(*total(kMeasured, split), available - 8);
}

TEST(MemoryBudgetTest, EvenSplitWouldRefuseTheSameBudget) {
  const int64_t even = (kGiB - kWeights) / 6;
  EXPECT_LT(even, kMeasured[0].need);
  EXPECT_NEAR(static_cast<double>(even) / kMiB, 123.6, 0.1);
}

// With room for every full batch, each call gets its want and no more.
TEST(MemoryBudgetTest, AmpleBudgetGivesEachCallItsFullBatch) {
  const int64_t available = 8 * kGiB - kWeights;
  const auto split = share_by_need(kMeasured, available, "cuda:0", 8 * kGiB);
  ASSERT_NO_FATAL_FAILURE(expect_within(kMeasured, available, split));
  for (size_t i = 0; i < kMeasured.size(); ++i) EXPECT_EQ(split.shares[i], kMeasured[i].want);
}

// docs/benchmarks.md's 650 MiB row, word for word: every encoder's need is named.
TEST(MemoryBudgetTest, BudgetBelowTheNeedsIsRefusedNamingEachEncoder) {
  const int64_t budget = 650 * kMiB;
  const auto split = share_by_need(kMeasured, budget - kWeights, "cuda:0", budget);
  ASSERT_TRUE(split.refused());
  EXPECT_TRUE(split.shares.empty());
  EXPECT_EQ(split.refusal,
            "run.gpu_memory_budget 650.0 MiB on cuda:0 leaves 367.7 MiB after what the encoders "
            "keep resident, but one largest sample per encoder call needs 448.0 MiB (video 202.0 MiB "
            "x 2 call(s), audio 1 B x 2 call(s), text 22.0 MiB x 2 call(s)); raise the budget or "
            "make samples smaller (video.size, video.num_frames, audio.window_s, "
            "text.tokenizer.max_length)");
}

// Exactly the needs fit; one byte less does not.
TEST(MemoryBudgetTest, NeedsThatJustFitAreAcceptedOneByteLessIsRefused) {
  const int64_t needed = 2 * (mib(202.0) + 1 + mib(22.0));
  const auto fits = share_by_need(kMeasured, needed, "cuda:0", needed + kWeights);
  ASSERT_NO_FATAL_FAILURE(expect_within(kMeasured, needed, fits));
  for (size_t i = 0; i < kMeasured.size(); ++i) EXPECT_EQ(fits.shares[i], kMeasured[i].need);
  const auto short_by_one = share_by_need(kMeasured, needed - 1, "cuda:0", needed - 1 + kWeights);
  ASSERT_TRUE(short_by_one.refused());
  EXPECT_NE(short_by_one.refusal.find("video 202.0 MiB x 2 call(s)"), std::string::npos)
      << short_by_one.refusal;
}

TEST(MemoryBudgetTest, ZeroBytes) {
  const auto none = share_by_need(kMeasured, 0, "cuda:1", 0);
  ASSERT_TRUE(none.refused());
  EXPECT_EQ(none.refusal.rfind("run.gpu_memory_budget 0 B on cuda:1 leaves 0 B after", 0), 0u)
      << none.refusal;
  EXPECT_NE(none.refusal.find("text 22.0 MiB x 2 call(s)"), std::string::npos);
  // Nothing needed: nothing to refuse, and nothing given.
  const std::vector<EncoderNeed> costless = {{Modality::kAudio, 2, 0, 0},
                                             {Modality::kText, 1, 0, 5}};
  const auto zero = share_by_need(costless, 0, "cuda:0", kWeights);
  ASSERT_NO_FATAL_FAILURE(expect_within(costless, 0, zero));
  EXPECT_EQ(zero.shares, (std::vector<int64_t>{0, 0}));
  const auto no_encoders = share_by_need({}, 0, "cuda:0", 0);
  EXPECT_FALSE(no_encoders.refused());
  EXPECT_TRUE(no_encoders.shares.empty());
}

// As apply_memory_budget's probes give them, calls >= 1 and want >= need; anything else is read
// that way rather than trusted.
TEST(MemoryBudgetTest, OutOfRangeInputsAreReadAsTheNearestValidOnes) {
  const std::vector<EncoderNeed> odd = {{Modality::kVideo, 0, 100, 50},
                                        {Modality::kText, -3, -5, 40}};
  const auto split = share_by_need(odd, 1000, "cuda:0", 2000);
  ASSERT_NO_FATAL_FAILURE(expect_within(odd, 1000, split));
  EXPECT_EQ(split.shares, (std::vector<int64_t>{100, 40}));
}

// Sizes near INT64_MAX: needs whose sum is past it are refused (not wrapped round to a small
// number and accepted), wants up to it are given without overflow.
TEST(MemoryBudgetTest, SizesNearInt64MaxDoNotOverflow) {
  const auto refused = [](const std::vector<EncoderNeed>& es, int64_t available) {
    const auto split = share_by_need(es, available, "cuda:0", kMax);
    EXPECT_TRUE(split.refused());
    return split.refusal;
  };
  EXPECT_NE(refused({{Modality::kVideo, 2, kMax, kMax}}, kMax).find("video"), std::string::npos);
  refused({{Modality::kVideo, 2, kMax / 2 + 1, kMax}}, kMax);
  refused({{Modality::kVideo, 1, int64_t{1} << 62, kMax},
           {Modality::kText, 1, int64_t{1} << 62, kMax}},
          kMax);
  refused({{Modality::kVideo, std::numeric_limits<int>::max(), kMax / 4, kMax}}, kMax);

  const std::vector<EncoderNeed> just = {{Modality::kVideo, 2, kMax / 2, kMax}};
  const auto fits = share_by_need(just, kMax, "cuda:0", kMax);
  ASSERT_NO_FATAL_FAILURE(expect_within(just, kMax, fits));
  EXPECT_EQ(fits.shares[0], kMax / 2);

  const std::vector<EncoderNeed> one = {{Modality::kText, 1, 1, kMax}};
  const auto all = share_by_need(one, kMax, "cuda:0", kMax);
  ASSERT_NO_FATAL_FAILURE(expect_within(one, kMax, all));
  EXPECT_EQ(all.shares[0], kMax);

  const std::vector<EncoderNeed> three = {{Modality::kVideo, 2, 1, kMax},
                                          {Modality::kAudio, 2, kMax / 8, kMax},
                                          {Modality::kText, 2, 3, kMax - 1}};
  // The last: exactly the needs (2 + 2 * (kMax / 8) + 6 bytes), nothing spare.
  for (const int64_t available : {kMax, kMax - 1, kMax / 2, kMax / 4 + 7}) {
    const auto split = share_by_need(three, available, "cuda:0", kMax);
    ASSERT_NO_FATAL_FAILURE(expect_within(three, available, split)) << available;
  }
}

// Many splits of random sizes, from bytes to exabytes: accepted exactly when the needs fit, and
// then every share within its need and want and all of them within what is available (the
// proportion is computed in doubles; at these sizes they round, and the split must trim).
TEST(MemoryBudgetTest, RandomSplitsKeepWithinTheBudget) {
  std::mt19937_64 random(20261130);
  const auto size = [&](int max_bits) {
    const int bits = std::uniform_int_distribution<int>(0, max_bits)(random);
    return bits == 0 ? int64_t{0}
                     : static_cast<int64_t>(random() >> (64 - bits));  // below 2^bits
  };
  int accepted = 0;
  for (int round = 0; round < 20000; ++round) {
    const int max_bits = round % 2 == 0 ? 40 : 63;
    std::vector<EncoderNeed> es(std::uniform_int_distribution<size_t>(1, 4)(random));
    int64_t needed = 0;
    bool past_int64 = false;
    for (auto& e : es) {
      e.modality = static_cast<Modality>(std::uniform_int_distribution<int>(0, 2)(random));
      e.calls = std::uniform_int_distribution<int>(1, 4)(random);
      e.need = size(max_bits) / 8;
      e.want = e.need + size(max_bits) / 2;
      int64_t calls_need = 0;
      past_int64 = past_int64 || __builtin_mul_overflow(e.need, int64_t{e.calls}, &calls_need) ||
                   __builtin_add_overflow(needed, calls_need, &needed);
    }
    const int64_t available = size(max_bits);
    const auto split = share_by_need(es, available, "cuda:0", available);
    ASSERT_EQ(split.refused(), past_int64 || needed > available) << "round " << round;
    if (split.refused()) continue;
    ++accepted;
    ASSERT_NO_FATAL_FAILURE(expect_within(es, available, split)) << "round " << round;
    if (::testing::Test::HasFailure()) FAIL() << "round " << round;
  }
  EXPECT_GT(accepted, 5000);
}

// For sizes a GPU has, the split is the first version's arithmetic byte for byte, except where
// rounding made that one give a byte or two past the budget.
TEST(MemoryBudgetTest, MatchesTheFirstVersionWhereThatKeptWithinTheBudget) {
  std::mt19937_64 random(7);
  for (int round = 0; round < 5000; ++round) {
    std::vector<EncoderNeed> es(3);
    int64_t needed = 0;
    double wanted = 0;
    for (auto& e : es) {
      e.calls = 2;
      e.need = std::uniform_int_distribution<int64_t>(1, 300 * kMiB)(random);
      e.want = e.need + std::uniform_int_distribution<int64_t>(0, 4 * kGiB)(random);
      needed += e.need * e.calls;
      wanted += static_cast<double>(e.want - e.need) * e.calls;
    }
    const int64_t available = needed + std::uniform_int_distribution<int64_t>(0, 8 * kGiB)(random);
    const double spare = static_cast<double>(available - needed);
    const double ratio = wanted <= spare ? 1.0 : spare / wanted;
    std::vector<int64_t> first;
    int64_t first_total = 0;
    for (const auto& e : es) {
      first.push_back(e.need + static_cast<int64_t>(ratio * static_cast<double>(e.want - e.need)));
      first_total += first.back() * e.calls;
    }
    const auto split = share_by_need(es, available, "cuda:0", available + kWeights);
    ASSERT_NO_FATAL_FAILURE(expect_within(es, available, split)) << "round " << round;
    if (first_total <= available) {
      EXPECT_EQ(split.shares, first) << "round " << round;
    }
  }
}

// What the calibration measures, as docs/usage.md's "Memory" says (the README's, once): text of
// max_length tokens, a clip of num_frames frames, 16 frames under fps sampling, one audio window,
// 10 s of audio under whole-clip windows; at the configured size and rate.
TEST(MemoryBudgetTest, TheProbeSampleIsWhatTheReadmeSays) {
  testing::TempDir dir;
  {
    std::ofstream vocab(dir / "vocab.txt");
    vocab << "[PAD]\n[UNK]\n[CLS]\n[SEP]\nword\n";
  }
  Config c;
  c.video.height = 32;
  c.video.width = 48;
  c.video.fps = 1.0;
  const auto clip = largest_sample(c, Modality::kVideo);
  ASSERT_TRUE(clip->video);
  EXPECT_EQ(clip->video->num_frames, 16);
  EXPECT_EQ(clip->video->height, 32);
  EXPECT_EQ(clip->video->width, 48);
  c.video.fps = 0.0;
  c.video.num_frames = 8;
  EXPECT_EQ(largest_sample(c, Modality::kVideo)->video->num_frames, 8);

  c.audio.sample_rate = 16000;
  const auto sound = largest_sample(c, Modality::kAudio);
  ASSERT_TRUE(sound->audio);
  EXPECT_EQ(sound->audio->num_windows, 1);
  EXPECT_EQ(sound->audio->window_samples, 10 * 16000);
  c.audio.window_s = 2.5;
  EXPECT_EQ(largest_sample(c, Modality::kAudio)->audio->window_samples, 40000);

  c.text.vocab = dir / "vocab.txt";
  c.text.max_length = 40;
  const auto caption = largest_sample(c, Modality::kText);
  ASSERT_TRUE(caption->text);
  EXPECT_EQ(caption->text->ids.size(), 40u);
  EXPECT_TRUE(caption->text->truncated);
}

}  // namespace
}  // namespace precompute
