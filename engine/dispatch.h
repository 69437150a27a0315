// Kernel registry: one kernel per (op, device type), taking the op's dtypes (kKernelDTypes).
//
// Private to the engine, its device libraries and its tests (not installed): users call ops.h.
// Its functions are exported all the same, for liborochi_engine_cuda.so, which registers into
// the registry of the engine library that loads it.
//
// Thread-safety: the registry is filled once, on first use, before any lookup can see it;
// lookups are then read-only and safe from any thread.
//
// Kernels receive tensors already prepared by the op front-end (ops.cpp): broadcast, converted
// to the compute dtype, and outputs allocated. A kernel switches on dtype inside (VisitDType).
#pragma once

#include <cstdint>
#include <initializer_list>
#include <iterator>
#include <string>
#include <typeinfo>
#include <vector>

#include "orochi/engine/export.h"
#include "orochi/engine/ops.h"
#include "orochi/engine/tensor.h"

namespace orochi::engine {

// `destination` has `source`'s shape; converts between dtypes.
using CopyKernel = void (*)(const Tensor& source, Tensor& destination);
using FillKernel = void (*)(Tensor& output, double value);
using ArangeKernel = void (*)(Tensor& output, double start, double step);
// `output` is contiguous with `input`'s shape and dtype.
using UnaryKernel = void (*)(Op op, const Tensor& input, Tensor& output);
// `a` and `b` have the output's shape (broadcast views) and the compute dtype; `output` is
// contiguous, of the compute dtype or bool for comparisons.
using BinaryKernel = void (*)(Op op, const Tensor& a, const Tensor& b, Tensor& output);
// `input` is contiguous [outer, inner]; `output` is contiguous [outer]; reduces over inner.
using ReduceKernel = void (*)(Op op, const Tensor& input, Tensor& output);
// `input` and `output` are contiguous [outer, inner]; normalises over inner.
using SoftmaxKernel = void (*)(Op op, const Tensor& input, Tensor& output);
// `condition` (bool), `a` and `b` have the output's shape (broadcast views); a, b and `output`
// share one dtype; `output` is contiguous.
using WhereKernel = void (*)(const Tensor& condition, const Tensor& a, const Tensor& b,
                             Tensor& output);
// layer_norm / rms_norm of contiguous [outer, inner] over inner; weight and bias are contiguous
// [inner] of the input's dtype, or null.
using NormKernel = void (*)(Op op, const Tensor& input, const Tensor* weight, const Tensor* bias,
                            double eps, Tensor& output);
// Contiguous input [outer, size, inner], int64 index [n] (checked in range) -> contiguous
// [outer, n, inner]. The CPU kernel also takes a strided input [outer, size, rest...] of any rank
// >= 2 (output [outer, n, rest...]) and reads only the picked slices through its strides.
using IndexSelectKernel = void (*)(const Tensor& input, const Tensor& index, Tensor& output);
// Unfolds contiguous input [N, C, H, W] into contiguous output [N, C, kh, kw, oh, ow]; positions
// in the padding read `pad_value`.
struct Im2colGeometry {
  int64_t kernel[2];
  int64_t stride[2];
  int64_t padding[2];
  int64_t dilation[2];
  double pad_value;
};
using Im2colKernel = void (*)(const Tensor& input, const Im2colGeometry& geometry, Tensor& output);
// Convolves (cross-correlates, as PyTorch) contiguous input [N, C, H, W] with contiguous weight
// [O, C/groups, kh, kw] into contiguous output [N, O, oh, ow], all of one dtype; no bias. The
// geometry is checked and the output sized by the front-end.
struct ConvGeometry {
  int64_t stride[2];
  int64_t padding[2];
  int64_t dilation[2];
  int64_t groups;
};
using Conv2dKernel = void (*)(const Tensor& input, const Tensor& weight,
                              const ConvGeometry& geometry, Tensor& output);
// Sorts each row of contiguous [outer, inner] input (stable) into values and int64 indices.
using SortKernel = void (*)(const Tensor& input, bool descending, Tensor& values, Tensor& indices);
// [batch, m, k] x [batch, k, n] -> contiguous [batch, m, n], one dtype. The matrices of each
// operand are row-major (column stride 1, row stride >= columns) or column-major (row stride 1,
// column stride >= rows), at any batch stride (0: one matrix for every batch): transposed and
// broadcast operands are read where they are, as BLAS reads them.
using MatmulKernel = void (*)(const Tensor& a, const Tensor& b, Tensor& output);

template <Op O>
struct OpSignature;
#define OROCHI_OP_SIGNATURE(name, family) \
  template <>                             \
  struct OpSignature<Op::name> {          \
    using type = family##Kernel;          \
  };
OROCHI_ENGINE_OPS(OROCHI_OP_SIGNATURE)
#undef OROCHI_OP_SIGNATURE

using DTypeSet = uint32_t;
constexpr DTypeSet DTypes(std::initializer_list<DType> dtypes) {
  DTypeSet set = 0;
  for (DType dtype : dtypes) set |= 1U << static_cast<unsigned>(dtype);
  return set;
}
inline constexpr DTypeSet kAllDTypes = (1U << kDTypeCount) - 1;
inline constexpr DTypeSet kFloatingDTypes =
    DTypes({DType::kFloat16, DType::kBFloat16, DType::kFloat32, DType::kFloat64});
inline constexpr DTypeSet kNumericDTypes = kAllDTypes & ~DTypes({DType::kBool});

// The dtypes each op's kernels take, on every device: the one declaration every backend's
// kernels are registered with, so that a model that runs on one device runs on the others.
// Listed in op.h's order (checked below).
struct OpDTypes {
  Op op;
  DTypeSet dtypes;
};
inline constexpr OpDTypes kKernelDTypes[] = {
    {Op::copy, kAllDTypes},
    {Op::fill, kAllDTypes},
    {Op::arange, kNumericDTypes},
    // neg, abs, relu and the rounding ops keep integral dtypes; the others are floating only
    // (the front-end computes integral inputs in float32).
    {Op::neg, kNumericDTypes},
    {Op::abs, kNumericDTypes},
    {Op::exp, kFloatingDTypes},
    {Op::log, kFloatingDTypes},
    {Op::sqrt, kFloatingDTypes},
    {Op::rsqrt, kFloatingDTypes},
    {Op::sin, kFloatingDTypes},
    {Op::cos, kFloatingDTypes},
    {Op::tanh, kFloatingDTypes},
    {Op::sigmoid, kFloatingDTypes},
    {Op::relu, kNumericDTypes},
    {Op::silu, kFloatingDTypes},
    {Op::gelu, kFloatingDTypes},
    {Op::gelu_tanh, kFloatingDTypes},
    {Op::erf, kFloatingDTypes},
    {Op::floor, kNumericDTypes},
    {Op::ceil, kNumericDTypes},
    {Op::round, kNumericDTypes},
    {Op::add, kAllDTypes},
    // Binary refuses bool operands of sub, as PyTorch does; remainder has no bool kernel there.
    {Op::sub, kNumericDTypes},
    {Op::mul, kAllDTypes},
    {Op::div, kAllDTypes},
    {Op::pow, kAllDTypes},
    {Op::floor_divide, kAllDTypes},
    {Op::remainder, kNumericDTypes},
    {Op::maximum, kAllDTypes},
    {Op::minimum, kAllDTypes},
    {Op::eq, kAllDTypes},
    {Op::ne, kAllDTypes},
    {Op::lt, kAllDTypes},
    {Op::le, kAllDTypes},
    {Op::gt, kAllDTypes},
    {Op::ge, kAllDTypes},
    {Op::logical_and, kAllDTypes},
    {Op::logical_or, kAllDTypes},
    {Op::logical_xor, kAllDTypes},
    {Op::where, kAllDTypes},
    {Op::sum, kAllDTypes},
    {Op::mean, kFloatingDTypes},
    {Op::amax, kAllDTypes},
    {Op::amin, kAllDTypes},
    {Op::prod, kAllDTypes},
    {Op::argmax, kAllDTypes},
    {Op::argmin, kAllDTypes},
    {Op::layer_norm, kFloatingDTypes},
    {Op::rms_norm, kFloatingDTypes},
    {Op::index_select, kAllDTypes},
    {Op::im2col, kNumericDTypes},
    {Op::conv2d, kNumericDTypes},
    {Op::sort, kNumericDTypes},
    {Op::softmax, kFloatingDTypes},
    {Op::log_softmax, kFloatingDTypes},
    {Op::cumsum, kFloatingDTypes | DTypes({DType::kInt64})},
    {Op::matmul, kAllDTypes},
};

constexpr bool ListsEveryOpInOrder(const OpDTypes (&table)[kOpCount]) {
  for (int i = 0; i < kOpCount; ++i) {
    if (table[i].op != kAllOps[i]) return false;
  }
  return true;
}
static_assert(std::size(kKernelDTypes) == kOpCount && ListsEveryOpInOrder(kKernelDTypes),
              "kKernelDTypes lists every op of op.h once, in its order");

constexpr DTypeSet KernelDTypes(Op op) { return kKernelDTypes[static_cast<int>(op)].dtypes; }

// One device's kernels: a field per op, of the op's kernel signature. A backend fills one as a
// constexpr table and asserts it complete (static_assert(HasEveryKernel(table))), so that an op
// added to op.h fails the build of every backend without a kernel for it.
struct KernelTable {
#define OROCHI_KERNEL_TABLE_FIELD(name, family) family##Kernel name = nullptr;
  OROCHI_ENGINE_OPS(OROCHI_KERNEL_TABLE_FIELD)
#undef OROCHI_KERNEL_TABLE_FIELD
};

namespace kernel_table_check {
// Declared, never defined: HasEveryKernel calls the one of an op without a kernel, which no
// constant expression may, so the compiler's error names the op (no_kernel_for_<op>).
#define OROCHI_KERNEL_TABLE_MISSING(name, family) void no_kernel_for_##name();
OROCHI_ENGINE_OPS(OROCHI_KERNEL_TABLE_MISSING)
#undef OROCHI_KERNEL_TABLE_MISSING
}  // namespace kernel_table_check

consteval bool HasEveryKernel(const KernelTable& table) {
#define OROCHI_KERNEL_TABLE_CHECK(name, family) \
  if (table.name == nullptr) kernel_table_check::no_kernel_for_##name();
  OROCHI_ENGINE_OPS(OROCHI_KERNEL_TABLE_CHECK)
#undef OROCHI_KERNEL_TABLE_CHECK
  return true;
}

class OROCHI_ENGINE_API KernelRegistry {
 public:
  // Registers every kernel of `table` for `device`, each for its op's KernelDTypes.
  void Register(DeviceType device, const KernelTable& table);

