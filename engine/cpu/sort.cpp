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
    // (key, position) pairs sorted in one array: the comparisons read adjacent memory, not the
    // row through an index (textgen's sampler sorts a 257-wide row per sequence and step). NaN
    // is the largest value, as in PyTorch: it sorts by a flag before its (unordered) key.
    struct Entry {
      bool nan;
      C key;
      int64_t position;
    };
    std::vector<Entry> entries(static_cast<size_t>(inner));
    for (int64_t row = 0; row < outer; ++row) {
      const T* x = in + row * inner;
      for (int64_t i = 0; i < inner; ++i) {
        const C key = Convert<C>(x[i]);
        bool nan = false;
        if constexpr (std::is_floating_point_v<C>) nan = std::isnan(key);
        entries[static_cast<size_t>(i)] = {nan, key, i};
      }
      auto less = [](const Entry& a, const Entry& b) {
        if (a.nan || b.nan) return !a.nan;  // a number before NaN; NaNs keep their order
        return a.key < b.key;
      };
      if (descending) {
        std::stable_sort(entries.begin(), entries.end(),
                         [&less](const Entry& a, const Entry& b) { return less(b, a); });
      } else {
        std::stable_sort(entries.begin(), entries.end(), less);
      }
      for (int64_t i = 0; i < inner; ++i) {
        const Entry& entry = entries[static_cast<size_t>(i)];
        out[row * inner + i] = x[entry.position];
        order[row * inner + i] = entry.position;
      }
    }
  });
}

}  // namespace orochi::engine::cpu
