// The floating element types the cuBLAS and cuDNN stand-ins compute with: values are loaded as
// double and stored rounded to nearest in their type, as the libraries' epilogues round.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace orochi::cuda_emulator {

enum class Element { kHalf, kBFloat16, kFloat, kDouble };

inline size_t ElementSize(Element type) {
  switch (type) {
    case Element::kHalf:
    case Element::kBFloat16:
      return 2;
    case Element::kFloat:
      return 4;
    case Element::kDouble:
      return 8;
  }
  return 8;
}

inline double LoadElement(const void* data, Element type, int64_t index) {
  switch (type) {
    case Element::kHalf:
      return __half2float(static_cast<const __half*>(data)[index]);
    case Element::kBFloat16:
      return __bfloat162float(static_cast<const __nv_bfloat16*>(data)[index]);
    case Element::kFloat:
      return static_cast<const float*>(data)[index];
    case Element::kDouble:
      return static_cast<const double*>(data)[index];
  }
  return 0;
}

inline void StoreElement(void* data, Element type, int64_t index, double value) {
  switch (type) {
    case Element::kHalf:
      static_cast<__half*>(data)[index] = __float2half_rn(static_cast<float>(value));
      break;
    case Element::kBFloat16:
      static_cast<__nv_bfloat16*>(data)[index] = __float2bfloat16_rn(static_cast<float>(value));
      break;
    case Element::kFloat:
      static_cast<float*>(data)[index] = static_cast<float>(value);
      break;
    case Element::kDouble:
      static_cast<double*>(data)[index] = value;
      break;
  }
}

// TF32 keeps float32's exponent and 10 of its 23 mantissa bits (rounded to nearest).
inline double RoundToTf32(double value) {
  auto single = static_cast<float>(value);
  uint32_t bits = 0;
  std::memcpy(&bits, &single, sizeof(bits));
  if ((bits & 0x7f800000U) != 0x7f800000U) bits = (bits + 0x1000U) & ~0x1fffU;
  std::memcpy(&single, &bits, sizeof(bits));
  return single;
}

// float16 has TF32's precision but a far smaller range (65504): larger values become infinite.
inline double RoundToHalf(double value) {
  return __half2float(__float2half_rn(static_cast<float>(value)));
}

}  // namespace orochi::cuda_emulator
