// Tests that need a CUDA device (CTest label `gpu`): the paths a CPU machine cannot reach.
//   - BERT's packed flash-attention path against the padded path and a float32 CPU reference;
//   - the short-sequence attention kernel against flash attention and float32 attention;
//   - two encode() calls at once on one encoder, each on its own CUDA stream, against the same
//     batches run one at a time (bit for bit);
//   - the caching allocator's cap (cap_device_memory): a batch past it fails as
//     DeviceOutOfMemoryError, never more than the cap is reserved, and the encoder goes on;
//   - the NVDEC pool's default size, a session per engine as the driver counts them.
// NVDEC is tested end to end by tests/gpu/nvdec_parity.py. tools/gpu_tests.sh runs all of them on
// the GPU machine. Without a GPU the tests skip, unless PRECOMPUTE_REQUIRE_GPU=1 (set by that
// script) makes a missing device or model a failure.

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/script.h>

#include <cuda.h>
#include <cuda_runtime.h>
#include <ucontext.h>
#include <unistd.h>

#include <csignal>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "encoders/bert/bert_model.hpp"
#include "encoders/bert/model_folder.hpp"
#include "encoders/bert/short_attention_kernel.hpp"
#include "encoders/embedding_output.hpp"
#include "encoders/encoder.hpp"
#include "pipeline/core/config.hpp"
#include "pipeline/core/error.hpp"
#include "pipeline/media/nvdec.hpp"
#include "pipeline/run_stats.hpp"
#include "pipeline/stages/sample_preparer.hpp"

namespace precompute {
namespace {

// A crash in CUDA code leaves ctest with "SegFault" alone, and the GPU machine has no debugger:
// print the faulting address and every word near the stack pointer that points into a mapped
// file ("lib+offset", for addr2line), which works even when the fault is a call through null.
void print_code_address(uintptr_t a) {
  FILE* maps = std::fopen("/proc/self/maps", "r");
  if (maps == nullptr) return;
  char line[512];
  while (std::fgets(line, sizeof line, maps) != nullptr) {
    unsigned long lo = 0, hi = 0, off = 0;
    char perms[8] = {0}, path[400] = {0};
    if (std::sscanf(line, "%lx-%lx %7s %lx %*s %*s %399s", &lo, &hi, perms, &off, path) < 4) continue;
    if (a >= lo && a < hi && perms[2] == 'x' && path[0] == '/') {
      std::fprintf(stderr, "  %s+0x%lx\n", path, a - lo + off);
      break;
    }
  }
  std::fclose(maps);
}
void print_crash_and_die(int sig, siginfo_t* info, void* context) {
  const auto* uc = static_cast<const ucontext_t*>(context);
  const auto rip = static_cast<uintptr_t>(uc->uc_mcontext.gregs[REG_RIP]);
  const auto* rsp = reinterpret_cast<const uintptr_t*>(uc->uc_mcontext.gregs[REG_RSP]);
  std::fprintf(stderr, "signal %d at pc 0x%lx, address %p; pc and code addresses on the stack:\n",
               sig, static_cast<unsigned long>(rip), info->si_addr);
  print_code_address(rip);
  for (int i = 0; i < 256; ++i) print_code_address(rsp[i]);
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}
const bool report_crashes = [] {
  struct sigaction action = {};
  action.sa_sigaction = print_crash_and_die;
  action.sa_flags = SA_SIGINFO;
  sigaction(SIGSEGV, &action, nullptr);
  sigaction(SIGABRT, &action, nullptr);
  return true;
}();

bool gpu_required() {
  const char* v = std::getenv("PRECOMPUTE_REQUIRE_GPU");
  return v != nullptr && std::string(v) == "1";
}

#define NEED_GPU()                                                                      \
  do {                                                                                  \
    if (!torch::cuda::is_available()) {                                                 \
      if (gpu_required()) FAIL() << "PRECOMPUTE_REQUIRE_GPU=1 but no CUDA device";      \
      GTEST_SKIP() << "no CUDA device";                                                 \
    }                                                                                   \
  } while (0)

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return INFINITY;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(static_cast<double>(a[i]) - b[i]));
  }
  return worst;
}

// Per-row cosine of two [T, D] tensors, in float32 on the CPU.
at::Tensor row_cosines(const at::Tensor& a, const at::Tensor& b) {
  const auto x = a.to(at::kCPU, at::kFloat);
  const auto y = b.to(at::kCPU, at::kFloat);
  return (x * y).sum(1) / (x.norm(2, 1) * y.norm(2, 1)).clamp_min(1e-12);
}

