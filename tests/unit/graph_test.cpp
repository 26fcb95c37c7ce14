// The real graph (pipeline/graph.cpp: limiter, parallel prepare, sequencer, router, encode
// nodes, writer) with the real stages, ShardCommitter and HDF5 shard writer, and fake encoders
// instead of LibTorch ones (fake_encoder.hpp), under 1, 2, 4 and 16 oneTBB threads. Prepare is a
// fake too (no FFmpeg): it makes frames, audio windows and token ids from the sample's line, and
// takes a different time for each sample, so that samples leave it out of order. The encoders'
// rows carry a trace of the batch they ran in, so that bit-identical shards also show that
// batches were cut the same way.
// Built without LibTorch in every build, so tools/test_sanitized.sh runs it under ASan+UBSan and
// TSan.

#include "pipeline/graph.hpp"

#include <gtest/gtest.h>

#include <csignal>
#include <fstream>
#include <iterator>
#include <map>
#include <sstream>
#include <string>
#include <thread>

#include "fake_encoder.hpp"
#include "pipeline/core/error.hpp"
#include "storage/output_id.hpp"
#include "pipeline/core/logging.hpp"
#include "pipeline/core/stop_request.hpp"
#include "pipeline/host_memory_budget.hpp"
#include "pipeline/run_stats.hpp"
#include "storage/output_index.hpp"
#include "storage/shard_reader.hpp"
#include "test_media.hpp"

namespace precompute {
namespace {

using testing::FakeEncoder;
using testing::FakeEncoderOptions;

constexpr std::string_view kBrokenVideo = "broken.mp4";

std::string id_of(int64_t seq) {
  std::string digits = std::to_string(seq);
  return "s" + std::string(digits.size() < 5 ? 5 - digits.size() : 0, '0') + digits;
}

// Sample i: a caption of 1 + i % 7 words; a video unless i % 4 == 3 (every 17th, from 5 on, is
// one the fake decoder cannot decode); audio unless i % 3 == 2.
std::vector<SampleSpec> make_input(int64_t n) {
  std::vector<SampleSpec> samples;
  for (int64_t i = 0; i < n; ++i) {
    SampleSpec s;
    s.seq = i;
    s.line = i + 1;
    s.id = id_of(i);
    std::string caption = "caption";
    for (int64_t w = 0; w < i % 7; ++w) caption += " word" + std::to_string(w);
    s.text = caption;
    if (i % 4 != 3) s.video = std::filesystem::path(i % 17 == 5 ? kBrokenVideo : "clip.mp4");
    if (i % 3 != 2) s.audio = std::filesystem::path("track.wav");
    samples.push_back(std::move(s));
  }
  return samples;
}

// What SamplePreparer would make of a line, without FFmpeg or a tokenizer: 1 to 3 frames of
// 8x8 RGB, 1 or 2 audio windows of 160 samples, and one token per word plus [CLS] and [SEP].
std::shared_ptr<PreparedSample> fake_prepare(const SampleSpec& spec) {
  auto s = std::make_shared<PreparedSample>();
  s->seq = spec.seq;
  s->order = spec.order;
  s->id = spec.id;
  if (spec.video && spec.video->file.filename() == kBrokenVideo) {
    s->failures.push_back({spec.seq, spec.id, Modality::kVideo, FailureCategory::kDecodeError,
                           "fake decoder: cannot decode " + spec.video->name()});
  } else if (spec.video) {
    VideoFrames& v = s->video.emplace();
    v.num_frames = 1 + spec.seq % 3;
    v.height = v.width = 8;
    v.rgb.assign(static_cast<size_t>(v.num_frames * 8 * 8 * 3), static_cast<uint8_t>(spec.seq));
    for (int64_t f = 0; f < v.num_frames; ++f) v.timestamps.push_back(0.5 * static_cast<double>(f));
  }
  if (spec.audio) {
    AudioWindows& a = s->audio.emplace();
    a.sample_rate = 16000;
    a.window_samples = 160;
    a.num_windows = 1 + spec.seq % 2;
    a.samples.assign(static_cast<size_t>(a.num_windows * a.window_samples), 0.25f);
    for (int64_t w = 0; w < a.num_windows; ++w) {
      a.timestamps.push_back(0.01 * static_cast<double>(w));
      a.valid_samples.push_back(a.window_samples);
    }
  }
  if (spec.text) {
    TokenizedText& t = s->text.emplace();
    t.ids.push_back(101);
    std::istringstream words(*spec.text);
    for (std::string w; words >> w;) t.ids.push_back(1000 + static_cast<int32_t>(w.size()));
    t.ids.push_back(102);
  }
  return s;
}

Config graph_config() {
  Config c;
  c.video.enabled = true;
  c.video.batch_size = 4;
  c.audio.enabled = true;
  c.audio.batch_size = 3;
  c.text.enabled = true;
  c.text.batch_size = 8;
  return c;
}

struct GraphOptions {
  int threads = 4;
  int64_t samples = 150;
  int64_t shard_size = 16;
  Config config = graph_config();
  // Per modality: the options of its fake encoders, and how many "devices" it has.
  std::array<FakeEncoderOptions, kNumModalities> encoders = [] {
    std::array<FakeEncoderOptions, kNumModalities> e;
    e[modality_index(Modality::kVideo)].per_step = true;  // CSR layout with timestamps
    e[modality_index(Modality::kVideo)].dim = 3;
    e[modality_index(Modality::kText)].dim = 8;
    e[modality_index(Modality::kText)].concurrent_calls = 2;  // as a GPU encoder
    return e;
  }();
  std::array<int, kNumModalities> devices{1, 1, 2};
  // Prepare takes 0 to this long, by sample, so that samples leave it out of order.
  std::chrono::microseconds prepare_jitter{400};
  // Changes the input before the run (a long caption, say).
  std::function<void(std::vector<SampleSpec>&)> edit_input;
  // Called by prepare with each sample before it is made, and the run's counters (to throw, or
  // to ask for a stop).
  std::function<void(const SampleSpec&, const RunStats&)> on_prepare;
  int64_t host_memory_budget = 0;  // run.host_memory_budget
};

// One run of the graph, set up as pipeline/runner.cpp sets it up, in a oneTBB arena of
// `threads` threads.
struct GraphRun {
  testing::TempDir dir;
  std::vector<SampleSpec> samples;
  RunStats stats;
  BatchCostFeedback feedback;  // what the encode stage taught the router
  EncoderPools pools;
  std::array<std::vector<FakeEncoder*>, kNumModalities> encoders;  // owned by `pools`
  std::exception_ptr error;
  OutputIndex index;  // as committed
  int64_t min_samples = 0;  // the graph's deadlock-free minimum in flight
  int64_t peak_decoded_bytes = 0;

