// CPU matrix multiplication: OpenBLAS for float32/float64, plain loops for the other dtypes.
#include "blas.h"
#include "orochi/engine/dispatch.h"

namespace orochi::engine::cpu {
namespace {

void Matmul(const Tensor& a, const Tensor& b, Tensor& output) {
  const int64_t batch = a.shape()[0];
  const int64_t m = a.shape()[1];
  const int64_t k = a.shape()[2];
  const int64_t n = b.shape()[2];
  if (output.numel() == 0) return;
  VisitDType(a.dtype(), [&]<typename T>() {
    const T* lhs = a.data_as<T>();
    const T* rhs = b.data_as<T>();
    T* out = output.mutable_data_as<T>();
    for (int64_t i = 0; i < batch; ++i) {
      const T* x = lhs + i * m * k;
      const T* y = rhs + i * k * n;
      T* z = out + i * m * n;
      if constexpr (std::is_same_v<T, float>) {
        Blas().sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                     static_cast<int>(n), static_cast<int>(k), 1.0F, x, static_cast<int>(k), y,
                     static_cast<int>(n), 0.0F, z, static_cast<int>(n));
      } else if constexpr (std::is_same_v<T, double>) {
        Blas().dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(m),
                     static_cast<int>(n), static_cast<int>(k), 1.0, x, static_cast<int>(k), y,
                     static_cast<int>(n), 0.0, z, static_cast<int>(n));
      } else {
        using A = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float,
                                     std::conditional_t<std::is_same_v<T, bool>, bool, int64_t>>;
        for (int64_t row = 0; row < m; ++row) {
          for (int64_t column = 0; column < n; ++column) {
            A total{};
            for (int64_t inner = 0; inner < k; ++inner) {
              if constexpr (std::is_same_v<A, bool>) {
                total = total || (x[row * k + inner] && y[inner * n + column]);
              } else {
                total += Convert<A>(x[row * k + inner]) * Convert<A>(y[inner * n + column]);
              }
            }
            z[row * n + column] = Convert<T>(total);
          }
        }
      }
    }
  });
}

}  // namespace

void RegisterMatmulKernels(KernelRegistry& registry) {
  registry.Register<Op::matmul>(DeviceType::kCpu, Matmul, kAllDTypes);
}

}  // namespace orochi::engine::cpu
