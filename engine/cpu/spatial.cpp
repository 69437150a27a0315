// CPU kernels for unfolding images (convolution, pooling) and for sorting rows.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "orochi/engine/dispatch.h"

namespace orochi::engine::cpu {
namespace {

void Im2col(const Tensor& input, const Im2colGeometry& g, Tensor& output) {
  const int64_t batch = input.shape()[0];
  const int64_t channels = input.shape()[1];
  const int64_t height = input.shape()[2];
  const int64_t width = input.shape()[3];
  const int64_t out_h = output.shape()[4];
  const int64_t out_w = output.shape()[5];
  VisitDType(input.dtype(), [&]<typename T>() {
    const T* in = input.data_as<T>();
    T* out = output.mutable_data_as<T>();
    const T pad = Convert<T>(g.pad_value);
    for (int64_t plane = 0; plane < batch * channels; ++plane) {
      const T* image = in + plane * height * width;
      for (int64_t ky = 0; ky < g.kernel[0]; ++ky) {
        for (int64_t kx = 0; kx < g.kernel[1]; ++kx) {
          for (int64_t oy = 0; oy < out_h; ++oy) {
            const int64_t y = oy * g.stride[0] - g.padding[0] + ky * g.dilation[0];
            for (int64_t ox = 0; ox < out_w; ++ox) {
              const int64_t x = ox * g.stride[1] - g.padding[1] + kx * g.dilation[1];
              *out++ = y >= 0 && y < height && x >= 0 && x < width ? image[y * width + x] : pad;
            }
          }
        }
      }
    }
  });
}

void SortRows(const Tensor& input, bool descending, Tensor& values, Tensor& indices) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
  VisitDType(input.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
    const T* in = input.data_as<T>();
    T* out = values.mutable_data_as<T>();
    auto* order = indices.mutable_data_as<int64_t>();
    std::vector<int64_t> positions(static_cast<size_t>(inner));
    for (int64_t row = 0; row < outer; ++row) {
      const T* x = in + row * inner;
      std::iota(positions.begin(), positions.end(), 0);
      // NaN is the largest value, as in PyTorch.
      auto less = [x](int64_t a, int64_t b) {
        C u = Convert<C>(x[a]);
        C v = Convert<C>(x[b]);
        if constexpr (std::is_floating_point_v<C>) {
          if (std::isnan(u)) return false;
          if (std::isnan(v)) return true;
        }
        return u < v;
      };
      if (descending) {
        std::stable_sort(positions.begin(), positions.end(),
                         [&less](int64_t a, int64_t b) { return less(b, a); });
      } else {
        std::stable_sort(positions.begin(), positions.end(), less);
      }
      for (int64_t i = 0; i < inner; ++i) {
        out[row * inner + i] = x[positions[static_cast<size_t>(i)]];
        order[row * inner + i] = positions[static_cast<size_t>(i)];
      }
    }
  });
}

}  // namespace

void RegisterSpatialKernels(KernelRegistry& registry) {
  registry.Register<Op::im2col>(DeviceType::kCpu, Im2col, kNumericDTypes);
  registry.Register<Op::sort>(DeviceType::kCpu, SortRows, kNumericDTypes);
}

}  // namespace orochi::engine::cpu
