// CPU kernel for sorting rows (sort, topk).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "dispatch.h"
#include "kernels.h"

namespace orochi::engine::cpu {
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

}  // namespace orochi::engine::cpu