// ------------------------------------------------------------------------------------------------
// BERT attention

class BertAttentionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NEED_GPU();
    const char* dir = std::getenv("PRECOMPUTE_TEST_BERT_DIR");
    if (dir == nullptr || !std::filesystem::is_directory(dir)) {
      if (gpu_required()) FAIL() << "set PRECOMPUTE_TEST_BERT_DIR to a BERT folder";
      GTEST_SKIP() << "PRECOMPUTE_TEST_BERT_DIR is not set";
    }
    folder_ = read_model_folder(dir);
  }

  // Sequences of every length class the packed path meets: one token, short, a length that is
  // not a multiple of 8, the longest the model takes, and several of one length.
  std::vector<std::vector<int32_t>> sequences(int64_t vocab, int64_t max_positions) const {
    std::mt19937 rng(7);
    std::uniform_int_distribution<int32_t> token(1000, static_cast<int32_t>(vocab - 1));
    std::vector<std::vector<int32_t>> out;
    for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{7}, int64_t{33}, int64_t{64},
                      max_positions, int64_t{128}, int64_t{128}, int64_t{5}}) {
      std::vector<int32_t> s(static_cast<size_t>(std::min(n, max_positions)));
      for (auto& t : s) t = token(rng);
      out.push_back(std::move(s));
    }
    return out;
  }

  static PackedBatch pack(const std::vector<std::vector<int32_t>>& seqs,
                          const c10::Device& device) {
    std::vector<const std::vector<int32_t>*> ptrs;
    for (const auto& s : seqs) ptrs.push_back(&s);
    return pack_sequences(ptrs, device);
  }

  static at::Tensor run(const BertModel& model, const std::vector<std::vector<int32_t>>& seqs,
                        const c10::Device& device) {
    c10::InferenceMode guard;
    return model.forward(pack(seqs, device)).to(at::kCPU, at::kFloat);
  }

  ModelFolder folder_;
};

TEST_F(BertAttentionTest, FlashPathMatchesPaddedPathAndFloat32Reference) {
  const c10::Device cuda("cuda:0");
  const BertModel packed(folder_, cuda, at::kHalf, -1);
  ASSERT_EQ(packed.attention(), BertModel::Attention::kPacked)
      << "float16 on CUDA must take the flash-attention path";
  ::setenv("PRECOMPUTE_BERT_ATTENTION", "padded", 1);
  const BertModel padded(folder_, cuda, at::kHalf, -1);
  ::unsetenv("PRECOMPUTE_BERT_ATTENTION");
  ASSERT_EQ(padded.attention(), BertModel::Attention::kPadded);
  const BertModel reference(folder_, c10::Device("cpu"), at::kFloat, -1);

  const auto seqs = sequences(packed.vocab_size(), packed.max_positions());
  const auto got = run(packed, seqs, cuda);
  const auto other = run(padded, seqs, cuda);
  const auto ref = run(reference, seqs, c10::Device("cpu"));
  ASSERT_EQ(got.sizes(), ref.sizes());

  const double vs_ref = row_cosines(got, ref).min().item<double>();
  const double padded_vs_ref = row_cosines(other, ref).min().item<double>();
  const double vs_padded = row_cosines(got, other).min().item<double>();
  RecordProperty("min_cosine_flash_vs_fp32", std::to_string(vs_ref));
  EXPECT_GE(vs_ref, 0.999) << "flash attention (fp16) against the fp32 CPU reference";
  EXPECT_GE(padded_vs_ref, 0.999) << "padded attention (fp16) against the fp32 CPU reference";
  EXPECT_GE(vs_padded, 0.999) << "flash against padded attention, both fp16";
  // The measure can fail: tokens of one sequence against another's are far apart.
  const int64_t first_len = static_cast<int64_t>(seqs[0].size() + seqs[1].size());
  const auto shifted = row_cosines(got.narrow(0, first_len, 64), ref.narrow(0, first_len + 1, 64));
  EXPECT_LT(shifted.min().item<double>(), 0.99);
}