  std::string error_message() const {
    try {
      if (error) std::rethrow_exception(error);
    } catch (const std::exception& e) {
      return e.what();
    }
    return "";
  }
  // "shard <index>" -> its file name, a newline, and its bytes (the name follows the bytes)
  std::map<std::string, std::string> shard_bytes() const {
    std::map<std::string, std::string> out;
    for (const auto& entry : index.shards) {
      std::ifstream in(dir / entry.file, std::ios::binary);
      std::string& value = out["shard " + std::to_string(entry.shard_index)];
      value = entry.file + "\n";
      value.append(std::istreambuf_iterator<char>(in), {});
    }
    return out;
  }
  std::map<int64_t, int> embedded_counts(Modality m) const {
    std::map<int64_t, int> counts;
    for (const auto* e : encoders[modality_index(m)]) {
      for (const auto& [seq, n] : e->embedded_counts()) counts[seq] += n;
    }
    return counts;
  }
};

std::unique_ptr<GraphRun> run_graph_with(const GraphOptions& o) {
  auto run = std::make_unique<GraphRun>();
  RunStats& stats = run->stats;
  run->samples = make_input(o.samples);
  if (o.edit_input) o.edit_input(run->samples);
  const Config& config = o.config;

  EncoderPools& pools = run->pools;
  for (Modality m : kAllModalities) {
    if (!config.enabled(m)) continue;
    std::vector<std::unique_ptr<Encoder>> encoders;
    for (int d = 0; d < o.devices[modality_index(m)]; ++d) {
      auto options = o.encoders[modality_index(m)];
      options.device = "fake:" + std::to_string(d);
      auto encoder = std::make_unique<FakeEncoder>(m, options);
      run->encoders[modality_index(m)].push_back(encoder.get());
      encoders.push_back(std::move(encoder));
    }
    pools[modality_index(m)] = std::make_shared<EncoderPool>(std::move(encoders));
  }

  OutputIndex index;
  index.meta.tool_version = "graph-test";
  index.meta.config_fingerprint = std::string(64, '9');
  index.meta.output_id = output_id_for(index.meta.config_fingerprint);
  index.meta.config_json = "{}";
  index.meta.dtype = StorageDtype::kFloat32;
  index.meta.chunk_rows = 8;
  for (Modality m : kAllModalities) {
    if (!pools[modality_index(m)]) continue;
    const auto& info = pools[modality_index(m)]->info();
    ModalitySchema schema;
    schema.modality = m;
    schema.per_step = info.per_step;
    schema.dim = info.dim;
    schema.encoder = info.model_file;
    schema.encoder_sha256 = info.model_sha256;
    schema.pooling = info.per_step ? "none" : "mean";
    schema.preprocessing_json = "{}";
    index.meta.modalities[modality_index(m)] = schema;
  }
  index.total_samples = o.samples;
  index.shard_size = o.shard_size;
  const ShardPlan plan = ShardPlan::cover(o.samples, o.shard_size, {});
  stats.total = plan.samples();

  // As run_precompute sizes them.
  GraphSettings settings;
  settings.decode_concurrency = o.threads;
  int max_batch = 1;
  size_t encoders = 0;
  for (Modality m : kAllModalities) {
    if (!pools[modality_index(m)]) continue;
    settings.encode_concurrency[modality_index(m)] = pools[modality_index(m)]->size();
    encoders += pools[modality_index(m)]->size();
    max_batch = std::max(max_batch, config.section(m).batch_size);
  }
  const size_t needed =
      static_cast<size_t>(max_batch) * (encoders + 1) + 2 * static_cast<size_t>(o.threads);
  settings.max_in_flight = o.host_memory_budget > 0 ? 8 * needed : needed;
  run->min_samples = static_cast<int64_t>(needed);
  HostMemoryBudget host_budget(o.host_memory_budget, static_cast<int64_t>(needed));
  settings.before_sample = [&] {
    host_budget.wait_for_room([&] { return stats.submitted.load() - stats.completed.load(); },
                              [&] { return stats.submitted.load() - stats.prepared.load(); });
  };
  const PrepareFn prepare = [&](const SampleSpec& spec) {
    if (o.on_prepare) o.on_prepare(spec, stats);
    if (o.prepare_jitter.count() > 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(
          (spec.seq * 7919) % (o.prepare_jitter.count() + 1)));
    }
    auto sample = fake_prepare(spec);
    stats.prepared.fetch_add(1);
    return host_budget.charge(std::move(sample));
  };

