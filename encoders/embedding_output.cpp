#include "encoders/embedding_output.hpp"

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>
#include <numeric>

#include "pipeline/core/error.hpp"

namespace precompute {

// Note [Copying out through pinned memory]
// A batch's stored vectors cross to the host once per call: 12.6 MB for 4,096 pooled captions of
// 768 floats. A fresh pageable tensor each call is a fresh mapping above the mmap threshold
// (Note [Host memory and glibc malloc] in tools/cli/main.cpp), first-touched page by page, and the
// driver stages a pageable copy through its own pinned buffer. Pinned memory from LibTorch's
// caching host allocator is a block kept from call to call, which the copy engine writes
// directly. The small uploads (each sample's row count) go the same way, without a wait: the
// only synchronisation of a call is the final copy's, so the host queues the pooling kernels
// behind the model's.
at::Tensor to_host_float(const at::Tensor& t) {
  const auto floats = t.to(at::kFloat).contiguous();
  if (!floats.is_cuda()) return floats;
  auto host = at::empty(floats.sizes(),
                        at::TensorOptions().dtype(at::kFloat).pinned_memory(true));
  host.copy_(floats);
  return host;
}

namespace {

// `values` on `device`: from pinned memory without waiting when it is a GPU.
at::Tensor to_device(const std::vector<int64_t>& values, const at::Device& device) {
  const auto n = static_cast<int64_t>(values.size());
  if (!device.is_cuda()) return at::tensor(values, at::TensorOptions().dtype(at::kLong));
  auto host = at::empty({n}, at::TensorOptions().dtype(at::kLong).pinned_memory(true));
  std::copy(values.begin(), values.end(), host.data_ptr<int64_t>());
  return host.to(device, /*non_blocking=*/true);
}

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
  if (pooling == Pooling::kCls) {
    std::vector<int64_t> starts(counts.size(), 0);
    std::exclusive_scan(counts.begin(), counts.end(), starts.begin(), int64_t{0});
    return rows.index_select(0, to_device(starts, rows.device()));
  }
  // Row r belongs to sample segment[r]. Giving the output's size spares repeat_interleave a
  // wait for the device to count it.
  const auto counts_on_device = to_device(counts, rows.device());
  const auto segment =
      at::repeat_interleave(counts_on_device, std::optional<int64_t>(rows.size(0)));
  if (pooling == Pooling::kMax) {
    return at::zeros({batch, dim}, rows.options())
        .scatter_reduce_(0, segment.unsqueeze(1).expand({rows.size(0), dim}), rows, "amax",
                         /*include_self=*/false);
  }
  const auto sums = at::zeros({batch, dim}, rows.options()).index_add_(0, segment, rows);
  const auto sizes = counts_on_device.to(at::kFloat).clamp_min(1).unsqueeze(1);
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