TEST_F(BertAttentionTest, FlashPathKeepsSequencesApart) {
  // A sequence's vectors must not depend on what else is in the batch (cu_seqlens bounds each
  // sequence's attention): alone and among others give the same vectors.
  const c10::Device cuda("cuda:0");
  const BertModel packed(folder_, cuda, at::kHalf, -1);
  const auto seqs = sequences(packed.vocab_size(), packed.max_positions());
  const auto together = run(packed, seqs, cuda);
  int64_t offset = 0;
  for (const auto& s : seqs) {
    const auto alone = run(packed, {s}, cuda);
    const auto n = static_cast<int64_t>(s.size());
    EXPECT_GE(row_cosines(together.narrow(0, offset, n), alone).min().item<double>(), 0.999)
        << "sequence of " << n << " tokens at offset " << offset;
    offset += n;
  }
}

TEST_F(BertAttentionTest, ShortSequenceKernelMatchesFlashAndFloat32Reference) {
  // Batches of short sequences take the short-sequence kernel; PRECOMPUTE_BERT_ATTENTION=flash
  // keeps them on flash attention. Both against the float32 CPU model.
  const c10::Device cuda("cuda:0");
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> token(
      1000, static_cast<int32_t>(folder_.config.vocab_size - 1));
  const auto make = [&](const std::vector<int>& lengths) {
    std::vector<std::vector<int32_t>> out;
    for (const int n : lengths) {
      std::vector<int32_t> s(static_cast<size_t>(n));
      for (auto& t : s) t = token(rng);
      out.push_back(std::move(s));
    }
    return out;
  };
  // Lengths around a warp's 32 lanes and up to the kernel's 64, among enough short ones that
  // the mean squared length (below 22^2) picks the kernel.
  std::vector<int> lengths = {1, 2, 3, 7, 14, 31, 32, 33, 40, 63, 64, 5};
  for (int i = 0; i < 60; ++i) lengths.push_back(3 + i % 9);
  const auto seqs = make(lengths);
  const auto packed_of = [](const std::vector<std::vector<int32_t>>& s) {
    return pack(s, c10::Device("cpu"));
  };
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    const BertModel model(folder_, cuda, dtype, -1);
    ASSERT_TRUE(model.takes_short_attention(packed_of(seqs)));
    EXPECT_FALSE(model.takes_short_attention(packed_of(make({65, 3, 3, 3, 3, 3, 3, 3}))))
        << "a sequence past 64 tokens";
    EXPECT_FALSE(model.takes_short_attention(packed_of(make({24, 24, 23}))))
        << "a mean squared length past 22^2";
    EXPECT_TRUE(model.takes_short_attention(packed_of(make({22, 22}))));
    ::setenv("PRECOMPUTE_BERT_ATTENTION", "flash", 1);
    const BertModel flash(folder_, cuda, dtype, -1);
    ::unsetenv("PRECOMPUTE_BERT_ATTENTION");
    ASSERT_FALSE(flash.takes_short_attention(packed_of(seqs)));
    const BertModel reference(folder_, c10::Device("cpu"), at::kFloat, -1);

    const auto got = run(model, seqs, cuda);
    const auto other = run(flash, seqs, cuda);
    const auto ref = run(reference, seqs, c10::Device("cpu"));
    ASSERT_EQ(got.sizes(), ref.sizes());
    const double vs_ref = row_cosines(got, ref).min().item<double>();
    const double flash_vs_ref = row_cosines(other, ref).min().item<double>();
    RecordProperty(std::string("min_cosine_short_vs_fp32_") + c10::toString(dtype),
                   std::to_string(vs_ref));
    EXPECT_GE(vs_ref, 0.999) << c10::toString(dtype) << ": short kernel against float32";
    EXPECT_GE(flash_vs_ref, 0.999) << c10::toString(dtype) << ": flash against float32";
    EXPECT_GE(row_cosines(got, other).min().item<double>(), 0.999)
        << c10::toString(dtype) << ": short kernel against flash";
  }
}

