#pragma once
// BERT's self-attention over packed short sequences on the GPU: one thread block per (sequence,
// head) holds that sequence's queries, keys and values in shared memory (Note [Attention for
// short sequences] in short_attention_kernel.cu). Plain types only: callers need no CUDA headers.

#include <cstdint>

namespace precompute {

// The longest sequence and the largest head the kernel takes; past either, flash attention runs.
constexpr int kShortAttentionMaxLength = 64;
constexpr int kShortAttentionMaxHeadDim = 128;
// The kernel's time per sequence grows with its length squared, flash attention's hardly at all
// below 128 tokens; they cost the same at about 22 tokens (Note [Attention for short sequences]
// in short_attention_kernel.cu), so a batch takes the kernel while the mean of its sequences'
// squared lengths stays below 22^2.
constexpr int64_t kShortAttentionMaxMeanSquaredLength = 484;

struct ShortAttentionParams {
  // The fused projection of T packed tokens, [T, 3, heads, head_dim] row-major (query, key,
  // value), float16 or bfloat16, 16-byte aligned.
  const void* qkv = nullptr;
  void* out = nullptr;                  // [T, heads, head_dim], same dtype
  const int32_t* cu_seqlens = nullptr;  // device memory, sequences + 1 offsets into T
  int64_t sequences = 0;
  int heads = 0;
  int head_dim = 0;      // a multiple of 8, at most kShortAttentionMaxHeadDim
  int max_length = 0;    // the longest sequence, at most kShortAttentionMaxLength
  float scale = 1.0f;    // applied to q.k before the softmax
  bool bfloat16 = true;  // false: float16
};

// Whether the kernel takes this head size (a multiple of 8, at most kShortAttentionMaxHeadDim).
constexpr bool short_attention_takes_head_dim(int64_t head_dim) {
  return head_dim > 0 && head_dim % 8 == 0 && head_dim <= kShortAttentionMaxHeadDim;
}

// Whether a packed batch of `sequences` sequences, the longest `max_length` tokens and their
// squared lengths summing to `squared_lengths`, is one the kernel runs faster than flash attention.
constexpr bool short_attention_takes_batch(int64_t max_length, int64_t sequences,
                                           int64_t squared_lengths) {
  return max_length > 0 && max_length <= kShortAttentionMaxLength &&
         squared_lengths <= kShortAttentionMaxMeanSquaredLength * sequences;
}

// Writes `out` on `stream` (a cudaStream_t). Returns the CUDA error code of the launch (0: none);
// short_attention_error_name turns it into words.
int launch_short_attention(const ShortAttentionParams& params, void* stream);
const char* short_attention_error_name(int code);

}  // namespace precompute
