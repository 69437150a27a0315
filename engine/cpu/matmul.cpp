// CPU matrix multiplication: OpenBLAS for float32/float64, plain loops for the other dtypes.
#include <cstring>

#include "blas.h"
#include "dispatch.h"
#include "gemm_split.h"
#include "kernels.h"
#include "thread_pool.h"

namespace orochi::engine::cpu {
void Matmul(const Tensor& a, const Tensor& b, Tensor& output) {
  const int64_t batch = a.shape()[0];
  const int64_t m = a.shape()[1];
  const int64_t k = a.shape()[2];
  const int64_t n = b.shape()[2];
  if (output.numel() == 0) return;
  if (k == 0) {  // an empty sum, without asking BLAS about zero-width matrices
    std::memset(output.mutable_data(), 0, output.numel() * ItemSize(output.dtype()));
    return;
  }
  // Row-major matrices have a unit column stride; the others are column-major (see MatmulKernel).
  const int64_t a_rows = a.strides()[1];
  const int64_t a_columns = a.strides()[2];
  const int64_t b_rows = b.strides()[1];
  const int64_t b_columns = b.strides()[2];
  const bool a_row_major = a_columns == 1;
  const bool b_row_major = b_columns == 1;
  VisitDType(a.dtype(), [&]<typename T>() {
    const T* lhs = a.data_as<T>();
    const T* rhs = b.data_as<T>();
    T* out = output.mutable_data_as<T>();
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
      // Single-threaded BLAS calls on blocks of the output, spread over the intra-op pool.
      const GemmSplit split = SplitGemm(batch, m, n, k);
      ParallelFor(split.units(), split.grain, [&](int64_t begin, int64_t end) {
        for (int64_t unit = begin; unit < end; ++unit) {
          const int64_t i = unit / split.blocks;
          const GemmBlock block = split.Block(unit % split.blocks);
          const T* x = lhs + i * a.strides()[0] + block.row * a_rows;
          const T* y = rhs + i * b.strides()[0] + block.column * b_columns;
          T* z = out + i * m * n + block.row * n + block.column;
          const auto transpose_a = a_row_major ? CblasNoTrans : CblasTrans;
          const auto transpose_b = b_row_major ? CblasNoTrans : CblasTrans;
          const auto lda = static_cast<int>(a_row_major ? a_rows : a_columns);
          const auto ldb = static_cast<int>(b_row_major ? b_rows : b_columns);
          const auto rows = static_cast<int>(block.rows);
          const auto columns = static_cast<int>(block.columns);
          if constexpr (std::is_same_v<T, float>) {
            Blas().sgemm(CblasRowMajor, transpose_a, transpose_b, rows, columns,
                         static_cast<int>(k), 1.0F, x, lda, y, ldb, 0.0F, z, static_cast<int>(n));
          } else {
            Blas().dgemm(CblasRowMajor, transpose_a, transpose_b, rows, columns,
                         static_cast<int>(k), 1.0, x, lda, y, ldb, 0.0, z, static_cast<int>(n));
          }
        }
      });
      return;
    }
    for (int64_t i = 0; i < batch; ++i) {
      const T* x = lhs + i * a.strides()[0];
      const T* y = rhs + i * b.strides()[0];
      T* z = out + i * m * n;
      using A = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float,
                                   std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;
      for (int64_t row = 0; row < m; ++row) {
        for (int64_t column = 0; column < n; ++column) {
          A total{};
          for (int64_t inner = 0; inner < k; ++inner) {
            const T& left = x[row * a_rows + inner * a_columns];
            const T& right = y[inner * b_rows + column * b_columns];
            if constexpr (std::is_same_v<A, bool>) {
              total = total || (left && right);
            } else {
              total += Convert<A>(left) * Convert<A>(right);
            }
          }
          z[row * n + column] = Convert<T>(total);
        }
      }
    }
  });
}

}  // namespace orochi::engine::cpu
