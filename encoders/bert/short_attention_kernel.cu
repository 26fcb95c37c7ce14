#include "encoders/bert/short_attention_kernel.hpp"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

// Note [Attention for short sequences]
// Captions are short: the benchmark's are 3 to 40 tokens, 13.6 on average. The variable-length
// flash-attention kernel works in tiles of 128 queries per sequence and head, so a 14-token
// sequence leaves nine tenths of each tile empty, and its fixed cost per tile (loading the tile,
// setting up the pipeline) is paid 4,096 x 12 times a batch. On a batch of captions attention
// took as long as every matmul of BERT-base's forward together, although it reads and writes
// only 4 x [T, 768] values a layer (docs/benchmarks.md, "Attention for short captions").
//
// So for batches of short sequences (at most kShortAttentionMaxLength tokens each) one block of
// 4 warps takes one (sequence, head): it copies that head's L queries, keys and values (16-byte
// loads) into shared memory, and each warp takes one query row at a time: lane j scores key j (and
// j + 32), the warp reduces the softmax's max and sum with shuffles, and each lane accumulates two
// (or four) output dimensions over the L keys. Scores, softmax and sums are float32, as in flash
// attention; the probabilities stay float32 for the product with V (flash rounds them to 16 bits
// first). Keys sit one 4-byte word apart per row beyond their length, so lanes reading the same
// column of different keys hit different banks. The work is O(L^2 d) on CUDA cores, not tensor
// cores, while flash attention costs about the same per sequence at any length up to its tile.
// The two cost the same at about 22 tokens (tools/bench/attention_bench; docs/benchmarks.md,
// "Attention for short captions"), so a batch takes this kernel only while the mean of its
// squared lengths is below 22^2 (kShortAttentionMaxMeanSquaredLength).

namespace precompute {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeysPerLane = kShortAttentionMaxLength / 32;
constexpr int kPairsPerLane = kShortAttentionMaxHeadDim / 64;
static_assert(kKeysPerLane == 2, "the weights' shuffle below picks between two registers");
static_assert(kShortAttentionMaxHeadDim % 64 == 0, "each lane owns whole pairs of dimensions");

template <typename T>
struct Pairs;
template <>
struct Pairs<__half> {
  using type = __half2;
  static __device__ float2 widen(__half2 v) { return __half22float2(v); }
  static __device__ __half2 narrow(float2 v) { return __float22half2_rn(v); }
};
template <>
struct Pairs<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ float2 widen(__nv_bfloat162 v) { return __bfloat1622float2(v); }
  static __device__ __nv_bfloat162 narrow(float2 v) { return __float22bfloat162_rn(v); }
};

__device__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

