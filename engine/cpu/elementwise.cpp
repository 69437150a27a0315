// CPU kernels for copies, fills and elementwise ops. Half types compute in float.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

#include "dispatch.h"
#include "kernels.h"
#include "scalar_rules.h"
#include "strided.h"
#include "vector_math.h"

namespace orochi::engine::cpu {
namespace {

// The type arithmetic happens in: float for the 16-bit floats, the type itself otherwise.
template <typename T>
using Compute =
    std::conditional_t<std::is_same_v<T, Half> || std::is_same_v<T, BFloat16>, float, T>;

}  // namespace

void Copy(const Tensor& source, Tensor& destination) {
  VisitDType(destination.dtype(), [&]<typename To>() {
    VisitDType(source.dtype(), [&]<typename From>() {
      ForEachRow<2>(
          destination.shape(), {&destination, &source}, [](auto rows, int64_t count, auto strides) {
            if constexpr (std::is_same_v<To, From>) {
              if (strides[0] == sizeof(To) && strides[1] == sizeof(From)) {
                std::memcpy(rows[0], rows[1], count * sizeof(To));
                return;
              }
            }
            for (int64_t i = 0; i < count; ++i) {
              At<To>(rows[0], strides[0], i) = Convert<To>(At<From>(rows[1], strides[1], i));
            }
          });
    });
  });
}

void Fill(Tensor& output, double value) {
  VisitDType(output.dtype(), [&]<typename T>() {
    T converted = Convert<T>(value);
    auto* data = output.mutable_data_as<T>();
    for (int64_t i = 0, n = output.numel(); i < n; ++i) data[i] = converted;
  });
}

void ArangeFill(Tensor& output, double start, double step) {
  VisitDType(output.dtype(), [&]<typename T>() {
    auto* data = output.mutable_data_as<T>();
    for (int64_t i = 0, n = output.numel(); i < n; ++i) {
      data[i] = Convert<T>(start + static_cast<double>(i) * step);
    }
  });
}

namespace {

// Always inlined: with `op` a constant (MapUnaryOf), the switch folds away and the loop around it
// vectorises.
template <typename C>
[[gnu::always_inline]] inline C ApplyUnary(Op op, C x) {
  if constexpr (std::is_floating_point_v<C>) {
    switch (op) {
      case Op::neg:
        return -x;
      case Op::abs:
        return std::abs(x);
      case Op::exp:
        return std::exp(x);
      case Op::log:
        return std::log(x);
      case Op::sqrt:
        return std::sqrt(x);
      case Op::rsqrt:
        return C{1} / std::sqrt(x);
      case Op::sin:
        return std::sin(x);
      case Op::cos:
        return std::cos(x);
      case Op::tanh:
        return std::tanh(x);
      case Op::sigmoid:
        return C{1} / (C{1} + std::exp(-x));
      case Op::relu:
        return !(x <= C{0}) ? x : C{0};  // NaN stays NaN, as in PyTorch
      case Op::silu:
        return x / (C{1} + std::exp(-x));
      case Op::gelu:  // 1 + erf(x / sqrt 2) as erfc(-x / sqrt 2): no cancellation for x < 0
        return C{0.5} * x * std::erfc(x * C{-0.70710678118654752440});
      case Op::gelu_tanh: {
        const C inner = C{0.79788456080286535588} * (x + C{0.044715} * x * x * x);
        return C{0.5} * x * (C{1} + std::tanh(inner));
      }
      case Op::erf:
        return std::erf(x);
      case Op::floor:
        return std::floor(x);
      case Op::ceil:
        return std::ceil(x);
      case Op::round:
        return std::nearbyint(x);  // half to even, like torch.round
      default:
        return x;
    }
  } else {  // integral: the ops the front-end keeps integral
    switch (op) {
      case Op::neg:
        return static_cast<C>(-x);
      case Op::abs:
        return x < C{0} ? static_cast<C>(-x) : x;
      case Op::relu:
        return x > C{0} ? x : C{0};
      default:
        return x;  // floor, ceil, round are the identity on integers
    }
  }
}

// Runs `fn` over (output, inputs...) rows: unit-stride rows get a plain pointer loop that the
// compiler vectorises; strided rows (views, broadcasts) the general one.
template <typename Out, typename In, size_t N, typename Fn>
void MapRows(Tensor& output, const std::array<const Tensor*, N>& inputs, Fn fn) {
  std::array<const Tensor*, N + 1> all{};
  all[0] = &output;
  for (size_t i = 0; i < N; ++i) all[i + 1] = inputs[i];
  ForEachRow<N + 1>(output.shape(), all, [&fn](auto rows, int64_t count, auto strides) {
    bool unit = strides[0] == sizeof(Out);
    for (size_t i = 1; i <= N; ++i) unit = unit && strides[i] == sizeof(In);
    auto* out = reinterpret_cast<Out*>(rows[0]);
    if constexpr (N == 1) {
      const auto* x = reinterpret_cast<const In*>(rows[1]);
      if (unit) {
        for (int64_t i = 0; i < count; ++i) out[i] = fn(x[i]);
      } else {
        for (int64_t i = 0; i < count; ++i) {
          At<Out>(rows[0], strides[0], i) = fn(At<In>(rows[1], strides[1], i));
        }
      }
    } else {
      const auto* x = reinterpret_cast<const In*>(rows[1]);
      const auto* y = reinterpret_cast<const In*>(rows[2]);
      if (unit) {
        for (int64_t i = 0; i < count; ++i) out[i] = fn(x[i], y[i]);
      } else {
        for (int64_t i = 0; i < count; ++i) {
          At<Out>(rows[0], strides[0], i) =
              fn(At<In>(rows[1], strides[1], i), At<In>(rows[2], strides[2], i));
        }
      }
    }
  });
}

template <typename T, Op kOp>
void MapUnaryOf(const Tensor& input, Tensor& output) {
  MapRows<T, T, 1>(output, {&input},
                   [](T value) { return Convert<T>(ApplyUnary(kOp, Convert<Compute<T>>(value))); });
}

// The ops with a vectorised float32 kernel (vector_math.h).
bool VectorFormOf(Op op, VectorUnary* form) {
  switch (op) {
    case Op::exp:
      *form = VectorUnary::kExp;
      return true;
    case Op::log:
      *form = VectorUnary::kLog;
      return true;
    case Op::tanh:
      *form = VectorUnary::kTanh;
      return true;
    case Op::sigmoid:
      *form = VectorUnary::kSigmoid;
      return true;
    case Op::silu:
      *form = VectorUnary::kSilu;
      return true;
    case Op::gelu:
      *form = VectorUnary::kGelu;
      return true;
    case Op::gelu_tanh:
      *form = VectorUnary::kGeluTanh;
      return true;
    case Op::erf:
      *form = VectorUnary::kErf;
      return true;
    case Op::sin:
      *form = VectorUnary::kSin;
      return true;
    case Op::cos:
      *form = VectorUnary::kCos;
      return true;
    default:
      return false;
  }
}

// A row of `count` values through the vectorised kernel: float32 rows of unit stride directly,
// the others (16-bit floats, strided views) in float32 chunks on the stack.
template <typename T>
void VectorUnaryRow(const VectorKernels& kernels, VectorUnary form, std::byte* out,
                    int64_t out_stride, const std::byte* in, int64_t in_stride, int64_t count) {
  if constexpr (std::is_same_v<T, float>) {
    if (out_stride == sizeof(float) && in_stride == sizeof(float)) {
      kernels.unary(form, reinterpret_cast<const float*>(in), reinterpret_cast<float*>(out), count);
      return;
    }
  }
  constexpr int64_t kChunk = 256;
  float buffer[kChunk];
  for (int64_t start = 0; start < count; start += kChunk) {
    const int64_t length = std::min(kChunk, count - start);
    for (int64_t i = 0; i < length; ++i) {
      buffer[i] = Convert<float>(At<T>(const_cast<std::byte*>(in), in_stride, start + i));
    }
    kernels.unary(form, buffer, buffer, length);
    for (int64_t i = 0; i < length; ++i) At<T>(out, out_stride, start + i) = Convert<T>(buffer[i]);
  }
}

}  // namespace

void UnaryOp(Op op, const Tensor& input, Tensor& output) {
  VisitDType(input.dtype(), [&]<typename T>() {
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, Half> ||
                  std::is_same_v<T, BFloat16>) {
      VectorUnary form{};
      const VectorKernels* kernels = ActiveVectorKernels();
      if (kernels != nullptr && VectorFormOf(op, &form)) {
        ForEachRow<2>(
            output.shape(), {&output, &input},
            [&](auto rows, int64_t count, auto strides) {
              VectorUnaryRow<T>(*kernels, form, rows[0], strides[0], rows[1], strides[1], count);
            },
            kElementwiseGrain / 4);  // exp, tanh, erf...: a few times an add's cost per element
        return;
      }
    }
    if constexpr (!std::is_same_v<T, bool>) {
      switch (op) {  // the cheap ops, one loop each (relu took 3.4 ns per float with the switch)
        case Op::neg:
          return MapUnaryOf<T, Op::neg>(input, output);
        case Op::abs:
          return MapUnaryOf<T, Op::abs>(input, output);
        case Op::relu:
          return MapUnaryOf<T, Op::relu>(input, output);
        case Op::sqrt:
          return MapUnaryOf<T, Op::sqrt>(input, output);
        case Op::rsqrt:
          return MapUnaryOf<T, Op::rsqrt>(input, output);
        case Op::floor:
          return MapUnaryOf<T, Op::floor>(input, output);
        case Op::ceil:
          return MapUnaryOf<T, Op::ceil>(input, output);
        default:
          MapRows<T, T, 1>(output, {&input}, [op](T value) {
            return Convert<T>(ApplyUnary(op, Convert<Compute<T>>(value)));
          });
      }
    }
  });
}

