#pragma once
// Turning a model's output tensor into per-sample embeddings on the host: pooling over a
// sample's steps happens on the model's device, so only what is stored crosses to the host.
// Internal to encoders/ (includes LibTorch). Stateless functions, safe from any thread.

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

#include "pipeline/core/config.hpp"
#include "pipeline/core/sample.hpp"

namespace precompute {

// `rows` is [N, D]; sample i owns the next counts[i] rows (its frames, windows or tokens).
// Pooling mean averages them, max takes the element-wise maximum, cls takes the first row, none
// (and model, where every sample has one row) keeps them all. Each stored vector is
// L2-normalised when `normalize`. Sets rows, dim, values and steps (= counts[i]).
std::vector<SampleEmbedding> embeddings_from_rows(const at::Tensor& rows,
                                                  const std::vector<int64_t>& counts,
                                                  Pooling pooling, bool normalize);

// `hidden` is [B, L, D] token vectors padded to L and `mask` [B, L] (1 for real tokens): the
// same as embeddings_from_rows on the real tokens.
std::vector<SampleEmbedding> embeddings_from_tokens(const at::Tensor& hidden,
                                                    const at::Tensor& mask, Pooling pooling,
                                                    bool normalize);

// Copies a float tensor of any shape to a contiguous host float32 tensor; from a GPU into
// pinned memory of LibTorch's caching host allocator (Note [Copying out through pinned memory]).
at::Tensor to_host_float(const at::Tensor& t);

}  // namespace precompute
