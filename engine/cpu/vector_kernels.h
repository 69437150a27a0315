// The bodies of the vectorised kernels, written once over an instruction-set type `Isa` and
// instantiated by vector_avx2.cpp and vector_avx512.cpp, each compiled with its own flags.
//
// Every function here is a template of `Isa`, and each Isa type lives in its translation unit's
// anonymous namespace, so each instantiation is local to the file that made it: no AVX-512 code
// can be merged into a function the rest of the engine calls. For the same reason this header
// uses no inline function of the standard library (which the linker would share between files).
//
// Isa provides: V (the vector type), kWidth, Load, Store, Set1, Add, Sub, Mul, Div, Fma (a*b+c),
// Max, Abs, SelectNegative(x, a, b) (a where x < 0, else b), ReduceAdd, ReduceMax, and the SLEEF
// functions Exp, Log, Tanh, Erf, Sin, Cos.
#pragma once

#include <cstdint>

#include "vector_math.h"

namespace orochi::engine::cpu::vector {

// Applies `f` to x[0, n) into y: whole vectors, then the tail through a padded buffer.
template <typename Isa, typename F>
void Map(const float* x, float* y, int64_t n, F f) {
  constexpr int64_t kWidth = Isa::kWidth;
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) Isa::Store(y + i, f(Isa::Load(x + i)));
  if (i < n) {
    float buffer[kWidth] = {};
    for (int64_t j = 0; j < n - i; ++j) buffer[j] = x[i + j];
    Isa::Store(buffer, f(Isa::Load(buffer)));
    for (int64_t j = 0; j < n - i; ++j) y[i + j] = buffer[j];
  }
}

// Folds x[0, n) into one vector with `f`, the tail padded with `pad` (f's identity).
template <typename Isa, typename F>
typename Isa::V Fold(const float* x, int64_t n, float pad, typename Isa::V accumulator, F f) {
  constexpr int64_t kWidth = Isa::kWidth;
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) accumulator = f(accumulator, Isa::Load(x + i));
  if (i < n) {
    float buffer[kWidth];
    for (int64_t j = 0; j < kWidth; ++j) buffer[j] = i + j < n ? x[i + j] : pad;
    accumulator = f(accumulator, Isa::Load(buffer));
  }
  return accumulator;
}

// GELU, x * Phi(x), from erfc(|x| / sqrt 2) alone: one exp, one division and a polynomial per
// vector, 2.5x faster than through SLEEF's erf (GELU was the transformer encoder's largest
// cost after its GEMMs). erfc is the Chebyshev fit of Numerical Recipes' `erfcc` (fractional
// error below 1.2e-7 for every argument), so the error stays near float rounding on both sides:
// x >= 0 gives x * (1 - erfc / 2), with erfc / 2 <= 1/2; x < 0 gives x * erfc / 2 directly, where
// 1 + erf(x / sqrt 2) would cancel (against float64: at most 7 ulps for x >= 0, 17 on [-3, 0),
// where the SLEEF form gave 1.6 and 102). The scalar kernels use std::erfc the same way.
template <typename Isa>
typename Isa::V Gelu(typename Isa::V x) {
  using V = typename Isa::V;
  const V half = Isa::Set1(0.5F);
  const V z = Isa::Mul(Isa::Abs(x), Isa::Set1(0.70710678118654752440F));
  const V t = Isa::Div(Isa::Set1(1.0F), Isa::Fma(half, z, Isa::Set1(1.0F)));
  // Highest power first, for Horner's rule.
  constexpr float kCoefficients[] = {-0.82215223F, 1.48851587F, -1.13520398F, 0.27886807F,
                                     -0.18628806F, 0.09678418F, 0.37409196F,  1.00002368F};
  V polynomial = Isa::Set1(0.17087277F);
  for (const float coefficient : kCoefficients) {
    polynomial = Isa::Fma(polynomial, t, Isa::Set1(coefficient));
  }
  const V exponent = Isa::Fma(polynomial, t, Isa::Sub(Isa::Set1(-1.26551223F), Isa::Mul(z, z)));
  const V half_erfc = Isa::Mul(Isa::Mul(half, t), Isa::Exp(exponent));
  return Isa::Mul(x, Isa::SelectNegative(x, half_erfc, Isa::Sub(Isa::Set1(1.0F), half_erfc)));
}