  settings.threads = o.threads;
  std::vector<int64_t> positions(run->samples.size());
  for (size_t i = 0; i < positions.size(); ++i) positions[i] = static_cast<int64_t>(i);

  BatchRouter router(batch_limits(config), plan, &run->feedback);
  EncodeStage encode(pools, stats, run->feedback);
  {
    ShardCommitter committer(run->dir.path(), index, stats);
    ShardAssembler assembler(committer, plan, stats);
    try {
      run_graph(run->samples, positions, prepare, router, encode, assembler, stats, settings);
      committer.finish();
      run->index = committer.index();
    } catch (...) {
      run->error = std::current_exception();
    }
  }
  if (run->error) {
    // As run_precompute, the committer was not finished; its destructor still committed the
    // shards handed to it. What a later run would find on disk:
    if (auto on_disk = read_index(run->dir.path())) run->index = std::move(*on_disk);
  }
  run->peak_decoded_bytes = host_budget.peak_bytes();
  return run;
}

// What a run's shards hold, read back with the shard reader.
struct ReadBack {
  std::map<int64_t, ShardSample> samples;
  std::map<std::pair<int64_t, Modality>, FailureRecord> failures;
  int64_t covered = 0;           // positions in the shards' ranges
  size_t expected_failures = 0;  // the input's undecodable videos
};

ReadBack read_back(const GraphRun& run) {
  ReadBack out;
  for (const auto& entry : run.index.shards) {
    const auto shard = read_shard(run.dir / entry.file);
    const auto& c = shard.contents;
    EXPECT_EQ(c.first_seq, entry.first_seq) << entry.file;
    out.covered += c.seq_count;
    for (const auto& s : c.samples) {
      EXPECT_TRUE(s.seq >= c.first_seq && s.seq < c.first_seq + c.seq_count)
          << "seq " << s.seq << " in " << entry.file;
      EXPECT_TRUE(out.samples.emplace(s.seq, s).second) << "seq " << s.seq << " stored twice";
    }
    for (const auto& f : c.failures) {
      EXPECT_TRUE(out.failures.emplace(std::pair(f.seq, f.modality), f).second)
          << "two failures for seq " << f.seq << " " << modality_name(f.modality);
    }
  }
  for (const auto& spec : run.samples) {
    out.expected_failures += spec.video && spec.video->file.filename() == kBrokenVideo ? 1 : 0;
  }
  return out;
}

class GraphTest : public ::testing::TestWithParam<int> {
 protected:
  // The encode stage's warnings (splits, retries) are expected here; SPDLOG_LEVEL=warn shows them.
  static void SetUpTestSuite() { setup_logging("error"); }
  void TearDown() override { clear_stop_request(); }
  GraphOptions options() const {
    GraphOptions o;
    o.threads = GetParam();
    return o;
  }
};

INSTANTIATE_TEST_SUITE_P(Threads, GraphTest, ::testing::Values(1, 2, 4, 16),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "_threads";
                         });

