// The vectorised kernels for AVX-512F (16 floats), built with -mavx512f for this file only: the
// engine runs them only on CPUs and OSes that support it (vector_math.cpp).
#include <immintrin.h>
#include <sleef.h>

#include "vector_kernels.h"

namespace orochi::engine::cpu {
namespace {

struct Avx512 {
  using V = __m512;
  static constexpr int64_t kWidth = 16;
  static V Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V Set1(float value) { return _mm512_set1_ps(value); }
  static V Add(V a, V b) { return _mm512_add_ps(a, b); }
  static V Sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V Mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V Div(V a, V b) { return _mm512_div_ps(a, b); }
  static V Fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  // Masked with every lane on: GCC 12's _mm512_max_ps warns of an uninitialised value.
  static V Max(V a, V b) { return _mm512_mask_max_ps(b, 0xFFFF, a, b); }
  static V Abs(V v) { return _mm512_abs_ps(v); }
  static V SelectNegative(V x, V if_negative, V otherwise) {
    return _mm512_mask_blend_ps(_mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_LT_OQ), otherwise,
                                if_negative);
  }
  // Through memory, once per row: GCC 12's _mm512_reduce_*_ps and _mm512_extractf64x4_pd warn of
  // an uninitialised value.
  static float ReduceAdd(V v) {
    return Reduce(
        v, [](__m256 a, __m256 b) { return _mm256_add_ps(a, b); },
        [](__m128 a, __m128 b) { return _mm_add_ps(a, b); });
  }
  static float ReduceMax(V v) {
    return Reduce(
        v, [](__m256 a, __m256 b) { return _mm256_max_ps(a, b); },
        [](__m128 a, __m128 b) { return _mm_max_ps(a, b); });
  }
  template <typename F256, typename F128>
  static float Reduce(V v, F256 f256, F128 f128) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, v);
    const __m256 half = f256(_mm256_load_ps(lanes), _mm256_load_ps(lanes + 8));
    __m128 quarter = f128(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
    quarter = f128(quarter, _mm_movehl_ps(quarter, quarter));
    return _mm_cvtss_f32(f128(quarter, _mm_movehdup_ps(quarter)));
  }
  static V Exp(V v) { return Sleef_expf16_u10avx512f(v); }
  static V Log(V v) { return Sleef_logf16_u10avx512f(v); }
  static V Tanh(V v) { return Sleef_tanhf16_u10avx512f(v); }
  static V Erf(V v) { return Sleef_erff16_u10avx512f(v); }
  static V Sin(V v) { return Sleef_sinf16_u10avx512f(v); }
  static V Cos(V v) { return Sleef_cosf16_u10avx512f(v); }
};

}  // namespace

const VectorKernels& Avx512Kernels() {
  static const VectorKernels kernels = vector::Table<Avx512>();
  return kernels;
}

}  // namespace orochi::engine::cpu
