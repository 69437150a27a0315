// CPU kernel for sorting rows (sort, topk).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <vector>

#include "dispatch.h"
#include "kernels.h"

namespace orochi::engine::cpu {
namespace {

// Rows are sorted as (key, position) pairs in one array, the key being the value mapped to an
// unsigned integer of the same order (of at most 32 bits for types of at most 4 bytes) (negated for
// descending) and the position breaking ties: an unstable std::sort on such pairs gives exactly the
// order of a stable sort on the values, and compares integers, not floats through a NaN test.
// (textgen's sampler sorts a 257-wide row per sequence and step: this runs about 3x faster than
// std::stable_sort did.) Every NaN is the largest value, as in PyTorch, equal to the others; -0.0
// equals 0.0. The CUDA sort orders its keys the same way (engine/cuda/index.cu).
uint64_t OrderedBits(uint64_t bits, int sign_bit) {
  const uint64_t sign = uint64_t{1} << sign_bit;
  // Negative numbers order backwards in their bits; flipping all of them fixes that, and setting
  // the sign bit of the others puts them above.
  return (bits & sign) != 0 ? ~bits & (sign | (sign - 1)) : bits | sign;
}

template <typename C>
uint64_t OrderedKey(C value) {
  if constexpr (std::is_same_v<C, float>) {
    if (std::isnan(value)) return 0xFFFFFFFFU;
    if (value == 0.0F) value = 0.0F;
    return OrderedBits(std::bit_cast<uint32_t>(value), 31);
  } else if constexpr (std::is_same_v<C, double>) {
    if (std::isnan(value)) return ~uint64_t{0};
    if (value == 0.0) value = 0.0;
    return OrderedBits(std::bit_cast<uint64_t>(value), 63);
  } else if constexpr (std::is_unsigned_v<C> || std::is_same_v<C, bool>) {
    return static_cast<uint64_t>(value);
  } else if constexpr (sizeof(C) <= 4) {  // a 32-bit key, to share a word with the position
    return static_cast<uint32_t>(static_cast<int32_t>(value)) ^ uint32_t { 1 } << 31;
  } else {
    return static_cast<uint64_t>(static_cast<int64_t>(value)) ^ (uint64_t{1} << 63);
  }
}

// Sorts each row of `in` ([outer, inner]) through (key, position) entries: a 64-bit word with a key
// of at most 32 bits above the position (`Packed`, one integer compare), or a pair.
template <bool Packed, typename T, typename C>
void SortRowsAs(const T* in, int64_t outer, int64_t inner, bool descending, T* out,
                int64_t* order) {
  using Entry = std::conditional_t<Packed, uint64_t, std::pair<uint64_t, int64_t>>;
  const uint64_t flip = descending ? (Packed ? uint64_t{0xFFFFFFFFU} : ~uint64_t{0}) : 0;
  std::vector<Entry> entries(static_cast<size_t>(inner));
  for (int64_t row = 0; row < outer; ++row) {
    const T* x = in + row * inner;
    for (int64_t i = 0; i < inner; ++i) {
      const uint64_t key = OrderedKey<C>(Convert<C>(x[i])) ^ flip;
      if constexpr (Packed) {
        entries[static_cast<size_t>(i)] = key << 32 | static_cast<uint64_t>(i);
      } else {
        entries[static_cast<size_t>(i)] = {key, i};
      }
    }
    std::sort(entries.begin(), entries.end());
    for (int64_t i = 0; i < inner; ++i) {
      int64_t position = 0;
      if constexpr (Packed) {
        position = static_cast<int64_t>(entries[static_cast<size_t>(i)] & 0xFFFFFFFFU);
      } else {
        position = entries[static_cast<size_t>(i)].second;
      }
      out[row * inner + i] = x[position];
      order[row * inner + i] = position;
    }
  }
}

}  // namespace

void SortRows(const Tensor& input, bool descending, Tensor& values, Tensor& indices) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
  VisitDType(input.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;
    const T* in = input.data_as<T>();
    T* out = values.mutable_data_as<T>();
    auto* order = indices.mutable_data_as<int64_t>();
    if (sizeof(C) <= 4 && inner <= (int64_t{1} << 32)) {
      SortRowsAs<sizeof(C) <= 4, T, C>(in, outer, inner, descending, out, order);
    } else {
      SortRowsAs<false, T, C>(in, outer, inner, descending, out, order);
    }
  });
}

}  // namespace orochi::engine::cpu