// The shards of one thread with the default options, made once per process.
const std::map<std::string, std::string>& one_thread_shards() {
  static const auto shards = [] {
    GraphOptions o;
    o.threads = 1;
    auto run = run_graph_with(o);
    EXPECT_FALSE(run->error) << run->error_message();
    return run->shard_bytes();
  }();
  return shards;
}

TEST_P(GraphTest, ShardsAreBitIdenticalToOneThreadsShards) {
  const auto run = run_graph_with(options());
  ASSERT_FALSE(run->error) << run->error_message();
  const auto shards = run->shard_bytes();
  const auto& expected = one_thread_shards();
  ASSERT_EQ(shards.size(), 10u);  // 150 samples in shards of 16
  ASSERT_EQ(shards.size(), expected.size());
  for (const auto& [file, bytes] : expected) {
    ASSERT_TRUE(shards.count(file)) << file;
    EXPECT_TRUE(shards.at(file) == bytes) << file << " differs from the one-thread run's";
  }
}

// The control of the test above: batches cut otherwise give other bits (the fake encoder's
// batch trace), so equal shards mean equal batches.
TEST(GraphControlTest, OtherBatchesGiveOtherShards) {
  GraphOptions o;
  o.config.text.batch_size = 7;
  const auto run = run_graph_with(o);
  ASSERT_FALSE(run->error) << run->error_message();
  const auto shards = run->shard_bytes();
  ASSERT_EQ(shards.size(), one_thread_shards().size());
  int differ = 0;
  for (const auto& [file, bytes] : one_thread_shards()) differ += shards.at(file) != bytes;
  // All but the last: its 6 samples are one batch of either size.
  EXPECT_EQ(differ, static_cast<int>(shards.size()) - 1);
}

TEST_P(GraphTest, EverySampleEndsUpExactlyOnce) {
  const auto run = run_graph_with(options());
  ASSERT_FALSE(run->error) << run->error_message();
  const int64_t n = static_cast<int64_t>(run->samples.size());
  EXPECT_EQ(run->stats.submitted.load(), n);
  EXPECT_EQ(run->stats.completed.load(), n);

  // Read back: each sample in the shard of its range, each modality it has embedded or failed.
  const auto stored = read_back(*run);
  EXPECT_EQ(stored.covered, n);
  std::array<std::map<int64_t, int>, kNumModalities> embedded;
  for (Modality m : kAllModalities) embedded[modality_index(m)] = run->embedded_counts(m);
  for (const auto& spec : run->samples) {
    const bool broken = spec.video && spec.video->file.filename() == kBrokenVideo;
    const std::array<bool, kNumModalities> has{spec.video && !broken, spec.audio.has_value(),
                                               true};
    ASSERT_TRUE(stored.samples.count(spec.seq)) << spec.id;  // every sample has its text
    const auto& s = stored.samples.at(spec.seq);
    EXPECT_EQ(s.id, spec.id);
    for (Modality m : kAllModalities) {
      const auto& e = s.embeddings[modality_index(m)];
      ASSERT_EQ(e.has_value(), has[modality_index(m)]) << spec.id << " " << modality_name(m);
      if (!e) continue;
      EXPECT_EQ(embedded[modality_index(m)][spec.seq], 1) << spec.id << " " << modality_name(m);
      // The fake encoder's rows, up to the batch trace (below 2^-8).
      for (int64_t r = 0; r < e->rows; ++r) {
        const auto want = testing::fake_row(spec.id, m, r, e->dim);
        for (int64_t j = 0; j < e->dim; ++j) {
          EXPECT_NEAR(e->values[static_cast<size_t>(r * e->dim + j)],
                      want[static_cast<size_t>(j)], 1.0 / 256);
        }
      }
    }
    EXPECT_EQ(stored.failures.count({spec.seq, Modality::kVideo}), broken ? 1u : 0u) << spec.id;
    if (broken) {
      EXPECT_EQ(stored.failures.at({spec.seq, Modality::kVideo}).category,
                FailureCategory::kDecodeError);
    }
  }
  EXPECT_GT(stored.expected_failures, 0u);
  EXPECT_EQ(stored.failures.size(), stored.expected_failures);
  EXPECT_EQ(embedded[modality_index(Modality::kText)].size(), static_cast<size_t>(n));

  // No encoder ran more calls at once than it offers (the pool gives each call its own).
  for (Modality m : kAllModalities) {
    for (const auto* e : run->encoders[modality_index(m)]) {
      EXPECT_LE(e->most_concurrent_calls(), e->info().concurrent_calls);
    }
  }
}