// The kernel alone, on random queries, keys and values, against attention computed in float32
// from the same 16-bit inputs: every head size it takes, lengths around a warp's 32 lanes and
// its 64-token bound.
TEST(ShortAttentionKernelTest, MatchesFloat32AttentionForEveryHeadSizeAndLength) {
  NEED_GPU();
  const c10::Device cuda("cuda:0");
  const std::vector<int> lengths = {1, 2, 3, 7, 16, 31, 32, 33, 47, 63, 64, 9};
  const int heads = 3;
  std::vector<int32_t> offsets = {0};
  for (const int n : lengths) offsets.push_back(offsets.back() + n);
  const int64_t total = offsets.back();
  const auto cu = at::tensor(offsets, at::kInt).to(cuda);
  c10::InferenceMode guard;
  for (const auto dtype : {at::kHalf, at::kBFloat16}) {
    for (const int d : {8, 32, 64, 72, 128}) {
      at::manual_seed(d);
      const auto qkv = at::randn({total, 3, heads, d}, at::TensorOptions().device(cuda)).to(dtype);
      auto out = at::full({total, heads * d}, NAN, qkv.options());
      ShortAttentionParams p;
      p.qkv = qkv.data_ptr();
      p.out = out.data_ptr();
      p.cu_seqlens = cu.data_ptr<int32_t>();
      p.sequences = static_cast<int64_t>(lengths.size());
      p.heads = heads;
      p.head_dim = d;
      p.max_length = 64;
      p.scale = static_cast<float>(1.0 / std::sqrt(d));
      p.bfloat16 = dtype == at::kBFloat16;
      ASSERT_EQ(launch_short_attention(p, c10::cuda::getCurrentCUDAStream().stream()), 0);
      const auto x = qkv.to(at::kFloat);
      double worst = 0;
      for (size_t i = 0; i < lengths.size(); ++i) {
        const auto part = x.narrow(0, offsets[i], lengths[i]).transpose(0, 2);  // [h, 3, L, d]
        const auto q = part.select(1, 0), k = part.select(1, 1), v = part.select(1, 2);
        const auto want = at::matmul(at::softmax(at::matmul(q, k.transpose(1, 2)) * p.scale, -1), v)
                              .transpose(0, 1)
                              .reshape({lengths[i], heads * d});
        const auto have = out.narrow(0, offsets[i], lengths[i]).to(at::kFloat);
        worst = std::max(worst, (have - want).abs().max().item<double>());
      }
      // One rounding of an output below 3 in magnitude: 2^-7 in bfloat16, 2^-10 in float16.
      const double bound = dtype == at::kBFloat16 ? 1.0 / 64 : 1.0 / 512;
      EXPECT_LE(worst, bound) << c10::toString(dtype) << ", head_dim " << d;
      EXPECT_FALSE(out.isnan().any().item<bool>()) << "a row was left unwritten";
    }
  }
}

TEST(ShortAttentionKernelTest, RefusesWhatItCannotTake) {
  NEED_GPU();
  const c10::Device cuda("cuda:0");
  const auto qkv = at::zeros({80, 3, 2, 64}, at::TensorOptions().device(cuda).dtype(at::kHalf));
  auto out = at::empty({80, 128}, qkv.options());
  const auto cu = at::tensor(std::vector<int32_t>{0, 80}, at::kInt).to(cuda);
  ShortAttentionParams p;
  p.qkv = qkv.data_ptr();
  p.out = out.data_ptr();
  p.cu_seqlens = cu.data_ptr<int32_t>();
  p.sequences = 1;
  p.heads = 2;
  p.head_dim = 64;
  p.max_length = 80;  // past kShortAttentionMaxLength
  p.bfloat16 = false;
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  EXPECT_NE(launch_short_attention(p, stream), 0);
  p.max_length = 64;
  p.head_dim = 12;  // not a multiple of 8
  EXPECT_NE(launch_short_attention(p, stream), 0);
  p.head_dim = 64;
  p.qkv = static_cast<const char*>(qkv.data_ptr()) + 2;  // not 16-byte aligned
  EXPECT_NE(launch_short_attention(p, stream), 0);
  EXPECT_STRNE(short_attention_error_name(launch_short_attention(p, stream)), "no error");
}

// ------------------------------------------------------------------------------------------------
// A video encoder on the GPU: streams and the allocator cap

constexpr int kSide = 64;
constexpr int64_t kDim = 256;

// A TorchScript model built here (no Python): frames [N, 3, 64, 64] -> [N, 256] through one
// matmul, enough GPU work per call for two streams to overlap.
std::filesystem::path make_video_model(const std::filesystem::path& dir) {
  torch::jit::Module m("FrameProjection");
  at::manual_seed(3);
  m.register_parameter("w", at::randn({3 * kSide * kSide, kDim}) * 0.01, false);
  m.define(R"(
    def forward(self, x):
        return torch.tanh(torch.matmul(x.flatten(1), self.w))
  )");
  const auto path = dir / "frames.pt";
  m.save(path.string());
  return path;
}

class VideoEncoderGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    NEED_GPU();
    dir_ = std::filesystem::temp_directory_path() /
           ("precompute-gpu-test-" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir_);
    const auto model = make_video_model(dir_);
    config_ = parse_config(
        "input: {manifest: m.jsonl}\noutput: {path: out}\n"
        "video: {encoder: {type: torchscript, path: " + model.string() + "}, device: cuda:0, "
        "size: " + std::to_string(kSide) + ", sampling: {num_frames: 4}, dtype: float32}\n",
        dir_);
    encoder_ = load_encoder(config_, Modality::kVideo, "cuda:0");
  }
  void TearDown() override {
    encoder_.reset();
    // std::filesystem::remove_all crashed here when this binary bound it to LibTorch's copy
    // (Note [LibTorch exports std::filesystem] in cmake/PrecomputeCompilerOptions.cmake): it
    // stays, as the check that the link keeps libstdc++ first.
    if (!dir_.empty()) std::filesystem::remove_all(dir_);
  }

  static std::vector<PreparedSamplePtr> batch(int samples, int frames, uint32_t seed) {
    std::mt19937 rng(seed);
    std::uniform_int_distribution<int> byte(0, 255);
    std::vector<PreparedSamplePtr> out;
    for (int i = 0; i < samples; ++i) {
      auto s = std::make_shared<PreparedSample>();
      s->seq = i;
      s->id = std::to_string(seed);
      s->id += '-';
      s->id += std::to_string(i);
      auto& v = s->video.emplace();
      v.num_frames = frames;
      v.height = kSide;
      v.width = kSide;
      v.rgb.resize(static_cast<size_t>(frames) * kSide * kSide * 3);
      for (auto& b : v.rgb) b = static_cast<uint8_t>(byte(rng));
      v.timestamps.assign(static_cast<size_t>(frames), 0.0);
      out.push_back(std::move(s));
    }
    return out;
  }

  std::filesystem::path dir_;
  Config config_;
  std::unique_ptr<Encoder> encoder_;
};

