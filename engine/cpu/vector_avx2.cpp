// The vectorised kernels for AVX2 with FMA (8 floats), built with -mavx2 -mfma for this file
// only: the engine runs them only on CPUs that have both (vector_math.cpp).
#include <immintrin.h>
#include <sleef.h>

#include "vector_kernels.h"

namespace orochi::engine::cpu {
namespace {

struct Avx2 {
  using V = __m256;
  static constexpr int64_t kWidth = 8;
  static V Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V Set1(float value) { return _mm256_set1_ps(value); }
  static V Add(V a, V b) { return _mm256_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm256_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V Max(V a, V b) { return _mm256_max_ps(a, b); }
  static V Abs(V v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0F), v); }
  static V SelectNegative(V x, V if_negative, V otherwise) {
    return _mm256_blendv_ps(otherwise, if_negative,
                            _mm256_cmp_ps(x, _mm256_setzero_ps(), _CMP_LT_OQ));
  }
  static float ReduceAdd(V v) {
    __m128 sum = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    sum = _mm_add_ps(sum, _mm_movehl_ps(sum, sum));
    sum = _mm_add_ss(sum, _mm_movehdup_ps(sum));
    return _mm_cvtss_f32(sum);
  }
  static float ReduceMax(V v) {
    __m128 high = _mm_max_ps(_mm256_extractf128_ps(v, 1), _mm256_castps256_ps128(v));
    high = _mm_max_ps(_mm_movehl_ps(high, high), high);
    high = _mm_max_ss(_mm_movehdup_ps(high), high);
    return _mm_cvtss_f32(high);
  }
  static V Exp(V v) { return Sleef_expf8_u10avx2(v); }
  static V Log(V v) { return Sleef_logf8_u10avx2(v); }
  static V Tanh(V v) { return Sleef_tanhf8_u10avx2(v); }
  static V Erf(V v) { return Sleef_erff8_u10avx2(v); }
  static V Sin(V v) { return Sleef_sinf8_u10avx2(v); }
  static V Cos(V v) { return Sleef_cosf8_u10avx2(v); }
};

}  // namespace

const VectorKernels& Avx2Kernels() {
  static const VectorKernels kernels = vector::Table<Avx2>();
  return kernels;
}

}  // namespace orochi::engine::cpu