// Text batches cost more than the fake device holds: they are halved down to what fits (Note
// [Out of memory]), later batches are cut smaller, and a caption too long to fit alone fails as
// `oom` while every other sample is embedded once.
TEST_P(GraphTest, OutOfMemoryHalvesBatchesAndFailsOnlyWhatDoesNotFitAlone) {
  auto o = options();
  // Captions are 3 to 9 tokens, so batches of 8 cost up to 72; one of 32 tokens cannot fit.
  o.encoders[modality_index(Modality::kText)].oom_above_cost = 20;
  const int64_t long_seq = 37;
  o.edit_input = [&](std::vector<SampleSpec>& samples) {
    std::string caption = "long";
    for (int w = 1; w < 30; ++w) caption += " word";
    samples[long_seq].text = caption;
  };
  const auto run = run_graph_with(o);
  ASSERT_FALSE(run->error) << run->error_message();
  EXPECT_EQ(run->stats.completed.load(), static_cast<int64_t>(run->samples.size()));
  EXPECT_GT(run->stats.oom_splits.load(), 0);
  const int64_t learned = run->feedback.limit(Modality::kText);
  EXPECT_GT(learned, 0);
  EXPECT_LE(learned, 72 / 2);

  int64_t out_of_memory = 0;
  for (const auto* e : run->encoders[modality_index(Modality::kText)]) {
    for (const auto& call : e->calls()) {
      if (call.outcome == FakeEncoder::Outcome::kEmbedded) {
        EXPECT_LE(call.cost, 20);
      } else if (call.outcome == FakeEncoder::Outcome::kOutOfMemory) {
        ++out_of_memory;
      }
    }
  }
  EXPECT_GT(out_of_memory, run->stats.oom_splits.load());  // the long caption failed twice too
  const auto counts = run->embedded_counts(Modality::kText);
  EXPECT_EQ(counts.size(), run->samples.size() - 1);
  EXPECT_FALSE(counts.count(long_seq));
  for (const auto& [seq, n] : counts) EXPECT_EQ(n, 1) << seq;

  const auto stored = read_back(*run);
  ASSERT_EQ(stored.failures.size(), stored.expected_failures + 1);
  const auto& oom = stored.failures.at({long_seq, Modality::kText});
  EXPECT_EQ(oom.category, FailureCategory::kOom);
  EXPECT_NE(oom.message.find("does not fit in device memory on its own"), std::string::npos)
      << oom.message;
  // Its other modalities are embedded.
  ASSERT_TRUE(stored.samples.count(long_seq));
  EXPECT_TRUE(stored.samples.at(long_seq).embeddings[modality_index(Modality::kAudio)]);
  EXPECT_FALSE(stored.samples.at(long_seq).embeddings[modality_index(Modality::kText)]);
}

