// CPU reductions and softmax over the inner dimension of a contiguous [outer, inner] input.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "dispatch.h"
#include "kernels.h"
#include "strided.h"
#include "thread_pool.h"
#include "vector_math.h"

namespace orochi::engine::cpu {
namespace {

// Accumulates in double for floating inputs and int64 for the rest.
template <typename T>
using Accumulator = std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16> ||
                                           std::is_floating_point_v<T>,
                                       double, int64_t>;

}  // namespace

void ReduceOp(Op op, const Tensor& input, Tensor& output) {
  const int64_t outer = output.numel();
  const int64_t inner = outer == 0 ? 0 : input.numel() / outer;
  VisitDType(input.dtype(), [&]<typename T>() {
    using A = Accumulator<T>;
    const T* in = input.data_as<T>();
    VisitDType(output.dtype(), [&]<typename O>() {
      O* out = output.mutable_data_as<O>();
      for (int64_t row = 0; row < outer; ++row) {
        const T* values = in + row * inner;
        A result{};
        if (op == Op::argmax || op == Op::argmin) {
          // The first extreme wins; NaN counts as the extreme, as in PyTorch.
          int64_t best = 0;
          A best_value = Convert<A>(values[0]);
          for (int64_t i = 1; i < inner; ++i) {
            A value = Convert<A>(values[i]);
            bool better = op == Op::argmax ? value > best_value : value < best_value;
            if constexpr (std::is_floating_point_v<A>) {
              if (std::isnan(best_value)) {
                better = false;
              } else if (std::isnan(value)) {
                better = true;
              }
            }
            if (better) {
              best = i;
              best_value = value;
            }
          }
          out[row] = Convert<O>(best);
          continue;
        }
        if (op == Op::prod) {
          result = A{1};
          for (int64_t i = 0; i < inner; ++i) result *= Convert<A>(values[i]);
        } else if (op == Op::amax || op == Op::amin) {
          result = Convert<A>(values[0]);
          for (int64_t i = 1; i < inner; ++i) {
            A value = Convert<A>(values[i]);
            if constexpr (std::is_floating_point_v<A>) {
              if (std::isnan(value) || std::isnan(result)) {
                result = std::numeric_limits<A>::quiet_NaN();
                continue;
              }
            }
            result = op == Op::amax ? (value > result ? value : result)
                                    : (value < result ? value : result);
          }
        } else {
          for (int64_t i = 0; i < inner; ++i) result += Convert<A>(values[i]);
          if (op == Op::mean) result /= static_cast<A>(inner);
        }
        out[row] = Convert<O>(result);
      }
    });
  });
}

namespace {

// Rows of `inner` values per thread, for softmax and the norms (a few passes over each row).
int64_t RowGrain(int64_t inner) {
  return std::max<int64_t>(1, kElementwiseGrain / 4 / std::max<int64_t>(inner, 1));
}

template <typename T>
constexpr bool kHasVectorKernels =
    std::is_same_v<T, float> || std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>;

// Runs `row(x, y)` on float32 rows of `inner` values: the tensors' own for float32, else copies
// of each row in a buffer (16-bit floats), converted back afterwards.
// Rows spread over the intra-op pool (thread_pool.h); each row is computed the same way
// whichever thread runs it, so the results do not depend on the split.
template <typename T, typename Row>
void ForEachFloatRow(const T* in, T* out, int64_t outer, int64_t inner, Row row) {
  ParallelFor(outer, RowGrain(inner), [&](int64_t first, int64_t last) {
    if constexpr (std::is_same_v<T, float>) {
      for (int64_t r = first; r < last; ++r) row(in + r * inner, out + r * inner);
    } else {
      std::vector<float> buffer(static_cast<size_t>(inner));
      for (int64_t r = first; r < last; ++r) {
        for (int64_t i = 0; i < inner; ++i) buffer[i] = Convert<float>(in[r * inner + i]);
        row(buffer.data(), buffer.data());
        for (int64_t i = 0; i < inner; ++i) out[r * inner + i] = Convert<T>(buffer[i]);
      }
    }
  });
}

// `values` (null, or [inner] of T) as float32: the same pointer for float32, else `converted`.
template <typename T>
const float* AsFloat(const T* values, int64_t inner, std::vector<float>& converted) {
  if constexpr (std::is_same_v<T, float>) {
    return values;
  } else {
    if (values == nullptr) return nullptr;
    converted.resize(static_cast<size_t>(inner));
    for (int64_t i = 0; i < inner; ++i) converted[i] = Convert<float>(values[i]);
    return converted.data();
  }
}

}  // namespace

void SoftmaxOp(Op op, const Tensor& input, Tensor& output) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
  VisitDType(input.dtype(), [&]<typename T>() {
    if constexpr (kHasVectorKernels<T>) {
      if (const VectorKernels* kernels = ActiveVectorKernels(); kernels != nullptr) {
        auto* row_kernel = op == Op::softmax ? kernels->softmax : kernels->log_softmax;
        ForEachFloatRow(input.data_as<T>(), output.mutable_data_as<T>(), outer, inner,
                        [&](const float* x, float* y) { row_kernel(x, y, inner); });
        return;
      }
    }
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* in = input.data_as<T>();
    T* out = output.mutable_data_as<T>();
    ParallelFor(outer, RowGrain(inner), [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        const T* x = in + row * inner;
        T* y = out + row * inner;
        C maximum = -std::numeric_limits<C>::infinity();
        for (int64_t i = 0; i < inner; ++i) maximum = std::max(maximum, Convert<C>(x[i]));
        C total = 0;
        for (int64_t i = 0; i < inner; ++i) total += std::exp(Convert<C>(x[i]) - maximum);
        if (op == Op::softmax) {
          for (int64_t i = 0; i < inner; ++i) {
            y[i] = Convert<T>(std::exp(Convert<C>(x[i]) - maximum) / total);
          }
        } else {
          C log_total = std::log(total);
          for (int64_t i = 0; i < inner; ++i) {
            y[i] = Convert<T>(Convert<C>(x[i]) - maximum - log_total);
          }
        }
      }
    });
  });
}

