// The CUDA kernels' launchers: plain parameters in, a cudaError_t of the launch out.
//
// This header is shared by nvcc (the .cu files that define the launchers) and the host compiler
// (kernels.cpp, which turns engine Tensors into these parameters and checks the errors), so it
// includes no engine header but the op list: the .cu files stay small and quick to compile. Every
// launcher queues its work on `stream` and returns at once; none launches anything for zero
// elements.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "orochi/engine/op.h"

namespace orochi::engine::cuda {

// The engine's dtypes, in DType's order (kernels.cpp asserts that it matches).
enum class ScalarType : int {
  kBool,
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kFloat16,
  kBFloat16,
  kFloat32,
  kFloat64,
};

// Same-shaped strided operands (broadcasting is expressed by stride 0), with dims already merged
// where every operand allows it. Strides count elements. Operand 0 is the output.
inline constexpr int kMaxLayoutDims = 10;
inline constexpr int kMaxOperands = 4;
struct Layout {
  int dims = 0;
  int64_t sizes[kMaxLayoutDims] = {};
  int64_t strides[kMaxOperands][kMaxLayoutDims] = {};
};

// copy: `out` and `in` follow `layout` (operands 0 and 1).
cudaError_t LaunchCopy(void* out, ScalarType out_type, const void* in, ScalarType in_type,
                       const Layout& layout, int64_t count, cudaStream_t stream);
// fill: `count` contiguous items of `item_size` bytes, each the low bytes of `pattern`.
cudaError_t LaunchFill(void* out, int item_size, uint64_t pattern, int64_t count,
                       cudaStream_t stream);
// arange: out[i] = start + i * step, computed in double and converted as the CPU does.
cudaError_t LaunchArange(void* out, ScalarType type, double start, double step, int64_t count,
                         cudaStream_t stream);
// Unary: contiguous `out`, `in` per layout operand 1; both of `type`.
cudaError_t LaunchUnary(Op op, ScalarType type, void* out, const void* in, const Layout& layout,
                        int64_t count, cudaStream_t stream);
// Binary: `a` and `b` (layout operands 1 and 2) of `type`; contiguous `out` of `type`, or bool
// for comparisons.
cudaError_t LaunchBinary(Op op, ScalarType type, void* out, const void* a, const void* b,
                         const Layout& layout, int64_t count, cudaStream_t stream);
// where: out = condition ? a : b (operands 1, 2, 3), items of `item_size` bytes.
cudaError_t LaunchWhere(int item_size, void* out, const bool* condition, const void* a,
                        const void* b, const Layout& layout, int64_t count, cudaStream_t stream);

// Reduces each row of contiguous [outer, inner] `in`; `out` [outer] is of `out_type`, which is
// `in_type` or int64 (sums and products of integers, arg reductions). Few long rows are split
// across blocks through `scratch`, device memory of ReduceScratchBytes(outer, inner) bytes (null
// when that is 0).
int64_t ReduceScratchBytes(int64_t outer, int64_t inner);
cudaError_t LaunchReduce(Op op, ScalarType in_type, const void* in, ScalarType out_type, void* out,
                         int64_t outer, int64_t inner, void* scratch, cudaStream_t stream);
// softmax / log_softmax of each row of contiguous [outer, inner], floating types.
cudaError_t LaunchSoftmax(bool log, ScalarType type, const void* in, void* out, int64_t outer,
                          int64_t inner, cudaStream_t stream);
// Running sums along each row of contiguous [outer, inner]: floating types and int64.
cudaError_t LaunchCumsum(ScalarType type, const void* in, void* out, int64_t outer, int64_t inner,
                         cudaStream_t stream);
// layer_norm (rms = false) / rms_norm of each row; weight and bias [inner] or null.
cudaError_t LaunchNorm(bool rms, ScalarType type, const void* in, const void* weight,
                       const void* bias, double eps, void* out, int64_t outer, int64_t inner,
                       cudaStream_t stream);

// [outer, size, inner] -> [outer, count, inner] picking index[0..count) along the middle dim.
cudaError_t LaunchIndexSelect(int item_size, const void* in, const int64_t* index, void* out,
                              int64_t outer, int64_t size, int64_t inner, int64_t count,
                              cudaStream_t stream);

struct Im2colParams {
  int64_t planes;  // N * C
  int64_t height, width;
  int64_t kernel[2], stride[2], padding[2], dilation[2];
  int64_t out_height, out_width;
  uint64_t pad_pattern;  // the pad value's bytes in the element type
};
cudaError_t LaunchIm2col(int item_size, const void* in, void* out, const Im2colParams& params,
                         cudaStream_t stream);

// Sorting rows of contiguous [outer, inner], stably, NaN as the largest value. Keys are the
// values mapped to uint64 so that their order is the sort order (descending inverts them);
// `keys` and `positions` are scratch of [outer, padded], padded a power of two >= inner.
cudaError_t LaunchSortKeys(ScalarType type, const void* in, bool descending, uint64_t* keys,
                           int32_t* positions, int64_t outer, int64_t inner, int64_t padded,
                           cudaStream_t stream);
cudaError_t LaunchSortRows(uint64_t* keys, int32_t* positions, int64_t outer, int64_t padded,
                           cudaStream_t stream);
// values[r][i] = in[r][positions[r][i]], indices[r][i] = positions[r][i] for i < inner.
cudaError_t LaunchSortGather(int item_size, const void* in, const int32_t* positions, void* values,
                             int64_t* indices, int64_t outer, int64_t inner, int64_t padded,
                             cudaStream_t stream);

// [batch, m, k] x [batch, k, n] -> contiguous out, for the types cuBLAS does not multiply (bool
// and the integers), accumulating in int64 (logical or/and for bool) as the CPU does. Operands
// are read through their strides (batch, row, column).
struct MatmulShape {
  int64_t batch, m, k, n;
  int64_t a_strides[3];
  int64_t b_strides[3];
};
cudaError_t LaunchIntegerMatmul(ScalarType type, const void* a, const void* b, void* out,
                                const MatmulShape& shape, cudaStream_t stream);

}  // namespace orochi::engine::cuda