// A batch the encoder fails on is retried sample by sample: only the marked samples fail
// (encode_error), their batch-mates and their other modalities are embedded.
TEST_P(GraphTest, AFailedBatchFailsOnlyItsOwnSamples) {
  auto o = options();
  o.encoders[modality_index(Modality::kText)].failing_ids = {id_of(9), id_of(100)};
  o.encoders[modality_index(Modality::kAudio)].failing_ids = {id_of(9)};
  const auto run = run_graph_with(o);
  ASSERT_FALSE(run->error) << run->error_message();
  EXPECT_EQ(run->stats.completed.load(), static_cast<int64_t>(run->samples.size()));
  EXPECT_EQ(run->stats.batch_retries.load(), 3);  // two text batches, one audio batch

  const auto stored = read_back(*run);
  ASSERT_EQ(stored.failures.size(), stored.expected_failures + 3);
  for (const auto& [seq, m] : std::vector<std::pair<int64_t, Modality>>{
           {9, Modality::kText}, {100, Modality::kText}, {9, Modality::kAudio}}) {
    ASSERT_TRUE(stored.failures.count({seq, m})) << seq << " " << modality_name(m);
    EXPECT_EQ(stored.failures.at({seq, m}).category, FailureCategory::kEncodeError);
  }
  EXPECT_TRUE(stored.samples.at(9).embeddings[modality_index(Modality::kVideo)]);
  EXPECT_TRUE(stored.samples.at(100).embeddings[modality_index(Modality::kVideo)]);
  // Everyone else's text, once (the retried batch-mates are embedded by their retries).
  const auto counts = run->embedded_counts(Modality::kText);
  EXPECT_EQ(counts.size(), run->samples.size() - 2);
  for (const auto& [seq, n] : counts) EXPECT_EQ(n, 1) << seq;
  for (int64_t seq : {8, 10, 15, 96, 103}) {  // batch-mates of the failed samples
    EXPECT_TRUE(stored.samples.at(seq).embeddings[modality_index(Modality::kText)]) << seq;
  }
}

// A stop request (SIGTERM) takes no more samples and drops those in flight (Note [A stop drops
// the samples in flight]); the shards completed before it are committed, the same bits as an
// uninterrupted run's, and the rest are not written.
TEST_P(GraphTest, StopCommitsTheCompleteShardsOnly) {
  const auto& uninterrupted = one_thread_shards();  // made before the stop is asked for
  auto o = options();
  o.samples = 2000;  // the in-flight limit keeps the source far from the end
  o.on_prepare = [](const SampleSpec&, const RunStats& stats) {
    if (stats.shards_written.load() >= 2) request_stop(SIGTERM);
  };
  const auto run = run_graph_with(o);
  ASSERT_FALSE(run->error) << run->error_message();
  EXPECT_TRUE(stop_requested());
  EXPECT_LT(run->stats.submitted.load(), 1000);
  const auto shards = run->shard_bytes();
  EXPECT_GE(shards.size(), 2u);
  for (const auto& entry : run->index.shards) {
    // The uninterrupted run's 150 samples make 10 shards, the last one short, so only shards
    // 0-8 have a counterpart there. Shards commit in any order, so a later one (full, of this
    // run's 2000 samples) may be among the committed ones; it is checked by its count below.
    if (entry.shard_index >= 9) continue;
    const std::string file = "shard " + std::to_string(entry.shard_index);
    const std::string& bytes = shards.at(file);
    ASSERT_TRUE(uninterrupted.count(file)) << file;
    EXPECT_TRUE(bytes == uninterrupted.at(file)) << file;
  }
  for (const auto& entry : run->index.shards) EXPECT_EQ(entry.seq_count, 16);
  EXPECT_TRUE(read_index(run->dir.path()).has_value());
}

// A stop does not wait for the samples in flight: with encoders that take half a second a
// call, finishing the ~80 samples admitted would take several calls of the one video encoder
// (2.5 s and more); the stop waits only for the calls already running. The shards it commits
// are whole: the same bits as an uninterrupted run's.
TEST_P(GraphTest, AStopDropsTheSamplesInFlight) {
  using Clock = std::chrono::steady_clock;
  const auto& uninterrupted = one_thread_shards();
  auto o = options();
  for (auto& e : o.encoders) e.sleep_per_call = std::chrono::milliseconds(500);
  auto stopped_at = std::make_shared<std::atomic<int64_t>>(0);
  o.on_prepare = [stopped_at](const SampleSpec& spec, const RunStats&) {
    if (spec.order != 40) return;
    stopped_at->store(Clock::now().time_since_epoch().count());
    request_stop(SIGTERM);
  };
  const auto run = run_graph_with(o);
  const auto took = Clock::now() - Clock::time_point(Clock::duration(stopped_at->load()));
  ASSERT_FALSE(run->error) << run->error_message();
  ASSERT_NE(stopped_at->load(), 0);
  EXPECT_LT(took, std::chrono::milliseconds(1500))
      << std::chrono::duration<double>(took).count() << " s from the stop to the end";
  EXPECT_LT(run->stats.completed.load(), 40);
  for (const auto& [file, bytes] : run->shard_bytes()) {
    ASSERT_TRUE(uninterrupted.count(file)) << file;
    EXPECT_TRUE(bytes == uninterrupted.at(file)) << file;
  }
  for (const auto& entry : run->index.shards) EXPECT_LE(entry.first_seq + entry.seq_count, 40);
}

