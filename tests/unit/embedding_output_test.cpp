// embeddings_from_rows: pooling a model's rows into each sample's stored vectors, against sums
// written out by hand here (CPU). tests/gpu/gpu_test.cpp holds the same rows on a GPU to the
// CPU's results.

#include "encoders/embedding_output.hpp"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace precompute {
namespace {

// Rows [sum(counts), dim] with values that differ in every row and column.
at::Tensor numbered_rows(const std::vector<int64_t>& counts, int64_t dim) {
  const int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t{0});
  auto rows = at::empty({total, dim}, at::TensorOptions().dtype(at::kFloat));
  float* p = rows.data_ptr<float>();
  for (int64_t r = 0; r < total; ++r) {
    for (int64_t d = 0; d < dim; ++d) p[r * dim + d] = std::sin(0.37f * r + 1.3f * d) * (r + 1);
  }
  return rows;
}

float at2(const at::Tensor& rows, int64_t r, int64_t d) {
  return rows.data_ptr<float>()[r * rows.size(1) + d];
}

TEST(EmbeddingOutputTest, EveryPoolingTakesEachSamplesOwnRows) {
  const std::vector<int64_t> counts = {3, 1, 5, 2, 1, 7};
  const int64_t dim = 6;
  const auto rows = numbered_rows(counts, dim);
  const auto mean = embeddings_from_rows(rows, counts, Pooling::kMean, false);
  const auto max = embeddings_from_rows(rows, counts, Pooling::kMax, false);
  const auto cls = embeddings_from_rows(rows, counts, Pooling::kCls, false);
  const auto none = embeddings_from_rows(rows, counts, Pooling::kNone, false);
  ASSERT_EQ(mean.size(), counts.size());
  int64_t first = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    SCOPED_TRACE(i);
    for (const auto* e : {&mean[i], &max[i], &cls[i]}) {
      EXPECT_EQ(e->rows, 1);
      EXPECT_EQ(e->dim, dim);
      EXPECT_EQ(e->steps, counts[i]);
      ASSERT_EQ(e->values.size(), static_cast<size_t>(dim));
    }
    EXPECT_EQ(none[i].rows, counts[i]);
    ASSERT_EQ(none[i].values.size(), static_cast<size_t>(counts[i] * dim));
    for (int64_t d = 0; d < dim; ++d) {
      double sum = 0;
      float most = -INFINITY;
      for (int64_t r = first; r < first + counts[i]; ++r) {
        sum += at2(rows, r, d);
        most = std::max(most, at2(rows, r, d));
        EXPECT_EQ(none[i].values[(r - first) * dim + d], at2(rows, r, d));
      }
      EXPECT_NEAR(mean[i].values[d], sum / counts[i], 1e-5);
      EXPECT_EQ(max[i].values[d], most);
      EXPECT_EQ(cls[i].values[d], at2(rows, first, d));
    }
    first += counts[i];
  }
}

TEST(EmbeddingOutputTest, NormalisedVectorsHaveUnitLengthAndAZeroVectorStaysZero) {
  const std::vector<int64_t> counts = {2, 1, 3};
  auto rows = numbered_rows(counts, 4);
  rows[2].zero_();  // the second sample's only row
  const auto out = embeddings_from_rows(rows, counts, Pooling::kMean, true);
  for (size_t i = 0; i < out.size(); ++i) {
    double norm = 0;
    for (float v : out[i].values) norm += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(norm), i == 1 ? 0.0 : 1.0, 1e-6) << i;
  }
}

TEST(EmbeddingOutputTest, HalfPrecisionRowsAreStoredAsFloats) {
  const std::vector<int64_t> counts = {2, 2};
  const auto rows = numbered_rows(counts, 3);
  const auto out = embeddings_from_rows(rows.to(at::kBFloat16), counts, Pooling::kMean, false);
  const auto reference = embeddings_from_rows(rows.to(at::kBFloat16).to(at::kFloat), counts,
                                              Pooling::kMean, false);
  for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].values, reference[i].values);
}

}  // namespace
}  // namespace precompute
