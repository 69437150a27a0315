// What the .cu files share: element types, conversions that match the CPU's, strided offsets,
// launch sizes and group reductions.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels.h"
#include "orochi/engine/scalar_conversion.h"

// kernel<<<grid, block, 0, stream>>>(args...), spelled so that the tests' host emulator of a CUDA
// device (tests/engine/cuda_emulator/simt.h) can compile the kernels with the host compiler and
// launch them itself.
#ifndef OROCHI_LAUNCH
#define OROCHI_LAUNCH(kernel, grid, block, stream, ...) \
  kernel<<<(grid), (block), 0, (stream)>>>(__VA_ARGS__)
#endif

namespace orochi::engine::cuda {

// Calls `body` with `T` bound to the element type of `type` (a macro rather than a generic lambda,
// which keeps nvcc's front end on plain C++17).
#define OROCHI_CUDA_DISPATCH(type, T, ...) \
  switch (type) {                          \
    case ScalarType::kBool: {              \
      using T = bool;                      \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kUInt8: {             \
      using T = uint8_t;                   \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kInt8: {              \
      using T = int8_t;                    \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kInt16: {             \
      using T = int16_t;                   \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kInt32: {             \
      using T = int32_t;                   \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kInt64: {             \
      using T = int64_t;                   \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kFloat16: {           \
      using T = __half;                    \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kBFloat16: {          \
      using T = __nv_bfloat16;             \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kFloat32: {           \
      using T = float;                     \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    case ScalarType::kFloat64: {           \
      using T = double;                    \
      __VA_ARGS__;                         \
      break;                               \
    }                                      \
    default:                               \
      return cudaErrorInvalidValue;        \
  }

// Calls `body` with `T` an unsigned integer of `item_size` bytes (for kernels that only move
// bytes).
#define OROCHI_CUDA_DISPATCH_SIZE(item_size, T, ...) \
  switch (item_size) {                               \
    case 1: {                                        \
      using T = uint8_t;                             \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    case 2: {                                        \
      using T = uint16_t;                            \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    case 4: {                                        \
      using T = uint32_t;                            \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    case 8: {                                        \
      using T = uint64_t;                            \
      __VA_ARGS__;                                   \
      break;                                         \
    }                                                \
    default:                                         \
      return cudaErrorInvalidValue;                  \
  }

inline constexpr int ItemSizeOf(ScalarType type) {
  switch (type) {
    case ScalarType::kBool:
    case ScalarType::kUInt8:
    case ScalarType::kInt8:
      return 1;
    case ScalarType::kInt16:
    case ScalarType::kFloat16:
    case ScalarType::kBFloat16:
      return 2;
    case ScalarType::kInt32:
    case ScalarType::kFloat32:
      return 4;
    default:
      return 8;
  }
}

template <typename T>
inline constexpr bool kIsHalfType = std::is_same_v<T, __half> || std::is_same_v<T, __nv_bfloat16>;
template <typename T>
inline constexpr bool kIsFloating = kIsHalfType<T> || std::is_floating_point_v<T>;

// The type arithmetic happens in, as on the CPU: float for the 16-bit floats, int for bool,
// the type itself otherwise.
template <typename T>
using Compute =
    std::conditional_t<kIsHalfType<T>, float, std::conditional_t<std::is_same_v<T, bool>, int, T>>;

// --- conversions, with the CPU's (C++) semantics -------------------------------------------------
// Half types go through float; floating -> integer follows FloatingToInteger (the CPU's rule);
// anything -> bool is "!= 0".
template <typename To, typename From>
__device__ __forceinline__ To Cast(From value) {
  if constexpr (std::is_same_v<From, __half>) {
    return Cast<To>(__half2float(value));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return Cast<To>(__bfloat162float(value));
  } else if constexpr (std::is_same_v<To, __half>) {
    return __float2half_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    return __float2bfloat16_rn(static_cast<float>(value));
  } else if constexpr (std::is_same_v<To, bool>) {
    return value != From{0};
  } else if constexpr (std::is_floating_point_v<From> && std::is_integral_v<To>) {
    return FloatingToInteger<To>(value);
  } else {
    return static_cast<To>(value);
  }
}

template <typename T>
__device__ __forceinline__ bool IsNan(T value) {
  if constexpr (std::is_floating_point_v<T>) {
    return value != value;
  } else {
    return false;
  }
}

// --- strided offsets -----------------------------------------------------------------------------

// Offsets of element `linear` (in the layout's row-major order) in each of the first N operands.
template <int N, typename Index>
__device__ __forceinline__ void Offsets(const Layout& layout, Index linear, int64_t (&offsets)[N]) {
  for (int k = 0; k < N; ++k) offsets[k] = 0;
  if (layout.dims == 1) {  // contiguous or one strided dim: no division
    for (int k = 0; k < N; ++k) offsets[k] = static_cast<int64_t>(linear) * layout.strides[k][0];
    return;
  }
  for (int d = layout.dims - 1; d >= 0; --d) {
    const auto size = static_cast<Index>(layout.sizes[d]);
    const Index quotient = linear / size;
    const auto index = static_cast<int64_t>(linear - quotient * size);
    linear = quotient;
    for (int k = 0; k < N; ++k) offsets[k] += index * layout.strides[k][d];
  }
}

// Runs body(i, offsets) for every element with a grid-stride loop, in 32-bit index arithmetic
// when the count allows it (64-bit division costs several times more).
template <int N, typename Body>
__device__ __forceinline__ void ForEachElement(const Layout& layout, int64_t count, Body body) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t offsets[N];
  if (count <= INT32_MAX) {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
      Offsets<N, uint32_t>(layout, static_cast<uint32_t>(i), offsets);
      body(i, offsets);
    }
  } else {
    for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
         i += stride) {
      Offsets<N, uint64_t>(layout, static_cast<uint64_t>(i), offsets);
      body(i, offsets);
    }
  }
}

inline constexpr int kBlockSize = 256;

// Blocks for a grid-stride loop over `count` items: enough to fill the GPU, never above the
// grid limit.
inline unsigned GridFor(int64_t count, int block = kBlockSize) {
  const int64_t blocks = (count + block - 1) / block;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

// --- group reductions ----------------------------------------------------------------------------
// Row kernels give each row a group of `group` consecutive threads: a power of two up to 32 (a
// part of a warp, reduced with shuffles), or the whole block (reduced through shared memory).
// Every thread of the block must call these the same number of times.

template <typename V>
__device__ __forceinline__ V ShuffleXor(V value, int mask, int width) {
  return __shfl_xor_sync(0xffffffffU, value, mask, width);
}

// Combines `value` across the group; every thread of the group gets the result. `shared` holds
// one V per warp (block groups only).
template <typename V, typename Combine>
__device__ __forceinline__ V GroupAllReduce(V value, int group, V* shared, Combine combine) {
  const int width = group < 32 ? group : 32;
  for (int mask = width / 2; mask > 0; mask /= 2) {
    value = combine(value, ShuffleXor(value, mask, width));
  }
  if (group <= 32) return value;
  const int warp = threadIdx.x / 32;
  const int warps = blockDim.x / 32;
  __syncthreads();  // earlier readers of `shared` are done
  if (threadIdx.x % 32 == 0) shared[warp] = value;
  __syncthreads();
  value = shared[0];
  for (int w = 1; w < warps; ++w) value = combine(value, shared[w]);
  return value;
}

// float and double math under one name each, so that templates over the compute type call the
// right CUDA function.
__device__ __forceinline__ float Fabs(float x) { return fabsf(x); }
__device__ __forceinline__ double Fabs(double x) { return fabs(x); }
__device__ __forceinline__ float Exp(float x) { return expf(x); }
__device__ __forceinline__ double Exp(double x) { return exp(x); }
__device__ __forceinline__ float Log(float x) { return logf(x); }
__device__ __forceinline__ double Log(double x) { return log(x); }
__device__ __forceinline__ float Sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double Sqrt(double x) { return sqrt(x); }
__device__ __forceinline__ float Sin(float x) { return sinf(x); }
__device__ __forceinline__ double Sin(double x) { return sin(x); }
__device__ __forceinline__ float Cos(float x) { return cosf(x); }
__device__ __forceinline__ double Cos(double x) { return cos(x); }
__device__ __forceinline__ float Tanh(float x) { return tanhf(x); }
__device__ __forceinline__ double Tanh(double x) { return tanh(x); }
__device__ __forceinline__ float Erf(float x) { return erff(x); }
__device__ __forceinline__ double Erf(double x) { return erf(x); }
__device__ __forceinline__ float Erfc(float x) { return erfcf(x); }
__device__ __forceinline__ double Erfc(double x) { return erfc(x); }
__device__ __forceinline__ float Floor(float x) { return floorf(x); }
__device__ __forceinline__ double Floor(double x) { return floor(x); }
__device__ __forceinline__ float Ceil(float x) { return ceilf(x); }
__device__ __forceinline__ double Ceil(double x) { return ceil(x); }
__device__ __forceinline__ float Rint(float x) { return rintf(x); }  // half to even
__device__ __forceinline__ double Rint(double x) { return rint(x); }
__device__ __forceinline__ float Pow(float x, float y) { return powf(x, y); }
__device__ __forceinline__ double Pow(double x, double y) { return pow(x, y); }

// Threads per row for rows of `inner` elements, and the block size to go with it.
struct RowGroups {
  int group;
  int block;
};
// Rows of up to 2048 items get a warp each (reduced with shuffles alone); a block of 512 threads
// per row of 1024 spent more on its two barriers than on its two items per thread (layer_norm
// over 8192 x 1024 ran at a quarter of PyTorch's rate on an H200).
inline RowGroups GroupsFor(int64_t inner) {
  if (inner > 2048) return {512, 512};
  int group = 1;
  while (group < 32 && group < inner) group *= 2;
  return {group, kBlockSize};
}

// Rows per launch step for a row kernel with `groups`: grid-stride over rows, block-uniform.
inline unsigned RowGrid(int64_t outer, const RowGroups& groups) {
  const int64_t rows_per_block = groups.block / groups.group;
  const int64_t blocks = (outer + rows_per_block - 1) / rows_per_block;
  return static_cast<unsigned>(blocks < 65535 * 8 ? blocks : 65535 * 8);
}

}  // namespace orochi::engine::cuda
