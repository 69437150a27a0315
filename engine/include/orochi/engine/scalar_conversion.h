// Floating -> integer conversion, one rule for every device: the CPU (dtype.h's Convert) and
// the CUDA kernels (compiled by nvcc, which include no other engine header) use this function.
//
// C++ leaves a float outside the integer's range undefined, and the devices differ in practice:
// x86 truncates through a 32-bit signed integer (-1.0 -> uint8 255), CUDA saturates (-> 0). The
// rule here: NaN gives 0; otherwise truncate toward zero, saturate to int64, and wrap to a
// narrower type, which is x86's (and so PyTorch's CPU) answer for every value within int32.
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
  if (value != value) return To{0};                          // NaN
  constexpr From kTwoToThe63 = From(9223372036854775808.0);  // exactly representable
  int64_t whole = INT64_MAX;
  if (value < kTwoToThe63) {
    whole = value < -kTwoToThe63 ? INT64_MIN : static_cast<int64_t>(value);
  }
  return static_cast<To>(whole);  // modular for narrower types
}

}  // namespace orochi::engine