// The same formulas as the scalar kernels (elementwise.cpp), so both paths agree to rounding
// (GELU: to a few ulps, above).
template <typename Isa>
void Unary(VectorUnary op, const float* x, float* y, int64_t n) {
  using V = typename Isa::V;
  const V one = Isa::Set1(1.0F);
  const V half = Isa::Set1(0.5F);
  switch (op) {
    case VectorUnary::kExp:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Exp(v); });
    case VectorUnary::kLog:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Log(v); });
    case VectorUnary::kTanh:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Tanh(v); });
    case VectorUnary::kErf:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Erf(v); });
    case VectorUnary::kSin:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Sin(v); });
    case VectorUnary::kCos:
      return Map<Isa>(x, y, n, [](V v) { return Isa::Cos(v); });
    case VectorUnary::kSigmoid:
      return Map<Isa>(x, y, n, [one](V v) {
        return Isa::Div(one, Isa::Add(one, Isa::Exp(Isa::Sub(Isa::Set1(0.0F), v))));
      });
    case VectorUnary::kSilu:
      return Map<Isa>(x, y, n, [one](V v) {
        return Isa::Div(v, Isa::Add(one, Isa::Exp(Isa::Sub(Isa::Set1(0.0F), v))));
      });
    case VectorUnary::kGelu:
      return Map<Isa>(x, y, n, [](V v) { return Gelu<Isa>(v); });
    case VectorUnary::kGeluTanh: {
      const V sqrt_2_over_pi = Isa::Set1(0.79788456080286535588F);
      const V cubic = Isa::Set1(0.044715F);
      return Map<Isa>(x, y, n, [=](V v) {
        const V inner = Isa::Mul(sqrt_2_over_pi, Isa::Fma(Isa::Mul(cubic, Isa::Mul(v, v)), v, v));
        return Isa::Mul(Isa::Mul(half, v), Isa::Add(one, Isa::Tanh(inner)));
      });
    }
  }
}

template <typename Isa>
float RowMax(const float* x, int64_t n) {
  const float negative_infinity = -__builtin_inff();
  return Isa::ReduceMax(Fold<Isa>(x, n, negative_infinity, Isa::Set1(negative_infinity),
                                  [](typename Isa::V a, typename Isa::V b) {
                                    return Isa::Max(b, a);  // a NaN in x is passed over, as in
                                  }));                      // the scalar max; the sum gets it
}

// Softmax: the row is read from memory once; exp is computed once per element, into y, which
// the last pass scales while it is still in the cache.
template <typename Isa>
void Softmax(const float* x, float* y, int64_t n) {
  using V = typename Isa::V;
  constexpr int64_t kWidth = Isa::kWidth;
  const V maximum = Isa::Set1(RowMax<Isa>(x, n));
  V total = Isa::Set1(0.0F);
  int64_t i = 0;
  for (; i + kWidth <= n; i += kWidth) {
    const V e = Isa::Exp(Isa::Sub(Isa::Load(x + i), maximum));
    Isa::Store(y + i, e);
    total = Isa::Add(total, e);
  }
  if (i < n) {
    float buffer[kWidth];
    for (int64_t j = 0; j < kWidth; ++j) buffer[j] = i + j < n ? x[i + j] : -__builtin_inff();
    const V e = Isa::Exp(Isa::Sub(Isa::Load(buffer), maximum));
    Isa::Store(buffer, e);
    for (int64_t j = 0; j < n - i; ++j) y[i + j] = buffer[j];
    total = Isa::Add(total, e);
  }
  const V scale = Isa::Set1(1.0F / Isa::ReduceAdd(total));
  Map<Isa>(y, y, n, [scale](V v) { return Isa::Mul(v, scale); });
}

template <typename Isa>
void LogSoftmax(const float* x, float* y, int64_t n) {
  using V = typename Isa::V;
  const float maximum = RowMax<Isa>(x, n);
  const V shift = Isa::Set1(maximum);
  const V total = Fold<Isa>(x, n, -__builtin_inff(), Isa::Set1(0.0F), [shift](V sum, V v) {
    return Isa::Add(sum, Isa::Exp(Isa::Sub(v, shift)));
  });
  float log_total[Isa::kWidth];
  Isa::Store(log_total, Isa::Log(Isa::Set1(Isa::ReduceAdd(total))));
  const V offset = Isa::Set1(maximum + log_total[0]);
  Map<Isa>(x, y, n, [offset](V v) { return Isa::Sub(v, offset); });
}

