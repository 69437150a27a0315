// The engine's one list of ops, apart from ops.h so that code that includes no other engine
// header (the CUDA kernels, compiled by nvcc) names ops with the same enum.
#pragma once

#include <cstdint>

namespace orochi::engine {

// One list of ops. X(name, kernel signature). Adding an op: one line here, its dtypes in
// dispatch.h's kKernelDTypes and its kernel in each backend's KernelTable (the build fails until
// both are there); OpName and the kernel signatures follow from the list.
#define OROCHI_ENGINE_OPS(X)         \
  X(copy, CopyKernel)                \
  X(fill, FillKernel)                \
  X(arange, ArangeKernel)            \
  X(neg, UnaryKernel)                \
  X(abs, UnaryKernel)                \
  X(exp, UnaryKernel)                \
  X(log, UnaryKernel)                \
  X(sqrt, UnaryKernel)               \
  X(rsqrt, UnaryKernel)              \
  X(sin, UnaryKernel)                \
  X(cos, UnaryKernel)                \
  X(tanh, UnaryKernel)               \
  X(sigmoid, UnaryKernel)            \
  X(relu, UnaryKernel)               \
  X(silu, UnaryKernel)               \
  X(gelu, UnaryKernel)               \
  X(gelu_tanh, UnaryKernel)          \
  X(erf, UnaryKernel)                \
  X(floor, UnaryKernel)              \
  X(ceil, UnaryKernel)               \
  X(round, UnaryKernel)              \
  X(add, BinaryKernel)               \
  X(sub, BinaryKernel)               \
  X(mul, BinaryKernel)               \
  X(div, BinaryKernel)               \
  X(pow, BinaryKernel)               \
  X(floor_divide, BinaryKernel)      \
  X(remainder, BinaryKernel)         \
  X(maximum, BinaryKernel)           \
  X(minimum, BinaryKernel)           \
  X(eq, BinaryKernel)                \
  X(ne, BinaryKernel)                \
  X(lt, BinaryKernel)                \
  X(le, BinaryKernel)                \
  X(gt, BinaryKernel)                \
  X(ge, BinaryKernel)                \
  X(logical_and, BinaryKernel)       \
  X(logical_or, BinaryKernel)        \
  X(logical_xor, BinaryKernel)       \
  X(where, WhereKernel)              \
  X(sum, ReduceKernel)               \
  X(mean, ReduceKernel)              \
  X(amax, ReduceKernel)              \
  X(amin, ReduceKernel)              \
  X(prod, ReduceKernel)              \
  X(argmax, ReduceKernel)            \
  X(argmin, ReduceKernel)            \
  X(layer_norm, NormKernel)          \
  X(rms_norm, NormKernel)            \
  X(index_select, IndexSelectKernel) \
  X(im2col, Im2colKernel)            \
  X(conv2d, Conv2dKernel)            \
  X(sort, SortKernel)                \
  X(softmax, SoftmaxKernel)          \
  X(log_softmax, SoftmaxKernel)      \
  X(matmul, MatmulKernel)

enum class Op : uint16_t {
#define OROCHI_OP_ENUM(name, signature) name,
  OROCHI_ENGINE_OPS(OROCHI_OP_ENUM)
#undef OROCHI_OP_ENUM
};

}  // namespace orochi::engine