  // The kernel of `op` for `device` and `dtype`, or an Error naming all three.
  template <Op O>
  typename OpSignature<O>::type Find(Device device, DType dtype) const {
    return reinterpret_cast<typename OpSignature<O>::type>(FindErased(O, device, dtype));
  }
  void* FindErased(Op op, Device device, DType dtype) const;

  // For front-ends that pick the op at run time: the kernel of `op`, whose signature must be
  // `Kernel` (an internal invariant, asserted).
  template <typename Kernel>
  Kernel FindAs(Op op, Device device, DType dtype) const {
    CheckSignature(op, typeid(Kernel));
    return reinterpret_cast<Kernel>(FindErased(op, device, dtype));
  }

  // "op on device" for every op with no kernel registered for `device`.
  std::vector<std::string> Missing(DeviceType device) const;

 private:
  static void CheckSignature(Op op, const std::type_info& kernel_type);

  struct Entry {
    void* kernel = nullptr;
    DTypeSet dtypes = 0;
  };
  Entry entries_[kOpCount][kDeviceTypeCount];
};

// A conv2d kernel built from the im2col and matmul kernels of the tensors' device: the CPU's
// convolution, and a device's for the dtypes and shapes its convolution library does not take.
OROCHI_ENGINE_API void Conv2dThroughIm2col(const Tensor& input, const Tensor& weight,
                                           const ConvGeometry& geometry, Tensor& output);

// The process's registry, with every compiled-in device's kernels registered on first use.
OROCHI_ENGINE_API const KernelRegistry& Kernels();

}  // namespace orochi::engine