TEST_F(VideoEncoderGpuTest, TwoCallsAtOnceOnTheirOwnStreamsMatchOneAtATime) {
  ASSERT_EQ(encoder_->info().concurrent_calls, 2) << "a CUDA encoder runs two calls at once";
  ASSERT_EQ(encoder_->info().dim, kDim);
  constexpr int kBatches = 12;
  std::vector<std::vector<PreparedSamplePtr>> batches;
  std::vector<std::vector<SampleEmbedding>> expected;
  for (int b = 0; b < kBatches; ++b) {
    batches.push_back(batch(16, 4 + b % 3, static_cast<uint32_t>(100 + b)));
    expected.push_back(encoder_->encode(batches.back()));
  }
  // Different batches give different vectors, so a mix-up between streams would show.
  ASSERT_NE(expected[0][0].values, expected[1][0].values);

  // The same batches once more, one at a time: what float arithmetic alone varies by.
  double serial_worst = 0;
  for (int b = 0; b < kBatches; ++b) {
    const auto again = encoder_->encode(batches[b]);
    for (size_t s = 0; s < again.size(); ++s) {
      serial_worst = std::max(serial_worst, max_abs_diff(again[s].values, expected[b][s].values));
    }
  }
  std::printf("one at a time, twice: max abs diff %.3g\n", serial_worst);
  std::fflush(stdout);

  // Two threads, each encoding every batch several times in a different order. A stream mix-up
  // (a batch read before its copy landed, a result read before its kernel ended) gives another
  // batch's or uninitialised values, differences of order 0.1-1 (the model ends in tanh);
  // reordered float sums give 1e-6.
  constexpr double kTolerance = 1e-4;
  double worst[2] = {0, 0};
  std::vector<std::string> mismatches[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        for (int i = 0; i < kBatches; ++i) {
          const int b = t == 0 ? i : kBatches - 1 - i;
          const auto got = encoder_->encode(batches[b]);
          for (size_t s = 0; s < got.size(); ++s) {
            const double diff = max_abs_diff(got[s].values, expected[b][s].values);
            worst[t] = std::max(worst[t], diff);
            if (diff > kTolerance) {
              mismatches[t].push_back("batch " + std::to_string(b) + " sample " +
                                      std::to_string(s) + " round " + std::to_string(round) +
                                      ": max abs diff " + std::to_string(diff));
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  std::printf("two at once: max abs diff %.3g and %.3g\n", worst[0], worst[1]);
  std::fflush(stdout);
  EXPECT_TRUE(mismatches[0].empty()) << mismatches[0].size() << " mismatches, first: "
                                     << (mismatches[0].empty() ? "" : mismatches[0][0]);
  EXPECT_TRUE(mismatches[1].empty()) << mismatches[1].size() << " mismatches, first: "
                                     << (mismatches[1].empty() ? "" : mismatches[1][0]);
}

TEST_F(VideoEncoderGpuTest, AllocatorCapTurnsABigBatchIntoDeviceOutOfMemoryAndTheEncoderGoesOn) {
  const std::string device = "cuda:0";
  release_cached_device_memory(device);
  const auto before = device_memory_use(device);
  ASSERT_TRUE(before.has_value());
  const int64_t cap = before->reserved_bytes + (256LL << 20);
  cap_device_memory(device, cap);
  reset_device_memory_peaks(device);

  // 4,096 frames: 201 MB of float input alone, plus its uint8 copy and intermediates.
  const auto big = batch(128, 32, 1);
  std::printf("cap %lld MiB above %lld MiB reserved\n", static_cast<long long>(cap >> 20),
              static_cast<long long>(before->reserved_bytes >> 20));
  std::fflush(stdout);
  try {
    encoder_->encode(big);
    ADD_FAILURE() << "a batch needing more than the cap was embedded";
  } catch (const DeviceOutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("ran out of memory"), std::string::npos) << e.what();
  }
  // Other errors (a plain ModelError) would have escaped the catch above and failed the test.
  const auto small = batch(8, 4, 2);
  const auto out = encoder_->encode(small);
  EXPECT_EQ(out.size(), small.size());
  const auto after = device_memory_use(device);
  EXPECT_LE(after->peak_reserved_bytes, cap) << "the allocator reserved past its cap";
  cap_device_memory(device, after->total_bytes);
  // Without the cap, the same batch goes through.
  EXPECT_EQ(encoder_->encode(big).size(), big.size());
}

// ------------------------------------------------------------------------------------------------
// Pooling on the GPU and the copy out through pinned memory (Note [Copying out through pinned
// memory] in encoders/embedding_output.cpp)

TEST(EmbeddingOutputGpuTest, PoolsAsTheCpuDoesWithTwoCallsAtOnceOnTheirOwnStreams) {
  NEED_GPU();
  // Batches of uneven samples, each held to the CPU's result for every pooling; two threads on
  // streams of their own reuse the same pinned blocks, so a block handed out again before its
  // copy landed would give another batch's vectors.
  constexpr int kBatches = 8;
  std::mt19937 rng(7);
  std::uniform_int_distribution<int64_t> steps(1, 40);
  std::vector<std::vector<int64_t>> counts(kBatches);
  std::vector<at::Tensor> rows(kBatches);
  for (int b = 0; b < kBatches; ++b) {
    counts[b].resize(static_cast<size_t>(500 + 97 * b));
    for (auto& c : counts[b]) c = steps(rng);
    const int64_t total = std::accumulate(counts[b].begin(), counts[b].end(), int64_t{0});
    rows[b] = at::randn({total, 96}, at::TensorOptions().dtype(at::kFloat));
  }
  const Pooling poolings[] = {Pooling::kMean, Pooling::kMax, Pooling::kCls, Pooling::kNone};
  std::string mismatch[2];
  std::vector<std::thread> threads;
  for (int t = 0; t < 2; ++t) {
    threads.emplace_back([&, t] {
      const auto stream = c10::cuda::getStreamFromPool(false, 0);
      const c10::cuda::CUDAStreamGuard guard(stream);
      for (int round = 0; round < 4 && mismatch[t].empty(); ++round) {
        for (int i = 0; i < kBatches && mismatch[t].empty(); ++i) {
          const int b = t == 0 ? i : kBatches - 1 - i;
          const auto pooling = poolings[(round + i) % 4];
          const bool normalize = round % 2 == 1;
          const auto want = embeddings_from_rows(rows[b], counts[b], pooling, normalize);
          const auto got =
              embeddings_from_rows(rows[b].to(at::kCUDA), counts[b], pooling, normalize);
          for (size_t s = 0; s < got.size() && mismatch[t].empty(); ++s) {
            const double diff = max_abs_diff(got[s].values, want[s].values);
            if (diff > 1e-5 || got[s].rows != want[s].rows || got[s].steps != want[s].steps) {
              mismatch[t] = "batch " + std::to_string(b) + " sample " + std::to_string(s) +
                            " pooling " + std::to_string(static_cast<int>(pooling)) +
                            ": max abs diff " + std::to_string(diff);
            }
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(mismatch[0], "");
  EXPECT_EQ(mismatch[1], "");
}

// ------------------------------------------------------------------------------------------------
// NVDEC sessions, two per engine by default (Note [Two sessions per engine] in
// pipeline/media/nvdec.cpp), all of a GPU's in one CUDA context (Note [One CUDA context for a
// GPU's sessions] there)

// The CUDA context current on this thread (the driver's cuCtxGetCurrent, found through the
// runtime so that the test binary does not link libcuda, which machines without a GPU lack).
const void* current_cuda_context() {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      fn == nullptr || found != cudaDriverEntryPointSuccess) {
    return nullptr;
  }
  CUcontext context = nullptr;
  if (reinterpret_cast<CUresult (*)(CUcontext*)>(fn)(&context) != CUDA_SUCCESS) return nullptr;
  return context;
}

#define NEED_NVDEC()                                                                        \
  do {                                                                                      \
    NEED_GPU();                                                                             \
    if (!nvdec_built()) {                                                                   \
      if (gpu_required()) FAIL() << "PRECOMPUTE_REQUIRE_GPU=1 but this build has no NVDEC"; \
      GTEST_SKIP() << "this build has no NVDEC";                                            \
    }                                                                                       \
  } while (0)

TEST(NvdecPoolGpuTest, ZeroSessionsOpensTwoPerEngineAndACountOpensThatMany) {
  NEED_NVDEC();
  std::string why_not;
  const auto engines = nvdec_engine_count(0, &why_not);
  ASSERT_TRUE(engines.has_value()) << why_not;
  EXPECT_GE(*engines, 1);
  // NVIDIA's tables: the Hopper data-centre parts have 7 NVDEC engines.
  const std::string name = at::cuda::getDeviceProperties(0)->name;
  if (name.find("H100") != std::string::npos || name.find("H200") != std::string::npos) {
    EXPECT_EQ(*engines, 7) << name;
  }
  const NvdecPool per_engine({0}, 0);
  EXPECT_EQ(per_engine.size(), 2 * *engines);
  EXPECT_NE(per_engine.describe().find("(two per engine)"), std::string::npos)
      << per_engine.describe();
  const NvdecPool given({0}, 2);
  EXPECT_EQ(given.size(), 2);
  EXPECT_EQ(given.describe(), "2 NVDEC session(s) on cuda:0");
}

// Note [One CUDA context for a GPU's sessions]: the sessions share one context of their own by
// default and LibTorch's primary one with video.nvdec_own_context: false; either way each has a
// stream of its own at the device's highest priority, above the encoders' pool streams, and
// opening the pool leaves the caller's current context as it was.
TEST(NvdecPoolGpuTest, AGpusSessionsShareOneContextTheEncodersOrTheirOwn) {
  NEED_NVDEC();
  torch::zeros({1}, torch::kCUDA);  // LibTorch's primary context, current on this thread
  const void* libtorch_context = current_cuda_context();
  ASSERT_NE(libtorch_context, nullptr);
  int lowest = 0;
  int highest = 0;
  ASSERT_EQ(cudaDeviceGetStreamPriorityRange(&lowest, &highest), cudaSuccess);
  ASSERT_LT(highest, lowest) << "this GPU has one stream priority";
  // The streams an encoder's calls run on (encoders/torch_encoder.cpp).
  const int encoder_priority = c10::cuda::getStreamFromPool(false, 0).priority();
  for (const NvdecContext kind : {NvdecContext::kPrimary, NvdecContext::kOwn}) {
    SCOPED_TRACE(kind == NvdecContext::kPrimary ? "primary" : "own");
    NvdecPool pool({0}, 3, kind);
    std::set<const void*> contexts;
    std::set<const void*> streams;
    std::vector<NvdecPool::Lease> held;  // so that each turn leases another session
    for (int k = 0; k < pool.size(); ++k) {
      held.push_back(pool.try_acquire());
      ASSERT_TRUE(held.back());
      const NvdecSession& session = *held.back().session();
      contexts.insert(session.cuda_context());
      streams.insert(session.cuda_stream());
      int priority = 0;
      ASSERT_EQ(cudaStreamGetPriority(
                    static_cast<cudaStream_t>(const_cast<void*>(session.cuda_stream())), &priority),
                cudaSuccess);
      EXPECT_EQ(priority, highest);
      EXPECT_LT(priority, encoder_priority) << "not ahead of the encoders' streams";
    }
    held.clear();
    EXPECT_EQ(contexts.size(), 1U);
    EXPECT_EQ(streams.size(), 3U);
    EXPECT_EQ(contexts.count(libtorch_context), kind == NvdecContext::kPrimary ? 1U : 0U);
    EXPECT_EQ(current_cuda_context(), libtorch_context)
        << "opening the pool changed this thread's context";
  }
  // The pools are gone, the primary context is not: LibTorch computes on.
  EXPECT_EQ(current_cuda_context(), libtorch_context);
  EXPECT_EQ((torch::ones({4}, torch::kCUDA) * 2).sum().item<float>(), 8.0f);
}

// Note [Handing a file over to NVDEC] in pipeline/stages/nvdec_handover.cpp: a session is
// handed to a CPU decode only once nobody has taken it for a while.
TEST(NvdecPoolGpuTest, AnIdleSessionIsHandedOverOnlyAfterNobodyTookItForAWhile) {
  NEED_NVDEC();
  using std::chrono::milliseconds;
  NvdecPool pool({0}, 1);
  EXPECT_TRUE(pool.any_free());
  {
    const NvdecPool::Lease lease = pool.try_acquire();
    ASSERT_TRUE(lease);
    EXPECT_FALSE(pool.any_free());
    EXPECT_FALSE(pool.try_acquire_idle(milliseconds(0)));
  }
  EXPECT_TRUE(pool.any_free());
  EXPECT_FALSE(pool.try_acquire_idle(std::chrono::seconds(10)));  // just given back
  std::this_thread::sleep_for(milliseconds(60));
  const NvdecPool::Lease idle = pool.try_acquire_idle(milliseconds(50));
  EXPECT_TRUE(idle);
  EXPECT_FALSE(pool.any_free());
}

// The end of a job under video.decoder: auto, one session: a file on the session, the next on
// the CPU because the session is busy; when the session's file is done and nobody takes the
// session, the CPU's file, far from done, is started again on it. Its frames are those the
// session gives the same file on its own. Needs a clip that is slow on the CPU against NVDEC
// (PRECOMPUTE_TEST_HEAVY_CLIP, tools/gpu_tests.sh sets it to a 1080p HEVC clip of
// tools/bench/make_video_clips.sh hevc_1080p when carried).
TEST(NvdecHandoverGpuTest, ACpuFileIsHandedOverToTheSessionThatWentIdle) {
  NEED_NVDEC();
  const char* heavy = std::getenv("PRECOMPUTE_TEST_HEAVY_CLIP");
  if (heavy == nullptr || !std::filesystem::exists(heavy)) {
    GTEST_SKIP() << "PRECOMPUTE_TEST_HEAVY_CLIP is not a file";
  }
  Config config;
  config.video.enabled = true;
  config.video.fps = 1.0;
  config.video.decoder = VideoDecoderKind::kAuto;
  config.video.nvdec_sessions = 1;
  config.run.devices = {"cuda:0"};
  RunStats stats;
  const SamplePreparer preparer(config, stats);
  SampleSpec spec;
  spec.id = "heavy";
  spec.video = std::filesystem::path(heavy);

  const auto seconds_since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  auto t = std::chrono::steady_clock::now();
  const PreparedSamplePtr alone = preparer(spec);  // the session learns its pace
  const double alone_s = seconds_since(t);
  ASSERT_TRUE(alone->failures.empty()) << alone->failures.front().message;
  ASSERT_TRUE(alone->video && alone->video->nvdec);
  EXPECT_EQ(stats.video_nvdec_handovers.load(), 0);

  PreparedSamplePtr on_session;
  std::thread first([&] { on_session = preparer(spec); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the session is taken
  t = std::chrono::steady_clock::now();
  const PreparedSamplePtr handed = preparer(spec);
  const double handed_s = seconds_since(t);
  first.join();
  ASSERT_TRUE(on_session->video && on_session->video->nvdec);
  ASSERT_TRUE(handed->failures.empty()) << handed->failures.front().message;
  ASSERT_TRUE(handed->video);
  EXPECT_TRUE(handed->video->nvdec);
  EXPECT_EQ(stats.video_nvdec_handovers.load(), 1);
  EXPECT_EQ(stats.video_nvdec_clips.load(), 3);
  EXPECT_EQ(handed->video->rgb, alone->video->rgb);
  EXPECT_EQ(handed->video->timestamps, alone->video->timestamps);
  // Waiting for the session and decoding there, not the CPU's whole file.
  std::printf("NVDEC alone %.2f s; the handed-over file %.2f s\n", alone_s, handed_s);
  EXPECT_LT(handed_s, 3.0 * alone_s + 1.0);
}

}  // namespace
}  // namespace precompute
