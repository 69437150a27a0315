// Iteration over the elements of same-shaped strided tensors.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "orochi/engine/tensor.h"
#include "thread_pool.h"

namespace orochi::engine::cpu {

// Elements per thread from which an elementwise op spreads over the pool: 2^15 float adds take
// about 5-10 us, above a helper's wake-up, so a split never costs more than it saves. (Set from
// those costs; not tuned on an idle machine: docs/PERFORMANCE.md.)
inline constexpr int64_t kElementwiseGrain = int64_t{1} << 15;

// Calls body(pointers..., count, inner_strides...) once per run of the innermost dimension, with
// byte pointers to the first element of the run in each tensor. All tensors share `shape`.
// Runs spread over the intra-op pool (thread_pool.h) from `grain` elements per thread up: `body`
// must only write its own run's elements. Same-shaped contiguous tensors are one long run, cut
// into pieces.
template <size_t N, typename Body>
void ForEachRow(const Shape& shape, const std::array<const Tensor*, N>& tensors, Body body,
                int64_t grain = kElementwiseGrain) {
  const auto rank = static_cast<int64_t>(shape.size());
  const int64_t total = NumElements(shape);
  std::array<std::byte*, N> base{};
  std::array<int64_t, N> item{};
  for (size_t t = 0; t < N; ++t) {
    base[t] = static_cast<std::byte*>(const_cast<void*>(tensors[t]->data()));
    item[t] = static_cast<int64_t>(ItemSize(tensors[t]->dtype()));
  }
  if (total == 0) return;
  bool all_contiguous = true;
  for (size_t t = 0; t < N; ++t) all_contiguous = all_contiguous && tensors[t]->is_contiguous();
  if (rank == 0) {
    std::array<int64_t, N> unit{};
    body(base, 1, unit);
    return;
  }
  if (all_contiguous) {
    ParallelFor(total, grain, [&](int64_t begin, int64_t end) {
      std::array<std::byte*, N> start = base;
      for (size_t t = 0; t < N; ++t) start[t] += begin * item[t];
      body(start, end - begin, item);
    });
    return;
  }
  std::array<int64_t, N> inner{};
  for (size_t t = 0; t < N; ++t) inner[t] = tensors[t]->strides()[rank - 1] * item[t];
  const int64_t length = shape[rank - 1];
  const int64_t rows = total / length;
  ParallelFor(rows, std::max<int64_t>(1, grain / std::max<int64_t>(length, 1)),
              [&](int64_t first, int64_t last) {
                // The multi-index of row `first` over the outer dims, and each tensor's row there.
                std::vector<int64_t> index(static_cast<size_t>(rank), 0);
                std::array<std::byte*, N> row = base;
                for (int64_t d = rank - 2, rest = first; d >= 0; --d) {
                  index[d] = rest % shape[d];
                  rest /= shape[d];
                  for (size_t t = 0; t < N; ++t) {
                    row[t] += tensors[t]->strides()[d] * item[t] * index[d];
                  }
                }
                for (int64_t r = first; r < last; ++r) {
                  body(row, length, inner);
                  // Advance the multi-index over the outer dims, updating each tensor's row
                  // pointer.
                  for (int64_t d = rank - 2; d >= 0; --d) {
                    if (++index[d] < shape[d]) {
                      for (size_t t = 0; t < N; ++t) row[t] += tensors[t]->strides()[d] * item[t];
                      break;
                    }
                    for (size_t t = 0; t < N; ++t) {
                      row[t] -= tensors[t]->strides()[d] * item[t] * (shape[d] - 1);
                    }
                    index[d] = 0;
                  }
                }
              });
}

template <typename T>
inline T& At(std::byte* row, int64_t stride_bytes, int64_t i) {
  return *reinterpret_cast<T*>(row + i * stride_bytes);
}

}  // namespace orochi::engine::cpu
