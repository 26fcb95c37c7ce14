#include "encoders/embedding_output.hpp"

#include <ATen/ATen.h>

#include <cstring>
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

// One pooled vector per sample, [B, D], on the rows' device.
at::Tensor pool_segments(const at::Tensor& rows, const std::vector<int64_t>& counts,
                         Pooling pooling) {
  const auto batch = static_cast<int64_t>(counts.size());
  const int64_t dim = rows.size(1);
  const auto long_options = at::TensorOptions().dtype(at::kLong);
  if (pooling == Pooling::kCls) {
    std::vector<int64_t> starts(counts.size(), 0);
    std::exclusive_scan(counts.begin(), counts.end(), starts.begin(), int64_t{0});
    return rows.index_select(0, at::tensor(starts, long_options).to(rows.device()));
  }
  // Row r belongs to sample segment[r].
  const auto segment =
      at::repeat_interleave(at::tensor(counts, long_options).to(rows.device()));
  if (pooling == Pooling::kMax) {
    return at::zeros({batch, dim}, rows.options())
        .scatter_reduce_(0, segment.unsqueeze(1).expand({rows.size(0), dim}), rows, "amax",
                         /*include_self=*/false);
  }
  const auto sums = at::zeros({batch, dim}, rows.options()).index_add_(0, segment, rows);
  const auto sizes = at::tensor(counts, at::TensorOptions().dtype(at::kFloat))
                         .to(rows.device())
                         .clamp_min(1)
                         .unsqueeze(1);
  return sums / sizes;
}

}  // namespace

std::vector<SampleEmbedding> embeddings_from_rows(const at::Tensor& rows,
                                                  const std::vector<int64_t>& counts,
                                                  Pooling pooling, bool normalize) {
  PC_ASSERT(rows.dim() == 2, "rows must be [N, D]");
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  PC_ASSERT(rows.size(0) == total, "rows ", rows.size(0), " != sum of counts ", total);
  const bool pooled = pooling == Pooling::kMean || pooling == Pooling::kMax ||
                      pooling == Pooling::kCls;
  at::Tensor stored = rows.to(at::kFloat);
  if (pooled) stored = pool_segments(stored, counts, pooling);
  stored = to_host_float(maybe_normalize(stored, normalize));

  const int64_t dim = rows.size(1);
  const float* data = stored.data_ptr<float>();
  std::vector<SampleEmbedding> out(counts.size());
  int64_t row = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    auto& e = out[i];
    e.rows = pooled ? 1 : counts[i];
    e.dim = dim;
    e.values.assign(data + row * dim, data + (row + e.rows) * dim);
    e.steps = static_cast<int32_t>(counts[i]);
    row += e.rows;
  }
  return out;
}

std::vector<SampleEmbedding> embeddings_from_tokens(const at::Tensor& hidden,
                                                    const at::Tensor& mask, Pooling pooling,
                                                    bool normalize) {
  PC_ASSERT(hidden.dim() == 3 && mask.dim() == 2 && hidden.size(0) == mask.size(0) &&
                hidden.size(1) == mask.size(1),
            "token output and mask shapes differ");
  const auto lengths = mask.sum(1).to(at::kCPU).to(at::kLong).contiguous();
  const std::vector<int64_t> counts(lengths.data_ptr<int64_t>(),
                                    lengths.data_ptr<int64_t>() + lengths.numel());
  // The real tokens of every sample, in order: [sum(counts), D].
  const auto keep = at::nonzero(mask.to(hidden.device()).reshape({-1})).squeeze(1);
  const auto rows = hidden.reshape({-1, hidden.size(2)}).index_select(0, keep);
  return embeddings_from_rows(rows, counts, pooling, normalize);
}

}  // namespace precompute
