// Scalar rules that the CPU kernels and the CUDA kernels (compiled by nvcc) share, so that both
// devices give the same answer by construction.
#pragma once

#include <math.h>  // fmod, floor, copysign and their float forms: on the host and in device code

#include <type_traits>

#include "orochi/engine/op.h"
#include "orochi/engine/scalar_conversion.h"  // OROCHI_HOST_DEVICE

namespace orochi::engine {

// A comparison or logical op of two values of the compute type (nonzero is true).
template <typename C>
OROCHI_HOST_DEVICE bool ApplyComparison(Op op, C a, C b) {
  switch (op) {
    case Op::logical_and:
      return a != C{0} && b != C{0};
    case Op::logical_or:
      return a != C{0} || b != C{0};
    case Op::logical_xor:
      return (a != C{0}) != (b != C{0});
    case Op::eq:
      return a == b;
    case Op::ne:
      return a != b;
    case Op::lt:
      return a < b;
    case Op::le:
      return a <= b;
    case Op::gt:
      return a > b;
    case Op::ge:
      return a >= b;
    default:
      return false;
  }
}

namespace scalar_math {
OROCHI_HOST_DEVICE float Fmod(float a, float b) { return fmodf(a, b); }
OROCHI_HOST_DEVICE double Fmod(double a, double b) { return fmod(a, b); }
OROCHI_HOST_DEVICE float Floor(float x) { return floorf(x); }
OROCHI_HOST_DEVICE double Floor(double x) { return floor(x); }
OROCHI_HOST_DEVICE float CopySign(float x, float sign) { return copysignf(x, sign); }
OROCHI_HOST_DEVICE double CopySign(double x, double sign) { return copysign(x, sign); }
}  // namespace scalar_math

// a ** b for an integer compute type. A negative exponent gives 0, except for the bases 1 and -1
// (PyTorch's integer pow); the products wrap as unsigned ones do, never overflowing.
template <typename C>
OROCHI_HOST_DEVICE C IntegerPower(C a, C b) {
  static_assert(std::is_integral_v<C> && !std::is_same_v<C, bool>);
  if constexpr (std::is_signed_v<C>) {
    if (b < C{0}) {
      if (a == C{1}) return C{1};
      if (a == C{-1}) return (b & C{1}) != C{0} ? C{-1} : C{1};
      return C{0};
    }
  }
  using Unsigned = std::make_unsigned_t<C>;
  Unsigned result = 1;
  for (auto base = static_cast<Unsigned>(a), exponent = static_cast<Unsigned>(b); exponent > 0U;
       exponent >>= 1U, base = static_cast<Unsigned>(base * base)) {
    if ((exponent & 1U) != 0U) result = static_cast<Unsigned>(result * base);
  }
  return static_cast<C>(result);
}

// a // b, rounding the quotient toward negative infinity like Python and PyTorch's
// floor_divide. Floating: computed from fmod, so that 1.0 // 0.1 is 9 (floor(1.0 / 0.1) is 10);
// division by zero gives a / b. Integer: a zero divisor gives 0 (the front end refuses it
// first), and INT_MIN // -1 wraps instead of overflowing.
template <typename C>
OROCHI_HOST_DEVICE C FloorDivide(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    if (b == C{0}) return a / b;
    const C remainder = scalar_math::Fmod(a, b);
    C quotient = (a - remainder) / b;
    if (remainder != C{0} && (b < C{0}) != (remainder < C{0})) quotient -= C{1};
    if (quotient == C{0}) return scalar_math::CopySign(C{0}, a / b);
    C floored = scalar_math::Floor(quotient);
    if (quotient - floored > C{0.5}) floored += C{1};
    return floored;
  } else {
    if (b == C{0}) return C{0};
    if constexpr (std::is_signed_v<C>) {
      using Unsigned = std::make_unsigned_t<C>;
      if (b == C{-1}) return static_cast<C>(Unsigned{0} - static_cast<Unsigned>(a));
      const C quotient = static_cast<C>(a / b);
      const bool inexact = static_cast<C>(a % b) != C{0};
      return inexact && ((a < C{0}) != (b < C{0})) ? static_cast<C>(quotient - C{1}) : quotient;
    }
    return static_cast<C>(a / b);
  }
}

// a % b with the sign of b (or zero), like Python and PyTorch's remainder. Floating: from fmod,
// so it is exact; a zero divisor gives NaN. Integer: a zero divisor gives 0 (the front end
// refuses it first), and INT_MIN % -1 is 0 instead of overflowing.
template <typename C>
OROCHI_HOST_DEVICE C Remainder(C a, C b) {
  if constexpr (std::is_floating_point_v<C>) {
    C remainder = scalar_math::Fmod(a, b);
    if (remainder != C{0} && (remainder < C{0}) != (b < C{0})) remainder += b;
    return remainder;
  } else {
    if (b == C{0}) return C{0};
    if constexpr (std::is_signed_v<C>) {
      if (b == C{-1}) return C{0};
      const auto remainder = static_cast<C>(a % b);
      return remainder != C{0} && ((remainder < C{0}) != (b < C{0})) ? static_cast<C>(remainder + b)
                                                                     : remainder;
    }
    return static_cast<C>(a % b);
  }
}

}  // namespace orochi::engine
