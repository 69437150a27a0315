// Floating -> integer conversion, one rule for every device: the CPU (dtype.h's Convert) and
// the CUDA kernels (compiled by nvcc, which include no other engine header) use this function.
//
// C++ leaves a float outside the integer's range undefined, and the devices differ in practice:
// x86 converts through a signed integer of 32 bits (64 for int64) and gives its smallest value
// for NaN and anything out of its range, then keeps the low bits (-1.0 -> uint8 255); CUDA
// saturates (-> 0). The rule here is x86's, so that both devices give PyTorch's CPU answers.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define OROCHI_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define OROCHI_HOST_DEVICE inline
#endif

namespace orochi::engine {

template <typename To, typename From>
OROCHI_HOST_DEVICE To FloatingToInteger(From value) {
  // (Comparisons with NaN are false, so NaN takes the out-of-range answer.)
  if constexpr (sizeof(To) == 8) {
    constexpr From kLimit = From(9223372036854775808.0);  // 2^63
    const bool in_range = value >= -kLimit && value < kLimit;
    return static_cast<To>(in_range ? static_cast<int64_t>(value) : INT64_MIN);
  } else {
    constexpr From kLimit = From(2147483648.0);  // 2^31
    const bool in_range = value >= -kLimit && value < kLimit;
    return static_cast<To>(in_range ? static_cast<int32_t>(value) : INT32_MIN);  // low bits
  }
}

}  // namespace orochi::engine
