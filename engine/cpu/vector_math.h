// The CPU's vectorised float32 kernels: one table per instruction set, compiled in its own
// translation unit with that set's flags (vector_avx2.cpp, vector_avx512.cpp), and picked at
// run time (vector_math.cpp). The elementwise and reduction kernels call them on unit-stride
// rows; float16 and bfloat16 go through float32 buffers.
#pragma once

#include <cstdint>

namespace orochi::engine::cpu {

enum class VectorUnary : uint8_t {
  kExp,
  kLog,
  kTanh,
  kSigmoid,
  kSilu,
  kGelu,
  kGeluTanh,
  kErf,
  kSin,
  kCos
};

struct VectorKernels {
  // y[i] = op(x[i]) for i < n; x and y may be the same buffer.
  void (*unary)(VectorUnary op, const float* x, float* y, int64_t n);
  // One row of n > 0 values; x and y may be the same buffer.
  void (*softmax)(const float* x, float* y, int64_t n);
  void (*log_softmax)(const float* x, float* y, int64_t n);
  // layer_norm (center: subtract the mean) or rms_norm of one row of n > 0 values, then times
  // gamma and plus beta where they are not null.
  void (*normalize)(const float* x, const float* gamma, const float* beta, float eps, bool center,
                    float* y, int64_t n);
  // One row of a small product whose right operand's rows are contiguous: z[0, n) = the sum over
  // i < k of x[i * x_stride] * y[i * y_stride + (0, n)] (attention's weights times its values).
  void (*row_combination)(const float* x, int64_t x_stride, const float* y, int64_t y_stride,
                          int64_t k, float* z, int64_t n);
  // One row of a small product whose operands are both contiguous along k: z[j] = the dot
  // product of x[0, k) and y[j * y_stride + (0, k)] for j < n (attention's queries and keys).
  void (*row_dots)(const float* x, const float* y, int64_t y_stride, int64_t k, float* z,
                   int64_t n);
};

const VectorKernels& Avx2Kernels();    // vector_avx2.cpp
const VectorKernels& Avx512Kernels();  // vector_avx512.cpp

// The table of the instruction set in use, or null for the scalar kernels.
const VectorKernels* ActiveVectorKernels();

}  // namespace orochi::engine::cpu