namespace {

template <typename C>
C ApplyArithmetic(Op op, C a, C b) {
  switch (op) {
    case Op::add:
      return a + b;
    case Op::sub:
      return a - b;
    case Op::mul:
      return a * b;
    case Op::div:
      return a / b;
    case Op::pow:
      if constexpr (std::is_floating_point_v<C>) {
        return std::pow(a, b);
      } else {
        return IntegerPower(a, b);
      }
    case Op::floor_divide:
      return FloorDivide(a, b);
    case Op::remainder:
      return Remainder(a, b);
    case Op::maximum:
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
      }
      return a > b ? a : b;
    case Op::minimum:
      if constexpr (std::is_floating_point_v<C>) {
        if (std::isnan(a) || std::isnan(b)) return std::numeric_limits<C>::quiet_NaN();
      }
      return a < b ? a : b;
    default:
      return a;
  }
}

// Comparisons and logical ops write bool.
bool IsComparison(Op op) {
  return op == Op::eq || op == Op::ne || op == Op::lt || op == Op::le || op == Op::gt ||
         op == Op::ge || op == Op::logical_and || op == Op::logical_or || op == Op::logical_xor;
}

}  // namespace

void BinaryOp(Op op, const Tensor& a, const Tensor& b, Tensor& output) {
  VisitDType(a.dtype(), [&]<typename T>() {
    using C = std::conditional_t<std::is_same_v<T, bool>, int, Compute<T>>;
    if (IsComparison(op)) {
      MapRows<bool, T, 2>(output, {&a, &b}, [op](T x, T y) {
        return ApplyComparison(op, Convert<C>(x), Convert<C>(y));
      });
      return;
    }
    // The common ops get a loop of their own, so the op is not switched on per element.
    auto run = [&](auto arithmetic) {
      MapRows<T, T, 2>(output, {&a, &b}, [arithmetic](T x, T y) {
        return Convert<T>(arithmetic(Convert<C>(x), Convert<C>(y)));
      });
    };
    switch (op) {
      case Op::add:
        return run([](C x, C y) { return static_cast<C>(x + y); });
      case Op::sub:
        return run([](C x, C y) { return static_cast<C>(x - y); });
      case Op::mul:
        return run([](C x, C y) { return static_cast<C>(x * y); });
      case Op::div:
        return run([](C x, C y) { return static_cast<C>(x / y); });
      default:
        return run([op](C x, C y) { return ApplyArithmetic(op, x, y); });
    }
  });
}

void WhereOp(const Tensor& condition, const Tensor& a, const Tensor& b, Tensor& output) {
  VisitDType(output.dtype(), [&]<typename T>() {
    ForEachRow<4>(output.shape(), {&output, &condition, &a, &b},
                  [](auto rows, int64_t count, auto strides) {
                    for (int64_t i = 0; i < count; ++i) {
                      At<T>(rows[0], strides[0], i) = At<bool>(rows[1], strides[1], i)
                                                          ? At<T>(rows[2], strides[2], i)
                                                          : At<T>(rows[3], strides[3], i);
                    }
                  });
  });
}

}  // namespace orochi::engine::cpu
