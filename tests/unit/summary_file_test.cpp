// The run summary's JSON (pipeline/summary_file.cpp) for what only a GPU run or a debug trace
// fills: the GPU memory budget's split and the start-up steps.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "pipeline/start_up_trace.hpp"
#include "pipeline/run_summary.hpp"
#include "pipeline/summary_file.hpp"

namespace precompute {
namespace {

TEST(SummaryFile, RecordsWhatTheGpuBudgetGaveEachEncoder) {
  RunSummary s;
  DeviceBudget device;
  device.device = "cuda:0";
  device.budget_bytes = 2LL << 30;
  device.weights_bytes = 300LL << 20;
  device.resident_bytes = 364LL << 20;
  device.concurrent_calls = 6;
  device.encoders.push_back({Modality::kVideo, 164LL << 20, 400LL << 20, 16, 48, 3, 350LL << 20});
  device.encoders.push_back({Modality::kText, 12LL << 20, 200LL << 20, 256, 65536, 256, 90LL << 20});
  s.gpu_budget.push_back(device);
  const auto j = nlohmann::json::parse(summary_text(s));
  const auto& budget = j.at("memory").at("gpu_budget");
  ASSERT_EQ(budget.size(), 1u);
  EXPECT_EQ(budget[0].at("device"), "cuda:0");
  EXPECT_EQ(budget[0].at("budget_bytes"), 2LL << 30);
  EXPECT_EQ(budget[0].at("weights_bytes"), 300LL << 20);
  EXPECT_EQ(budget[0].at("resident_bytes"), 364LL << 20);
  EXPECT_EQ(budget[0].at("concurrent_calls"), 6);
  const auto& encoders = budget[0].at("encoders");
  ASSERT_EQ(encoders.size(), 2u);
  EXPECT_EQ(encoders[0].at("modality"), "video");
  EXPECT_EQ(encoders[0].at("need_bytes"), 164LL << 20);
  EXPECT_EQ(encoders[0].at("share_bytes"), 400LL << 20);
  EXPECT_EQ(encoders[0].at("sample_units"), 16);
  EXPECT_EQ(encoders[0].at("batch_units"), 48);
  EXPECT_EQ(encoders[0].at("warmup_batch"), 3);
  EXPECT_EQ(encoders[0].at("warmup_reserved_bytes"), 350LL << 20);
  EXPECT_EQ(encoders[1].at("modality"), "text");
  EXPECT_EQ(encoders[1].at("batch_units"), 65536);
}

TEST(SummaryFile, WithoutABudgetTheListIsEmpty) {
  const auto j = nlohmann::json::parse(summary_text(RunSummary{}));
  EXPECT_TRUE(j.at("memory").at("gpu_budget").is_array());
  EXPECT_TRUE(j.at("memory").at("gpu_budget").empty());
  EXPECT_TRUE(j.at("start_up").empty());
}

// NVDEC sessions' busy share and the CPU decodes at once are over the time the decoders had
// work: the graph's and, before it, the samples decoded while the encoders loaded.
TEST(SummaryFile, DecodersAreJudgedOverTheGraphAndTheEarlyDecoding) {
  RunSummary s;
  s.modalities[modality_index(Modality::kVideo)] = true;
  s.video_clips = 800;
  s.nvdec_sessions = 14;
  s.graph_seconds = 8.0;
  s.early_decoding_seconds = 0.75;
  s.video_nvdec_seconds = 14 * 8.75 * 0.96;
  s.video_cpu_decode_seconds = 15.5 * 8.75;
  const auto j = nlohmann::json::parse(summary_text(s));
  EXPECT_DOUBLE_EQ(j.at("seconds").at("early_decoding").get<double>(), 0.75);
  const auto& video = j.at("video_decoding");
  EXPECT_NEAR(video.at("nvdec_busy_fraction").get<double>(), 0.96, 1e-12);
  EXPECT_NEAR(video.at("cpu_decodes_at_once").get<double>(), 15.5, 1e-12);
  EXPECT_NE(format_summary(s).find("graph ran 8.00 s (decoding began 0.75 s before it): NVDEC "
                                   "sessions busy 96% of it, CPU video decodes 15.5 at a time"),
            std::string::npos)
      << format_summary(s);
}

TEST(StartUpTrace, MarksCountFromTheProcessStartInOrderAndAClearForgetsThem) {
  note_process_start();
  mark_start_up("an earlier run's step");
  clear_start_up_marks();
  mark_start_up("first");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  mark_start_up("second");
  const auto marks = start_up_marks();
  ASSERT_EQ(marks.size(), 2u);
  EXPECT_EQ(marks[0].step, "first");
  EXPECT_EQ(marks[1].step, "second");
  // The process started before this test did: its libraries loaded, gtest set up.
  EXPECT_GT(marks[0].at_seconds, 0.0);
  EXPECT_GE(marks[1].at_seconds - marks[0].at_seconds, 0.019);
  // Not the clock of some other epoch: a test process is seconds old, not days.
  EXPECT_LT(marks[1].at_seconds, 3600.0);

  RunSummary s;
  s.start_up = marks;
  const auto j = nlohmann::json::parse(summary_text(s));
  ASSERT_EQ(j.at("start_up").size(), 2u);
  EXPECT_EQ(j.at("start_up")[1].at("step"), "second");
  EXPECT_DOUBLE_EQ(j.at("start_up")[1].at("at_s").get<double>(), marks[1].at_seconds);
}

}  // namespace
}  // namespace precompute
