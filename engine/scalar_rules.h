// Scalar rules that the CPU kernels and the CUDA kernels (compiled by nvcc) share, so that both
// devices give the same answer by construction.
#pragma once

#include "orochi/engine/op_list.h"
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

}  // namespace orochi::engine
