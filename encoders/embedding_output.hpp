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

// `rows` is [N, D]; sample i owns the next counts[i] rows. With `mean`, each sample's rows are
// averaged into one vector; otherwise every row is kept. Each stored vector is L2-normalised when
// `normalize`. Sets rows, dim, values and steps (= counts[i]) of each embedding.
std::vector<SampleEmbedding> embeddings_from_rows(const at::Tensor& rows,
                                                  const std::vector<int64_t>& counts, bool mean,
                                                  bool normalize);

// `hidden` is [B, L, D] token vectors and `mask` [B, L] (1 for real tokens, 0 for padding).
// Pools each sample's real tokens by `pooling` (mean, cls, max) or keeps them (none).
std::vector<SampleEmbedding> embeddings_from_tokens(const at::Tensor& hidden,
                                                    const at::Tensor& mask, Pooling pooling,
                                                    bool normalize);

// Copies a float tensor of any shape to a contiguous host float32 tensor.
at::Tensor to_host_float(const at::Tensor& t);

}  // namespace precompute
