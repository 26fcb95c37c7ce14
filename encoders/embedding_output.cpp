#include "encoders/embedding_output.hpp"

#include <ATen/ATen.h>

#include <cstring>
#include <limits>
#include <numeric>

#include "pipeline/core/error.hpp"

namespace precompute {

at::Tensor to_host_float(const at::Tensor& t) {
  return t.to(at::kFloat).to(at::kCPU).contiguous();
}

namespace {

at::Tensor maybe_normalize(const at::Tensor& x, bool normalize) {
  if (!normalize) return x;
  // Same epsilon as torch.nn.functional.normalize: an all-zero vector stays zero.
  return x / x.norm(2, -1, /*keepdim=*/true).clamp_min(1e-12);
}

SampleEmbedding copy_rows(const float* data, int64_t rows, int64_t dim) {
  SampleEmbedding e;
  e.rows = rows;
  e.dim = dim;
  e.values.resize(static_cast<size_t>(rows * dim));
  if (!e.values.empty()) std::memcpy(e.values.data(), data, e.values.size() * sizeof(float));
  return e;
}

}  // namespace

std::vector<SampleEmbedding> embeddings_from_rows(const at::Tensor& rows,
                                                  const std::vector<int64_t>& counts, bool mean,
                                                  bool normalize) {
  PC_ASSERT(rows.dim() == 2, "rows must be [N, D]");
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  PC_ASSERT(rows.size(0) == total, "rows ", rows.size(0), " != sum of counts ", total);
  const int64_t dim = rows.size(1);
  const auto batch = static_cast<int64_t>(counts.size());
  at::Tensor stored = rows.to(at::kFloat);
  if (mean) {
    // Segment mean on the device: row r belongs to sample segment[r].
    auto segment = at::repeat_interleave(
        at::tensor(counts, at::TensorOptions().dtype(at::kLong)).to(rows.device()));
    auto sums = at::zeros({batch, dim}, stored.options()).index_add_(0, segment, stored);
    auto sizes = at::tensor(counts, at::TensorOptions().dtype(at::kFloat))
                     .to(rows.device())
                     .clamp_min(1)
                     .unsqueeze(1);
    stored = sums / sizes;
  }
  stored = to_host_float(maybe_normalize(stored, normalize));
  const float* data = stored.data_ptr<float>();
  std::vector<SampleEmbedding> out;
  out.reserve(counts.size());
  int64_t row = 0;
  for (int64_t i = 0; i < batch; ++i) {
    const int64_t n = mean ? 1 : counts[static_cast<size_t>(i)];
    auto e = copy_rows(data + row * dim, n, dim);
    e.steps = static_cast<int32_t>(counts[static_cast<size_t>(i)]);
    out.push_back(std::move(e));
    row += n;
  }
  return out;
}

std::vector<SampleEmbedding> embeddings_from_tokens(const at::Tensor& hidden,
                                                    const at::Tensor& mask, Pooling pooling,
                                                    bool normalize) {
  PC_ASSERT(hidden.dim() == 3 && mask.dim() == 2 && hidden.size(0) == mask.size(0) &&
                hidden.size(1) == mask.size(1),
            "token output and mask shapes differ");
  const int64_t batch = hidden.size(0);
  const int64_t dim = hidden.size(2);
  const auto lengths_tensor = mask.sum(1).to(at::kCPU).to(at::kLong).contiguous();
  std::vector<int64_t> lengths(lengths_tensor.data_ptr<int64_t>(),
                               lengths_tensor.data_ptr<int64_t>() + batch);
  const auto x = hidden.to(at::kFloat);
  const auto m = mask.to(x.device()).to(at::kFloat).unsqueeze(-1);  // [B, L, 1]
  at::Tensor pooled;
  switch (pooling) {
    case Pooling::kMean:
      pooled = (x * m).sum(1) / m.sum(1).clamp_min(1e-9);
      break;
    case Pooling::kCls:
      pooled = x.select(1, 0);
      break;
    case Pooling::kMax:
      // Padding must never win the max.
      pooled = x.masked_fill(m == 0, -std::numeric_limits<float>::infinity()).amax(1);
      break;
    case Pooling::kNone: {
      // Keep the real tokens of every sample, in order: gather them into [sum(lengths), D].
      const auto keep = at::nonzero(mask.to(x.device()).reshape({-1})).squeeze(1);
      auto rows = x.reshape({-1, dim}).index_select(0, keep);
      return embeddings_from_rows(rows, lengths, /*mean=*/false, normalize);
    }
    case Pooling::kModel:
      PC_ASSERT(false, "pooling 'model' has no token output to pool");
  }
  auto host = to_host_float(maybe_normalize(pooled, normalize));
  std::vector<SampleEmbedding> out;
  out.reserve(static_cast<size_t>(batch));
  for (int64_t i = 0; i < batch; ++i) {
    auto e = copy_rows(host.data_ptr<float>() + i * dim, 1, dim);
    e.steps = static_cast<int32_t>(lengths[static_cast<size_t>(i)]);
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace precompute
