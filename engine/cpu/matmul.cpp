// CPU matrix multiplication: OpenBLAS for float32/float64, plain loops for the other dtypes.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "blas.h"
#include "dispatch.h"
#include "gemm_split.h"
#include "kernels.h"
#include "thread_pool.h"
#include "vector_math.h"

namespace orochi::engine::cpu {
namespace {

// OpenBLAS's sgemm/dgemm reading B transposed (CblasTrans) runs at 0.35-0.75x of its speed on
// the same product with B row-major when A has a few rows (8-16; bench_engine's "few rows"
// cases), and linear(x, w) is exactly that: x times a loaded [out, in] weight read as [in, out].
// So a read-only B matrix read column-major is multiplied through a row-major copy of it, made
// once per weight storage and shared by every later call and every interpreter copy
// (Storage::PreparedLayout), as oneDNN's prepared weight layouts are. A writable B may change
// between calls: it is read in place with the transpose flag.
template <typename T>
const T* RowMajorCopy(const Tensor& b, int64_t k, int64_t n, int64_t column_stride) {
  std::string key = "row-major@" + std::to_string(b.storage_offset()) + ":" + std::to_string(k) +
                    "x" + std::to_string(n) + "/" + std::to_string(column_stride) + ":" +
                    std::to_string(sizeof(T));
  const T* source = b.data_as<T>();
  auto prepare = [&]() -> Storage::Prepared {
    auto copy = std::make_shared<std::vector<T>>(static_cast<size_t>(k * n));
    T* rows = copy->data();
    // Column j of the view is `source + j * column_stride`, contiguous over k: each is read once
    // in order and written with stride n, which the cache absorbs for weight-sized matrices.
    for (int64_t column = 0; column < n; ++column) {
      const T* from = source + column * column_stride;
      for (int64_t inner = 0; inner < k; ++inner) rows[inner * n + column] = from[inner];
    }
    return copy;
  };
  const Storage::Prepared prepared = b.storage()->PreparedLayout(key, prepare);
  return static_cast<const std::vector<T>*>(prepared.get())->data();
}

// Products this small (multiply-adds per matrix) are computed by the loops below instead of a
// BLAS call, whose fixed cost (about 0.8 us) is several times their arithmetic: attention over a
// decoder's cache is one [1, head] x [head, keys] product per sequence and head (textgen: 24 a
// sequence per step).
constexpr int64_t kSmallProduct = 4096;

// z [m, n] (row-major, contiguous) = x [m, k] times y [k, n], each read through its strides.
template <typename T>
void SmallProduct(const T* x, int64_t x_rows, int64_t x_columns, const T* y, int64_t y_rows,
                  int64_t y_columns, T* __restrict z, int64_t m, int64_t k, int64_t n) {
  const VectorKernels* vector = nullptr;
  if constexpr (std::is_same_v<T, float>) vector = ActiveVectorKernels();
  for (int64_t row = 0; row < m; ++row) {
    T* __restrict out = z + row * n;
    const T* left = x + row * x_rows;
    if (y_columns == 1 && vector != nullptr) {
      if constexpr (std::is_same_v<T, float>) {
        vector->row_combination(left, x_columns, y, y_rows, k, out, n);
      }
      continue;
    }
    if (y_columns == 1) {  // rows of y are contiguous: out += x[row, i] * y[i, :], vectorised
      for (int64_t column = 0; column < n; ++column) out[column] = T{};
      for (int64_t inner = 0; inner < k; ++inner) {
        const T scale = left[inner * x_columns];
        const T* __restrict right = y + inner * y_rows;
        for (int64_t column = 0; column < n; ++column) out[column] += scale * right[column];
      }
      continue;
    }
    if (x_columns == 1 && y_rows == 1 && vector != nullptr) {
      if constexpr (std::is_same_v<T, float>) vector->row_dots(left, y, y_columns, k, out, n);
      continue;
    }
    if (x_columns == 1 && y_rows == 1) {  // both contiguous along k: unit-stride dot products
      for (int64_t column = 0; column < n; ++column) {
        const T* __restrict right = y + column * y_columns;
        T sums[8] = {};
        int64_t inner = 0;
        for (; inner + 8 <= k; inner += 8) {
          for (int64_t lane = 0; lane < 8; ++lane) {
            sums[lane] += left[inner + lane] * right[inner + lane];
          }
        }
        for (; inner < k; ++inner) sums[0] += left[inner] * right[inner];
        out[column] = ((sums[0] + sums[1]) + (sums[2] + sums[3])) +
                      ((sums[4] + sums[5]) + (sums[6] + sums[7]));
      }
      continue;
    }
    for (int64_t column = 0; column < n; ++column) {  // columns of y contiguous: dot products
      const T* right = y + column * y_columns;
      T sums[4] = {};
      int64_t inner = 0;
      for (; inner + 4 <= k; inner += 4) {
        for (int64_t lane = 0; lane < 4; ++lane) {
          sums[lane] += left[(inner + lane) * x_columns] * right[(inner + lane) * y_rows];
        }
      }
      for (; inner < k; ++inner) sums[0] += left[inner * x_columns] * right[inner * y_rows];
      out[column] = (sums[0] + sums[1]) + (sums[2] + sums[3]);
    }
  }
}

}  // namespace

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
      if (m * k * n <= kSmallProduct) {  // below what a BLAS call costs by itself
        for (int64_t i = 0; i < batch; ++i) {
          SmallProduct<T>(lhs + i * a.strides()[0], a_rows, a_columns, rhs + i * b.strides()[0],
                          b_rows, b_columns, out + i * m * n, m, k, n);
        }
        return;
      }
      // One read-only B for the whole batch (a loaded weight) read transposed: its row-major
      // copy, made once and kept with the weight.
      int64_t b_batch = b.strides()[0];
      int64_t b_row_stride = b_rows;
      int64_t b_column_stride = b_columns;
      bool b_is_row_major = b_row_major;
      if (!b_row_major && (batch == 1 || b.strides()[0] == 0) && b.read_only()) {
        rhs = RowMajorCopy<T>(b, k, n, b_columns);
        b_batch = 0;
        b_row_stride = n;
        b_column_stride = 1;
        b_is_row_major = true;
      }
      // Single-threaded BLAS calls on blocks of the output, spread over the intra-op pool.
      const GemmSplit split = SplitGemm(batch, m, n, k);
      ParallelFor(split.units(), split.grain, [&](int64_t begin, int64_t end) {
        for (int64_t unit = begin; unit < end; ++unit) {
          const int64_t i = unit / split.blocks;
          const GemmBlock block = split.Block(unit % split.blocks);
          const T* x = lhs + i * a.strides()[0] + block.row * a_rows;
          const T* y = rhs + i * b_batch + block.column * b_column_stride;
          T* z = out + i * m * n + block.row * n + block.column;
          const auto transpose_a = a_row_major ? CblasNoTrans : CblasTrans;
          const auto transpose_b = b_is_row_major ? CblasNoTrans : CblasTrans;
          const auto lda = static_cast<int>(a_row_major ? a_rows : a_columns);
          const auto ldb = static_cast<int>(b_is_row_major ? b_row_stride : b_column_stride);
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
