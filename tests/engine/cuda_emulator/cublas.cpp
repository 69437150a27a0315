// A stand-in for the part of cuBLAS the backend uses (libcublas.so.N next to the emulated
// backend): handles bound to a stream, and cublasGemmStridedBatchedEx computed on the host, with
// cuBLAS's argument checks, column-major operands, host-pointer alpha and beta, and TF32 inputs
// rounded to 10 mantissa bits under CUBLAS_COMPUTE_32F_FAST_TF32.
#include <cublas_v2.h>
#include <cuda_fp16.h>

#include <algorithm>
#include <cstdint>

#include "elements.h"
#include "emulator.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
};

namespace {

namespace emulator = orochi::cuda_emulator;
using emulator::Element;

Element ElementOf(cudaDataType type) {
  switch (type) {
    case CUDA_R_16F:
      return Element::kHalf;
    case CUDA_R_16BF:
      return Element::kBFloat16;
    case CUDA_R_32F:
      return Element::kFloat;
    default:
      return Element::kDouble;
  }
}

bool Supported(cudaDataType type, cublasComputeType_t compute) {
  switch (type) {
    case CUDA_R_16F:
      return compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_16F;
    case CUDA_R_16BF:
      return compute == CUBLAS_COMPUTE_32F;
    case CUDA_R_32F:
      return compute == CUBLAS_COMPUTE_32F || compute == CUBLAS_COMPUTE_32F_FAST_TF32;
    case CUDA_R_64F:
      return compute == CUBLAS_COMPUTE_64F;
    default:
      return false;
  }
}

// The bytes an operand of `rows` x `columns` (column-major, leading dimension `leading`) spans in
// each of `batch` matrices `stride` apart.
size_t SpanBytes(int rows, int columns, int leading, long long stride, int batch,
                 cudaDataType type) {
  if (rows == 0 || columns == 0 || batch == 0) return 0;
  const auto last = static_cast<int64_t>(columns - 1) * leading + (rows - 1) +
                    static_cast<int64_t>(batch - 1) * stride;
  return static_cast<size_t>(last + 1) * emulator::ElementSize(ElementOf(type));
}

emulator::CodeDescription<cublasStatus_t> DescribeStatus(cublasStatus_t status) {
  static constexpr emulator::CodeDescription<cublasStatus_t> kKnown[] = {
      {CUBLAS_STATUS_SUCCESS, "CUBLAS_STATUS_SUCCESS", "success"},
      {CUBLAS_STATUS_INVALID_VALUE, "CUBLAS_STATUS_INVALID_VALUE",
       "an invalid numeric value was used as an argument"},
      {CUBLAS_STATUS_NOT_SUPPORTED, "CUBLAS_STATUS_NOT_SUPPORTED",
       "the functionality requested is not supported"},
  };
  return emulator::Describe(
      kKnown, status, {status, "CUBLAS_STATUS_INTERNAL_ERROR", "an internal operation failed"});
}

}  // namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  *handle = new cublasContext;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t stream) {
  handle->stream = stream;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) { return DescribeStatus(status).name; }

const char* cublasGetStatusString(cublasStatus_t status) { return DescribeStatus(status).text; }

cublasStatus_t cublasGemmStridedBatchedEx(
    cublasHandle_t handle, cublasOperation_t trans_a, cublasOperation_t trans_b, int m, int n,
    int k, const void* alpha, const void* a, cudaDataType a_type, int lda, long long stride_a,
    const void* b, cudaDataType b_type, int ldb, long long stride_b, const void* beta, void* c,
    cudaDataType c_type, int ldc, long long stride_c, int batch, cublasComputeType_t compute,
    cublasGemmAlgo_t /*algorithm*/) {
  const bool transpose_a = trans_a != CUBLAS_OP_N;
  const bool transpose_b = trans_b != CUBLAS_OP_N;
  // op(A) is m x k, op(B) k x n, C m x n, all column-major.
  const int a_rows = transpose_a ? k : m;
  const int b_rows = transpose_b ? n : k;
  if (m < 0 || n < 0 || k < 0 || batch < 0 || lda < std::max(1, a_rows) ||
      ldb < std::max(1, b_rows) || ldc < std::max(1, m)) {
    return CUBLAS_STATUS_INVALID_VALUE;
  }
  if (a_type != b_type || a_type != c_type || !Supported(a_type, compute)) {
    return CUBLAS_STATUS_NOT_SUPPORTED;
  }
  const int a_columns = transpose_a ? m : k;
  const int b_columns = transpose_b ? k : n;
  if (!emulator::IsDeviceRangeOf(handle->stream, a,
                                 SpanBytes(a_rows, a_columns, lda, stride_a, batch, a_type)) ||
      !emulator::IsDeviceRangeOf(handle->stream, b,
                                 SpanBytes(b_rows, b_columns, ldb, stride_b, batch, b_type)) ||
      !emulator::IsDeviceRangeOf(handle->stream, c,
                                 SpanBytes(m, n, ldc, stride_c, batch, c_type))) {
    return CUBLAS_STATUS_INVALID_VALUE;  // the GPU would fault: not memory of the handle's GPU
  }
  // Host pointer mode: alpha and beta are read now, in the compute type.
  const bool double_scalars = compute == CUBLAS_COMPUTE_64F;
  const bool half_scalars = compute == CUBLAS_COMPUTE_16F;
  auto scalar = [&](const void* value) -> double {
    if (double_scalars) return *static_cast<const double*>(value);
    if (half_scalars) return __half2float(*static_cast<const __half*>(value));
    return *static_cast<const float*>(value);
  };
  const double alpha_value = scalar(alpha);
  const double beta_value = scalar(beta);
  const bool tf32 = compute == CUBLAS_COMPUTE_32F_FAST_TF32;
  const Element element = ElementOf(a_type);  // of B and C too
  emulator::Enqueue(handle->stream, [=] {
    for (int p = 0; p < batch; ++p) {
      const int64_t a_base = p * stride_a;
      const int64_t b_base = p * stride_b;
      const int64_t c_base = p * stride_c;
      for (int j = 0; j < n; ++j) {
        for (int i = 0; i < m; ++i) {
          double sum = 0;
          for (int l = 0; l < k; ++l) {
            const int64_t a_index = transpose_a ? a_base + l + static_cast<int64_t>(i) * lda
                                                : a_base + i + static_cast<int64_t>(l) * lda;
            const int64_t b_index = transpose_b ? b_base + j + static_cast<int64_t>(l) * ldb
                                                : b_base + l + static_cast<int64_t>(j) * ldb;
            double x = emulator::LoadElement(a, element, a_index);
            double y = emulator::LoadElement(b, element, b_index);
            if (tf32) {
              x = emulator::RoundToTf32(x);
              y = emulator::RoundToTf32(y);
            }
            sum += x * y;
          }
          const int64_t c_index = c_base + i + static_cast<int64_t>(j) * ldc;
          // beta == 0 ignores C, which may hold NaN, as BLAS specifies.
          const double previous =
              beta_value == 0 ? 0 : beta_value * emulator::LoadElement(c, element, c_index);
          emulator::StoreElement(c, element, c_index, alpha_value * sum + previous);
        }
      }
    }
  });
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
