// attention_bench: BERT's attention alone on one GPU, flash attention against the short-sequence
// kernel (Note [Attention for short sequences] in encoders/bert/short_attention_kernel.cu), on
// packed batches of about --tokens tokens: every sequence L tokens long for each L of the sweep,
// one batch of lengths drawn from 3..24 and one like the text benchmark's captions (13.6 tokens
// on average).
//
//   attention_bench [--tokens N] [--heads H] [--head-dim D] [--dtype bfloat16|float16]
//                   [--iters I]
//
// One JSON line per batch: milliseconds per call of each (median of I calls, CUDA events) and
// the largest difference between their outputs, and whether BertModel would take the kernel for
// it (kShortAttentionMaxMeanSquaredLength, which these figures set).

#include <ATen/ATen.h>
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "encoders/bert/short_attention_kernel.hpp"
#include "tools/bench/bench_args.hpp"

namespace {

struct Args {
  int64_t tokens = 55000;
  int heads = 12;
  int head_dim = 64;
  at::ScalarType dtype = at::kBFloat16;
  int iters = 50;
};

[[noreturn]] void usage(const std::string& why) {
  std::fprintf(stderr,
               "attention_bench: %s\nusage: attention_bench [--tokens N] [--heads H] "
               "[--head-dim D] [--dtype bfloat16|float16] [--iters I]\n",
               why.c_str());
  std::exit(2);
}

Args parse(int argc, char** argv) {
  Args a;
  for (precompute::BenchArgs args(argc, argv, usage); args.next();) {
    if (args.is("--tokens")) {
      a.tokens = args.number<int64_t>();
    } else if (args.is("--heads")) {
      a.heads = args.number<int>();
    } else if (args.is("--head-dim")) {
      a.head_dim = args.number<int>();
    } else if (args.is("--dtype")) {
      const std::string d = args.text();
      if (d != "bfloat16" && d != "float16") usage("--dtype is bfloat16 or float16");
      a.dtype = d == "bfloat16" ? at::kBFloat16 : at::kHalf;
    } else if (args.is("--iters")) {
      a.iters = args.number<int>();
    } else {
      usage("unknown argument " + args.arg());
    }
  }
  if (a.tokens < 64 || a.tokens > 100'000'000) usage("--tokens is 64 .. 100000000");
  if (a.heads < 1 || a.heads > 256) usage("--heads is 1 .. 256");
  if (!precompute::short_attention_takes_head_dim(a.head_dim)) {
    usage("--head-dim is a multiple of 8 up to " +
          std::to_string(precompute::kShortAttentionMaxHeadDim));
  }
  if (a.iters < 1 || a.iters > 100000) usage("--iters is 1 .. 100000");
  // The float32 queries, keys and values it draws: at most 8 GiB.
  if (a.tokens * 3 * a.heads * a.head_dim > (int64_t{1} << 31)) {
    usage("--tokens x 3 x --heads x --head-dim is at most 2^31 values");
  }
  return a;
}

double median_ms(const std::function<void()>& call, int iters) {
  for (int i = 0; i < 3; ++i) call();
  std::vector<double> ms;
  for (int i = 0; i < iters; ++i) {
    at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
    start.record();
    call();
    end.record();
    end.synchronize();
    ms.push_back(start.elapsed_time(end));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

void run_batch(const Args& a, const std::string& name, const std::vector<int>& lengths) {
  const c10::Device cuda("cuda:0");
  std::vector<int32_t> offsets = {0};
  for (const int n : lengths) offsets.push_back(offsets.back() + n);
  const int64_t t = offsets.back();
  const int max_length = *std::max_element(lengths.begin(), lengths.end());
  int64_t squares = 0;
  for (const int n : lengths) squares += int64_t{n} * n;
  const auto sequences = static_cast<int64_t>(lengths.size());
  const auto cu = at::tensor(offsets, at::kInt).to(cuda);
  const auto qkv =
      at::randn({t, 3, a.heads, a.head_dim}, at::TensorOptions().device(cuda)).to(a.dtype);
  const auto parts = qkv.unbind(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(a.head_dim));
  at::Tensor flash_out;
  const auto flash = [&] {
    flash_out = std::get<0>(at::_flash_attention_forward(
        parts[0], parts[1], parts[2], cu, cu, max_length, max_length, 0.0, false, false, scale));
  };
  auto short_out = at::empty({t, a.heads * a.head_dim}, qkv.options());
  precompute::ShortAttentionParams p;
  p.qkv = qkv.data_ptr();
  p.out = short_out.data_ptr();
  p.cu_seqlens = cu.data_ptr<int32_t>();
  p.sequences = static_cast<int64_t>(lengths.size());
  p.heads = a.heads;
  p.head_dim = a.head_dim;
  p.max_length = max_length;
  p.scale = static_cast<float>(scale);
  p.bfloat16 = a.dtype == at::kBFloat16;
  const auto stream = c10::cuda::getCurrentCUDAStream().stream();
  const auto kernel = [&] {
    const int e = precompute::launch_short_attention(p, stream);
    if (e != 0) {
      std::fprintf(stderr, "attention_bench: %s\n", precompute::short_attention_error_name(e));
      std::exit(1);
    }
  };
  const double flash_ms = median_ms(flash, a.iters);
  const double short_ms = median_ms(kernel, a.iters);
  const double diff = (flash_out.reshape({t, -1}).to(at::kFloat) - short_out.to(at::kFloat))
                          .abs()
                          .max()
                          .item<double>();
  const bool model_takes = precompute::short_attention_takes_batch(max_length, sequences, squares);
  const double mean_square = static_cast<double>(squares) / static_cast<double>(sequences);
  std::printf(
      "{\"batch\": \"%s\", \"sequences\": %zu, \"tokens\": %lld, \"max_length\": %d, "
      "\"mean_squared_length\": %.0f, \"model_takes_short\": %s, \"flash_ms\": %.4f, "
      "\"short_ms\": %.4f, \"flash_over_short\": %.2f, \"max_abs_diff\": %.5f}\n",
      name.c_str(), lengths.size(), static_cast<long long>(t), max_length, mean_square,
      model_takes ? "true" : "false", flash_ms, short_ms, flash_ms / short_ms, diff);
  std::fflush(stdout);
}

void run_all(const Args& a) {
  c10::InferenceMode guard;
  at::manual_seed(0);
  for (const int length : {4, 8, 16, 24, 32, 40, 48, 56, 64}) {
    run_batch(
        a, "L=" + std::to_string(length),
        std::vector<int>(static_cast<size_t>(std::max<int64_t>(1, a.tokens / length)), length));
  }
  std::mt19937 rng(1);
  std::uniform_int_distribution<int> length(3, 24);
  std::vector<int> mixed;
  for (int64_t total = 0; total < a.tokens;) total += mixed.emplace_back(length(rng));
  run_batch(a, "3..24", mixed);
  // text_throughput.py's short captions: N(12, 5) words (at least 3), one token each, plus
  // [CLS] and [SEP].
  std::normal_distribution<double> words(12.0, 5.0);
  std::vector<int> captions;
  for (int64_t total = 0; total < a.tokens;) {
    total += captions.emplace_back(std::max(3, static_cast<int>(words(rng))) + 2);
  }
  run_batch(a, "captions", captions);
}

}  // namespace

int main(int argc, char** argv) {
  const Args a = parse(argc, argv);
  if (!torch::cuda::is_available()) {
    std::fprintf(stderr, "attention_bench: no CUDA device\n");
    return 1;
  }
  try {
    run_all(a);
  } catch (const c10::Error& e) {
    // Out of device memory, mostly: --tokens too large for this GPU.
    std::fprintf(stderr, "attention_bench: %s\n", e.what_without_backtrace());
    return 1;
  }
  return 0;
}