void NormOp(Op op, const Tensor& input, const Tensor* weight, const Tensor* bias, double eps,
            Tensor& output) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
  VisitDType(input.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, double>, double, float>;
    const T* in = input.data_as<T>();
    const T* gamma = weight != nullptr ? weight->data_as<T>() : nullptr;
    const T* beta = bias != nullptr ? bias->data_as<T>() : nullptr;
    T* out = output.mutable_data_as<T>();
    if constexpr (kHasVectorKernels<T>) {
      if (const VectorKernels* kernels = ActiveVectorKernels(); kernels != nullptr) {
        std::vector<float> gamma_buffer;
        std::vector<float> beta_buffer;
        const float* scale = AsFloat(gamma, inner, gamma_buffer);
        const float* shift = AsFloat(beta, inner, beta_buffer);
        ForEachFloatRow(in, out, outer, inner, [&](const float* x, float* y) {
          kernels->normalize(x, scale, shift, static_cast<float>(eps), op == Op::layer_norm, y,
                             inner);
        });
        return;
      }
    }
    ParallelFor(outer, RowGrain(inner), [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        const T* x = in + row * inner;
        T* y = out + row * inner;
        C mean = 0;
        if (op == Op::layer_norm) {
          for (int64_t i = 0; i < inner; ++i) mean += Convert<C>(x[i]);
          mean /= static_cast<C>(inner);
        }
        C square_sum = 0;  // of deviations from the mean (layer_norm) or of values (rms_norm)
        for (int64_t i = 0; i < inner; ++i) {
          C deviation = Convert<C>(x[i]) - mean;
          square_sum += deviation * deviation;
        }
        C scale = C{1} / std::sqrt(square_sum / static_cast<C>(inner) + static_cast<C>(eps));
        for (int64_t i = 0; i < inner; ++i) {
          C value = (Convert<C>(x[i]) - mean) * scale;
          if (gamma != nullptr) value *= Convert<C>(gamma[i]);
          if (beta != nullptr) value += Convert<C>(beta[i]);
          y[i] = Convert<T>(value);
        }
      }
    });
  });
}

// Adds in the row's order, in float (double for float64, int64 for int64): the same sums whichever
// thread runs a row.
void CumsumOp(Op /*op*/, const Tensor& input, Tensor& output) {
  const int64_t inner = input.dim() == 0 ? 1 : input.shape().back();
  const int64_t outer = inner == 0 ? 0 : input.numel() / inner;
  VisitDType(input.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, double>, double,
                                 std::conditional_t<std::is_integral_v<T>, int64_t, float>>;
    const T* in = input.data_as<T>();
    T* out = output.mutable_data_as<T>();
    const int64_t grain = std::max<int64_t>(1, kElementwiseGrain / std::max<int64_t>(inner, 1));
    ParallelFor(outer, grain, [&](int64_t first, int64_t last) {
      for (int64_t row = first; row < last; ++row) {
        C total = 0;
        for (int64_t i = row * inner; i < (row + 1) * inner; ++i) {
          total += Convert<C>(in[i]);
          out[i] = Convert<T>(total);
        }
      }
    });
  });
}

}  // namespace orochi::engine::cpu
