// Helpers for engine tests: random tensors and element access by multi-index with broadcasting.
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "orochi/engine/ops.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

// A float64 tensor of `shape` with uniform values in [low, high), converted to `dtype`.
inline Tensor RandomTensor(const Shape& shape, DType dtype, double low = -2, double high = 2,
                           unsigned seed = 7) {
  std::mt19937 generator(seed);
  std::uniform_real_distribution<double> distribution(low, high);
  Tensor values = Tensor::Empty(shape, DType::kFloat64);
  auto* data = values.mutable_data_as<double>();
  for (int64_t i = 0; i < values.numel(); ++i) {
    double value = distribution(generator);
    data[i] = IsFloating(dtype) ? value : std::round(value);
  }
  return values.To(dtype);
}

// A tensor of `shape` holding `values` in row-major order, converted to `dtype`: for inputs and
// reference values written out in a test.
inline Tensor TensorOf(const Shape& shape, const std::vector<double>& values,
                       DType dtype = DType::kFloat64) {
  Tensor wide = Tensor::Empty(shape, DType::kFloat64);
  EXPECT_EQ(wide.numel(), static_cast<int64_t>(values.size())) << "values for the shape";
  const int64_t count = std::min(wide.numel(), static_cast<int64_t>(values.size()));
  std::copy_n(values.begin(), count, wide.mutable_data_as<double>());
  return wide.To(dtype);
}

// The element of `tensor` at `index` (an index into `broadcast_shape`, right-aligned, with
// size-1 dims of the tensor broadcast).
inline double ElementAt(const Tensor& tensor, const std::vector<int64_t>& index) {
  int64_t flat = 0;
  size_t offset = index.size() - static_cast<size_t>(tensor.dim());
  for (int64_t d = 0; d < tensor.dim(); ++d) {
    int64_t i = tensor.shape()[d] == 1 ? 0 : index[offset + d];
    flat = flat * tensor.shape()[d] + i;
  }
  return tensor.ItemAsDouble(flat);
}

inline std::vector<double> Values(const Tensor& tensor) {
  std::vector<double> values;
  for (int64_t i = 0; i < tensor.numel(); ++i) values.push_back(tensor.ItemAsDouble(i));
  return values;
}

inline std::vector<int64_t> UnflattenIndex(int64_t flat, const Shape& shape) {
  std::vector<int64_t> index(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    index[d] = flat % shape[d];
    flat /= shape[d];
  }
  return index;
}

inline double Tolerance(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return 4e-3;
    case DType::kBFloat16:
      return 3e-2;
    case DType::kFloat32:
      return 2e-6;
    case DType::kFloat64:
      return 1e-12;
    default:
      return 0;
  }
}

// Compares a result against reference values with a relative-and-absolute tolerance.
inline void ExpectNear(const Tensor& actual, const std::vector<double>& expected, double tolerance,
                       const std::string& what) {
  ASSERT_EQ(actual.numel(), static_cast<int64_t>(expected.size())) << what;
  for (int64_t i = 0; i < actual.numel(); ++i) {
    double value = actual.ItemAsDouble(i);
    double want = expected[static_cast<size_t>(i)];
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(value)) << what << " element " << i;
      continue;
    }
    if (std::isinf(want)) {
      EXPECT_EQ(value, want) << what << " element " << i;
      continue;
    }
    EXPECT_NEAR(value, want, tolerance * (1 + std::abs(want))) << what << " element " << i;
  }
}

}  // namespace orochi::engine
