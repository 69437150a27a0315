// The engine's operations, with PyTorch's names and semantics.
//
// Every op works on any device for which a kernel is registered (see dispatch.h) and throws
// Error (kInvalidArgument) for bad arguments, naming the op, device and dtype when a kernel is
// missing. Ops never modify their inputs; results are new contiguous tensors unless documented
// as views. All functions are thread-safe.
#pragma once

#include <cstdint>
#include <iterator>
#include <optional>
#include <string_view>
#include <vector>

#include "orochi/engine/export.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

// One list of ops. X(name, kernel signature). Adding an op: one line here, one kernel file
// registration per device; OpName and the registry's completeness check follow from the list.
#define OROCHI_ENGINE_OPS(X)    \
  X(copy, CopyKernel)           \
  X(fill, FillKernel)           \
  X(arange, ArangeKernel)       \
  X(neg, UnaryKernel)           \
  X(abs, UnaryKernel)           \
  X(exp, UnaryKernel)           \
  X(log, UnaryKernel)           \
  X(sqrt, UnaryKernel)          \
  X(rsqrt, UnaryKernel)         \
  X(sin, UnaryKernel)           \
  X(cos, UnaryKernel)           \
  X(tanh, UnaryKernel)          \
  X(sigmoid, UnaryKernel)       \
  X(relu, UnaryKernel)          \
  X(silu, UnaryKernel)          \
  X(gelu, UnaryKernel)          \
  X(gelu_tanh, UnaryKernel)     \
  X(erf, UnaryKernel)           \
  X(floor, UnaryKernel)         \
  X(ceil, UnaryKernel)          \
  X(round, UnaryKernel)         \
  X(add, BinaryKernel)          \
  X(sub, BinaryKernel)          \
  X(mul, BinaryKernel)          \
  X(div, BinaryKernel)          \
  X(pow, BinaryKernel)          \
  X(maximum, BinaryKernel)      \
  X(minimum, BinaryKernel)      \
  X(eq, BinaryKernel)           \
  X(ne, BinaryKernel)           \
  X(lt, BinaryKernel)           \
  X(le, BinaryKernel)           \
  X(gt, BinaryKernel)           \
  X(ge, BinaryKernel)           \
  X(sum, ReduceKernel)          \
  X(mean, ReduceKernel)         \
  X(amax, ReduceKernel)         \
  X(amin, ReduceKernel)         \
  X(softmax, SoftmaxKernel)     \
  X(log_softmax, SoftmaxKernel) \
  X(matmul, MatmulKernel)

enum class Op : uint16_t {
#define OROCHI_OP_ENUM(name, signature) name,
  OROCHI_ENGINE_OPS(OROCHI_OP_ENUM)
#undef OROCHI_OP_ENUM
};
// Every op, in enumeration order.
inline constexpr Op kAllOps[] = {
#define OROCHI_OP_LIST(name, signature) Op::name,
    OROCHI_ENGINE_OPS(OROCHI_OP_LIST)
#undef OROCHI_OP_LIST
};
inline constexpr int kOpCount = static_cast<int>(std::size(kAllOps));

OROCHI_ENGINE_API std::string_view OpName(Op op);

// --- creation ----------------------------------------------------------------------------------
OROCHI_ENGINE_API Tensor Zeros(const Shape& shape, DType dtype = DType::kFloat32);
OROCHI_ENGINE_API Tensor Ones(const Shape& shape, DType dtype = DType::kFloat32);
OROCHI_ENGINE_API Tensor Full(const Shape& shape, double value, DType dtype = DType::kFloat32);
// [start, end) in steps of `step`, like torch.arange.
OROCHI_ENGINE_API Tensor Arange(double start, double end, double step = 1,
                                DType dtype = DType::kInt64);
// A 0-dim tensor holding `value`.
OROCHI_ENGINE_API Tensor Scalar(double value, DType dtype);

// --- elementwise -------------------------------------------------------------------------------
// Unary ops keep a floating dtype and compute integral inputs in float32 (exp, log, ...), except
// neg, abs, relu, floor, ceil and round, which keep integral dtypes.
OROCHI_ENGINE_API Tensor Unary(Op op, const Tensor& input);
// Binary ops broadcast and promote as PyTorch does (comparisons return bool; div of integers
// returns float32, true division).
OROCHI_ENGINE_API Tensor Binary(Op op, const Tensor& a, const Tensor& b);
// The dtype Binary(op, a, b) computes in: torch.result_type rules, where 0-dim tensors do not
// raise the category's width of dimensioned ones.
OROCHI_ENGINE_API DType ResultType(const Tensor& a, const Tensor& b);
OROCHI_ENGINE_API Shape BroadcastShapes(const Shape& a, const Shape& b);

// --- reductions --------------------------------------------------------------------------------
// Over `dims` (all dims when empty). sum of bool/integral gives int64; mean needs floating input.
OROCHI_ENGINE_API Tensor Reduce(Op op, const Tensor& input, const std::vector<int64_t>& dims = {},
                                bool keepdim = false);
OROCHI_ENGINE_API Tensor Softmax(const Tensor& input, int64_t dim);
OROCHI_ENGINE_API Tensor LogSoftmax(const Tensor& input, int64_t dim);

// --- linear algebra ----------------------------------------------------------------------------
// torch.matmul: 1-D and 2-D operands, and batched operands with broadcast batch dims.
OROCHI_ENGINE_API Tensor Matmul(const Tensor& a, const Tensor& b);

// --- threads -----------------------------------------------------------------------------------
// Intra-op threads for CPU kernels (OpenBLAS included). 1 by default: interpreter copies give
// the parallelism. Thread-safe; takes effect for calls that start afterwards.
OROCHI_ENGINE_API void SetIntraOpThreads(int threads);
OROCHI_ENGINE_API int IntraOpThreads();
// OpenBLAS's kernel name for this CPU, e.g. "Haswell", "SkylakeX", "Zen".
OROCHI_ENGINE_API std::string_view BlasCoreName();

}  // namespace orochi::engine