__device__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Shared memory per block, in 4-byte words: queries and values [L][d/2], keys [L][d/2 + 1].
__host__ __device__ int shared_words(int length, int head_dim) {
  const int pairs = head_dim / 2;
  return length * (3 * pairs + 1);
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    short_attention(const T* __restrict__ qkv, T* __restrict__ out,
                    const int32_t* __restrict__ cu_seqlens, int heads, int head_dim, float scale) {
  using P = Pairs<T>;
  using T2 = typename P::type;
  const int sequence = static_cast<int>(blockIdx.x);
  const int head = static_cast<int>(blockIdx.y);
  const int start = cu_seqlens[sequence];
  const int length = cu_seqlens[sequence + 1] - start;
  if (length <= 0 || length > kShortAttentionMaxLength) return;  // the host checks the batch

  const int pairs = head_dim / 2;
  const int key_stride = pairs + 1;
  extern __shared__ uint4 shared[];
  T2* queries = reinterpret_cast<T2*>(shared);
  T2* values = queries + length * pairs;  // 16-byte aligned: pairs is a multiple of 4
  T2* keys = values + length * pairs;
  const int64_t hidden = static_cast<int64_t>(heads) * head_dim;

  // Copy this head's rows in 16-byte chunks (8 values): q, k and v of token t start at
  // qkv + t * 3 * hidden + {0, 1, 2} * hidden + head * head_dim.
  const int chunks_per_row = head_dim / 8;
  const int chunks_per_part = length * chunks_per_row;
#pragma unroll 4
  for (int c = static_cast<int>(threadIdx.x); c < 3 * chunks_per_part; c += kThreads) {
    const int part = c / chunks_per_part;
    const int within = c - part * chunks_per_part;
    const int row = within / chunks_per_row;
    const int chunk = within - row * chunks_per_row;
    const T* source = qkv + (static_cast<int64_t>(start) + row) * 3 * hidden + part * hidden +
                      static_cast<int64_t>(head) * head_dim + chunk * 8;
    const uint4 v = *reinterpret_cast<const uint4*>(source);
    if (part == 0) {
      reinterpret_cast<uint4*>(queries + row * pairs)[chunk] = v;
    } else if (part == 2) {
      reinterpret_cast<uint4*>(values + row * pairs)[chunk] = v;
    } else {
      uint32_t* k = reinterpret_cast<uint32_t*>(keys + row * key_stride + chunk * 4);
      k[0] = v.x;
      k[1] = v.y;
      k[2] = v.z;
      k[3] = v.w;
    }
  }
  __syncthreads();

  const int warp = static_cast<int>(threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x) % 32;
  for (int i = warp; i < length; i += kWarps) {
    const T2* q = queries + i * pairs;
    float score[kKeysPerLane];
    float top = -INFINITY;
#pragma unroll
    for (int r = 0; r < kKeysPerLane; ++r) {
      const int j = lane + 32 * r;
      score[r] = -INFINITY;
      if (j < length) {
        const T2* k = keys + j * key_stride;
        float dot = 0.0f;
        for (int p = 0; p < pairs; ++p) {
          const float2 a = P::widen(q[p]);
          const float2 b = P::widen(k[p]);
          dot = fmaf(a.x, b.x, dot);
          dot = fmaf(a.y, b.y, dot);
        }
        score[r] = dot * scale;
        top = fmaxf(top, score[r]);
      }
    }
    top = warp_max(top);
    float total = 0.0f;
#pragma unroll
    for (int r = 0; r < kKeysPerLane; ++r) {
      score[r] = lane + 32 * r < length ? __expf(score[r] - top) : 0.0f;
      total += score[r];
    }
    const float inverse = 1.0f / warp_sum(total);

    float2 acc[kPairsPerLane];
#pragma unroll
    for (int c = 0; c < kPairsPerLane; ++c) acc[c] = make_float2(0.0f, 0.0f);
    for (int j = 0; j < length; ++j) {
      // j is the same in every lane, so the register picked is too.
      const float weight = __shfl_sync(0xffffffffu, j < 32 ? score[0] : score[1], j % 32);
#pragma unroll
      for (int c = 0; c < kPairsPerLane; ++c) {
        const int p = lane + 32 * c;
        if (p < pairs) {
          const float2 v = P::widen(values[j * pairs + p]);
          acc[c].x = fmaf(weight, v.x, acc[c].x);
          acc[c].y = fmaf(weight, v.y, acc[c].y);
        }
      }
    }
    T2* row_out = reinterpret_cast<T2*>(out + (static_cast<int64_t>(start) + i) * hidden +
                                        static_cast<int64_t>(head) * head_dim);
#pragma unroll
    for (int c = 0; c < kPairsPerLane; ++c) {
      const int p = lane + 32 * c;
      if (p < pairs) row_out[p] = P::narrow(make_float2(acc[c].x * inverse, acc[c].y * inverse));
    }
  }
}

template <typename T>
cudaError_t launch(const ShortAttentionParams& params, cudaStream_t stream) {
  const size_t bytes =
      sizeof(uint32_t) * static_cast<size_t>(shared_words(params.max_length, params.head_dim));
  if (bytes > 48 * 1024) {
    // Above the default 48 KiB a kernel must ask for its dynamic shared memory (d = 128 and
    // more than 62 tokens).
    const cudaError_t e = cudaFuncSetAttribute(
        short_attention<T>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (e != cudaSuccess) return e;
  }
  const dim3 grid(static_cast<unsigned>(params.sequences), static_cast<unsigned>(params.heads));
  short_attention<T><<<grid, kThreads, bytes, stream>>>(
      static_cast<const T*>(params.qkv), static_cast<T*>(params.out), params.cu_seqlens,
      params.heads, params.head_dim, params.scale);
  return cudaGetLastError();
}

}  // namespace

int launch_short_attention(const ShortAttentionParams& params, void* stream) {
  if (params.sequences <= 0) return cudaSuccess;
  // Refused here as well as by the caller: past these the kernel would read out of bounds.
  if (params.sequences > INT32_MAX || params.heads <= 0 || params.heads > 65535 ||
      !short_attention_takes_head_dim(params.head_dim) || params.max_length <= 0 ||
      params.max_length > kShortAttentionMaxLength ||
      reinterpret_cast<uintptr_t>(params.qkv) % 16 != 0) {
    return cudaErrorInvalidValue;
  }
  const auto s = static_cast<cudaStream_t>(stream);
  return params.bfloat16 ? launch<__nv_bfloat16>(params, s) : launch<__half>(params, s);
}

const char* short_attention_error_name(int code) {
  return cudaGetErrorString(static_cast<cudaError_t>(code));
}

}  // namespace precompute