template <typename Isa>
void Normalize(const float* x, const float* gamma, const float* beta, float eps, bool center,
               float* y, int64_t n) {
  using V = typename Isa::V;
  constexpr int64_t kWidth = Isa::kWidth;
  const auto count = static_cast<float>(n);
  float mean = 0;
  if (center) {
    mean = Isa::ReduceAdd(Fold<Isa>(x, n, 0.0F, Isa::Set1(0.0F),
                                    [](V sum, V v) { return Isa::Add(sum, v); })) /
           count;
  }
  // Squares of deviations from the mean, in a second pass over the cached row (a sum of squares
  // minus the squared mean would cancel badly for rows far from zero).
  const V centre = Isa::Set1(mean);
  const V square_sum = Fold<Isa>(x, n, mean, Isa::Set1(0.0F), [centre](V sum, V v) {
    const V deviation = Isa::Sub(v, centre);
    return Isa::Fma(deviation, deviation, sum);
  });
  const V scale = Isa::Set1(1.0F / __builtin_sqrtf(Isa::ReduceAdd(square_sum) / count + eps));
  int64_t i = 0;
  auto write = [&](const float* in, const float* weight, const float* shift, float* out) {
    V value = Isa::Mul(Isa::Sub(Isa::Load(in), centre), scale);
    if (weight != nullptr) value = Isa::Mul(value, Isa::Load(weight));
    if (shift != nullptr) value = Isa::Add(value, Isa::Load(shift));
    Isa::Store(out, value);
  };
  for (; i + kWidth <= n; i += kWidth) {
    write(x + i, gamma == nullptr ? nullptr : gamma + i, beta == nullptr ? nullptr : beta + i,
          y + i);
  }
  if (i < n) {
    float in[kWidth] = {};
    float weight[kWidth] = {};
    float shift[kWidth] = {};
    float out[kWidth];
    for (int64_t j = 0; j < n - i; ++j) {
      in[j] = x[i + j];
      if (gamma != nullptr) weight[j] = gamma[i + j];
      if (beta != nullptr) shift[j] = beta[i + j];
    }
    write(in, gamma == nullptr ? nullptr : weight, beta == nullptr ? nullptr : shift, out);
    for (int64_t j = 0; j < n - i; ++j) y[i + j] = out[j];
  }
}

// Whole vectors of z's columns in registers, over two chains of FMAs (even and odd i: one chain
// waits on the FMA's latency at every i); the last columns short of a vector one at a time.
template <typename Isa>
void RowCombination(const float* x, int64_t x_stride, const float* y, int64_t y_stride, int64_t k,
                    float* z, int64_t n) {
  using V = typename Isa::V;
  constexpr int64_t kWidth = Isa::kWidth;
  int64_t column = 0;
  for (; column + kWidth <= n; column += kWidth) {
    V even = Isa::Set1(0.0F);
    V odd = Isa::Set1(0.0F);
    int64_t i = 0;
    for (; i + 2 <= k; i += 2) {
      even = Isa::Fma(Isa::Set1(x[i * x_stride]), Isa::Load(y + i * y_stride + column), even);
      odd = Isa::Fma(Isa::Set1(x[(i + 1) * x_stride]), Isa::Load(y + (i + 1) * y_stride + column),
                     odd);
    }
    if (i < k) {
      even = Isa::Fma(Isa::Set1(x[i * x_stride]), Isa::Load(y + i * y_stride + column), even);
    }
    Isa::Store(z + column, Isa::Add(even, odd));
  }
  for (; column < n; ++column) {
    float total = 0;
    for (int64_t i = 0; i < k; ++i) total += x[i * x_stride] * y[i * y_stride + column];
    z[column] = total;
  }
}

// Each dot product over whole vectors of k, then the rest of k one at a time.
template <typename Isa>
void RowDots(const float* x, const float* y, int64_t y_stride, int64_t k, float* z, int64_t n) {
  using V = typename Isa::V;
  constexpr int64_t kWidth = Isa::kWidth;
  const int64_t whole = k / kWidth * kWidth;
  for (int64_t column = 0; column < n; ++column) {
    const float* right = y + column * y_stride;
    float total = 0;
    if (whole > 0) {
      V sum = Isa::Mul(Isa::Load(x), Isa::Load(right));
      for (int64_t i = kWidth; i < whole; i += kWidth) {
        sum = Isa::Fma(Isa::Load(x + i), Isa::Load(right + i), sum);
      }
      total = Isa::ReduceAdd(sum);
    }
    for (int64_t i = whole; i < k; ++i) total += x[i] * right[i];
    z[column] = total;
  }
}

template <typename Isa>
VectorKernels Table() {
  return {Unary<Isa>,     Softmax<Isa>,        LogSoftmax<Isa>,
          Normalize<Isa>, RowCombination<Isa>, RowDots<Isa>};
}

}  // namespace orochi::engine::cpu::vector