// An exception that is a bug (not a ModelError) in an encoder cancels the graph: run_graph
// rethrows it without taking the rest of the input, and no shard holding the sample is
// committed.
TEST_P(GraphTest, AnEncoderBugCancelsTheGraph) {
  auto o = options();
  o.samples = 2000;
  o.encoders[modality_index(Modality::kText)].throwing_ids = {id_of(20)};
  const auto run = run_graph_with(o);
  ASSERT_TRUE(run->error);
  EXPECT_NE(run->error_message().find("a bug on a marked sample"), std::string::npos)
      << run->error_message();
  EXPECT_LT(run->stats.submitted.load(), 1000);
  for (const auto& entry : run->index.shards) {
    EXPECT_TRUE(entry.first_seq > 20 || entry.first_seq + entry.seq_count <= 20)
        << entry.file << " holds the failed sample";
  }
}

// The same for a bug in the prepare stage (a MediaError would be a failure record instead).
TEST_P(GraphTest, APrepareBugCancelsTheGraph) {
  auto o = options();
  o.samples = 2000;
  o.on_prepare = [](const SampleSpec& spec, const RunStats&) {
    PC_ASSERT(spec.seq != 50, "a bug in prepare on ", spec.id);
  };
  const auto run = run_graph_with(o);
  ASSERT_TRUE(run->error);
  EXPECT_NE(run->error_message().find("a bug in prepare on s00050"), std::string::npos)
      << run->error_message();
  EXPECT_LT(run->stats.submitted.load(), 1000);
  for (const auto& entry : run->index.shards) {
    EXPECT_LE(entry.first_seq + entry.seq_count, 50) << entry.file << " holds the failed sample";
  }
}

// run.host_memory_budget holds the source back (Note [Host memory budget]): with slow encoders,
// the decoded bytes held stay within the budget plus the graph's minimum in flight, where
// without it they grow towards the in-flight limit (8 times that minimum).
TEST_P(GraphTest, HostMemoryBudgetHoldsTheSourceBack) {
  if (GetParam() < 2) {
    GTEST_SKIP() << "the source waits for room on a thread of the graph: the runner gives the "
                    "graph at least decode threads + encoders + 2 threads";
  }
  auto o = options();
  o.samples = 600;
  o.shard_size = 64;
  o.prepare_jitter = std::chrono::microseconds(0);
  // A small minimum in flight, so that the budget is what binds.
  o.config.video.batch_size = o.config.audio.batch_size = o.config.text.batch_size = 2;
  o.devices = {1, 1, 1};
  for (auto& e : o.encoders) {
    e.concurrent_calls = 1;
    e.sleep_per_call = std::chrono::microseconds(1000);
  }
  int64_t largest = 0;
  for (const auto& spec : make_input(o.samples)) {
    largest = std::max(largest, static_cast<int64_t>(fake_prepare(spec)->bytes()));
  }
  o.host_memory_budget = 8 * largest;
  const auto run = run_graph_with(o);
  ASSERT_FALSE(run->error) << run->error_message();
  EXPECT_EQ(run->stats.completed.load(), o.samples);
  // Admitted under the budget: at most the budget and the sample being admitted; under the
  // minimum: at most that many samples. Either way plus the batches being encoded, whose
  // samples are released just after the writer counts them.
  const int64_t bound = o.host_memory_budget + (run->min_samples + 1) * largest;
  EXPECT_GT(run->peak_decoded_bytes, 0);
  EXPECT_LE(run->peak_decoded_bytes, bound);

  // The same run with a budget that never binds: the bound above would catch a source that
  // ignored the budget.
  o.host_memory_budget = int64_t{1} << 40;
  const auto unbounded = run_graph_with(o);
  ASSERT_FALSE(unbounded->error) << unbounded->error_message();
  EXPECT_GT(unbounded->peak_decoded_bytes, bound);
}

}  // namespace
}  // namespace precompute
