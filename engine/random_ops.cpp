// Seeded random tensors: reproducible for a seed, not PyTorch's streams.
#include <random>

#include "orochi/engine/ops.h"

namespace orochi::engine {
namespace {

template <typename Distribution>
Tensor Sample(const Shape& shape, uint64_t seed, DType dtype, Device device,
              Distribution distribution, const char* op) {
  OROCHI_CHECK_ARG(IsFloating(dtype), op << " needs a floating dtype, got " << DTypeName(dtype));
  std::mt19937_64 generator(seed);
  Tensor values = Tensor::Empty(shape, DType::kFloat64);
  auto* data = values.mutable_data_as<double>();
  for (int64_t i = 0; i < values.numel(); ++i) data[i] = distribution(generator);
  return values.To(dtype).To(device);
}

}  // namespace

Tensor Rand(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return Sample(shape, seed, dtype, device, std::uniform_real_distribution<double>(0.0, 1.0),
                "rand");
}

Tensor Randn(const Shape& shape, uint64_t seed, DType dtype, Device device) {
  return Sample(shape, seed, dtype, device, std::normal_distribution<double>(0.0, 1.0), "randn");
}

}  // namespace orochi::engine
