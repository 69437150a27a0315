// Iteration over the elements of same-shaped strided tensors.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "orochi/engine/tensor.h"

namespace orochi::engine::cpu {

// Calls body(pointers..., count, inner_strides...) once per run of the innermost dimension, with
// byte pointers to the first element of the run in each tensor. All tensors share `shape`.
template <size_t N, typename Body>
void ForEachRow(const Shape& shape, const std::array<const Tensor*, N>& tensors, Body body) {
  int64_t rank = static_cast<int64_t>(shape.size());
  std::array<std::byte*, N> base{};
  std::array<int64_t, N> item{};
  for (size_t t = 0; t < N; ++t) {
    base[t] = static_cast<std::byte*>(const_cast<void*>(tensors[t]->data()));
    item[t] = static_cast<int64_t>(ItemSize(tensors[t]->dtype()));
  }
  if (NumElements(shape) == 0) return;
  // Same-shaped contiguous tensors are one long row: the tight loop sees all of them at once.
  bool all_contiguous = true;
  for (size_t t = 0; t < N; ++t) all_contiguous = all_contiguous && tensors[t]->is_contiguous();
  if (rank == 0 || all_contiguous) {
    if (rank > 0) {
      body(base, NumElements(shape), item);
      return;
    }
    std::array<int64_t, N> unit{};
    body(base, 1, unit);
    return;
  }
  std::array<int64_t, N> inner{};
  for (size_t t = 0; t < N; ++t) inner[t] = tensors[t]->strides()[rank - 1] * item[t];
  int64_t rows = NumElements(shape) / shape[rank - 1];
  std::vector<int64_t> index(static_cast<size_t>(rank), 0);
  std::array<std::byte*, N> row = base;
  for (int64_t r = 0; r < rows; ++r) {
    body(row, shape[rank - 1], inner);
    // Advance the multi-index over the outer dims, updating each tensor's row pointer.
    for (int64_t d = rank - 2; d >= 0; --d) {
      if (++index[d] < shape[d]) {
        for (size_t t = 0; t < N; ++t) row[t] += tensors[t]->strides()[d] * item[t];
        break;
      }
      for (size_t t = 0; t < N; ++t) row[t] -= tensors[t]->strides()[d] * item[t] * (shape[d] - 1);
      index[d] = 0;
    }
  }
}

template <typename T>
inline T& At(std::byte* row, int64_t stride_bytes, int64_t i) {
  return *reinterpret_cast<T*>(row + i * stride_bytes);
}

}  // namespace orochi::engine::cpu
