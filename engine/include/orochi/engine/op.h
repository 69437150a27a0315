// Op: the engine's operations, one enumerator each, as ops.h's functions take them
// (Unary(Op::exp, x), Reduce(Op::sum, x)).
//
// Apart from ops.h so that the CUDA kernels (compiled by nvcc, which include no other engine
// header) name ops with the same enum.
#pragma once

#include <cstdint>
#include <iterator>
#include <string_view>

#include "orochi/engine/export.h"

namespace orochi::engine {

// The one list of ops: X(name, family). The family is the front-end an op goes through and the
// kernel signature its backends implement (Unary: Unary(op, x) and a UnaryKernel; Reduce:
// Reduce/ArgReduce and a ReduceKernel; ...). Adding an op: one line here, its dtypes in the
// engine's kernel registry and its kernel in each backend's kernel table (the build fails until
// both are there).
#define OROCHI_ENGINE_OPS(X)   \
  X(copy, Copy)                \
  X(fill, Fill)                \
  X(arange, Arange)            \
  X(neg, Unary)                \
  X(abs, Unary)                \
  X(exp, Unary)                \
  X(log, Unary)                \
  X(sqrt, Unary)               \
  X(rsqrt, Unary)              \
  X(sin, Unary)                \
  X(cos, Unary)                \
  X(tanh, Unary)               \
  X(sigmoid, Unary)            \
  X(relu, Unary)               \
  X(silu, Unary)               \
  X(gelu, Unary)               \
  X(gelu_tanh, Unary)          \
  X(erf, Unary)                \
  X(floor, Unary)              \
  X(ceil, Unary)               \
  X(round, Unary)              \
  X(add, Binary)               \
  X(sub, Binary)               \
  X(mul, Binary)               \
  X(div, Binary)               \
  X(pow, Binary)               \
  X(floor_divide, Binary)      \
  X(remainder, Binary)         \
  X(maximum, Binary)           \
  X(minimum, Binary)           \
  X(eq, Binary)                \
  X(ne, Binary)                \
  X(lt, Binary)                \
  X(le, Binary)                \
  X(gt, Binary)                \
  X(ge, Binary)                \
  X(logical_and, Binary)       \
  X(logical_or, Binary)        \
  X(logical_xor, Binary)       \
  X(where, Where)              \
  X(sum, Reduce)               \
  X(mean, Reduce)              \
  X(amax, Reduce)              \
  X(amin, Reduce)              \
  X(prod, Reduce)              \
  X(argmax, Reduce)            \
  X(argmin, Reduce)            \
  X(layer_norm, Norm)          \
  X(rms_norm, Norm)            \
  X(index_select, IndexSelect) \
  X(im2col, Im2col)            \
  X(conv2d, Conv2d)            \
  X(sort, Sort)                \
  X(softmax, Softmax)          \
  X(log_softmax, Softmax)      \
  X(cumsum, Softmax)           \
  X(matmul, Matmul)

enum class Op : uint16_t {
#define OROCHI_OP_ENUM(name, family) name,
  OROCHI_ENGINE_OPS(OROCHI_OP_ENUM)
#undef OROCHI_OP_ENUM
};

// Every op, in enumeration order.
inline constexpr Op kAllOps[] = {
#define OROCHI_OP_LIST(name, family) Op::name,
    OROCHI_ENGINE_OPS(OROCHI_OP_LIST)
#undef OROCHI_OP_LIST
};
inline constexpr int kOpCount = static_cast<int>(std::size(kAllOps));

// The op's name as PyTorch spells it ("gelu_tanh", "floor_divide").
OROCHI_ENGINE_API std::string_view OpName(Op op);

}  // namespace orochi::engine
