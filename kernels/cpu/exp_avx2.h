// exp(x) on 8 floats with AVX2+FMA, shared by the AVX2 kernels (attention, SiLU): the
// same operations as ExpAvx512 (exp_avx512.h) lane for lane, so the two give the same
// bits for every x <= 88 (the kernels only ever pass x <= 0).
//
// Include only from files compiled with -mavx2 -mfma -ffp-contract=off: the function is
// inline, so every file that includes it must compile it to the same instructions.
#pragma once

#include <immintrin.h>

namespace conveyor::kernels::internal {

inline __m256 ExpAvx2(__m256 x) {
  // max returns its second operand for a NaN x, as _mm512_max_ps does.
  x = _mm256_max_ps(x, _mm256_set1_ps(-104.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 poly = _mm256_set1_ps(1.9875691500e-4f);
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.3981999507e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(8.3334519073e-3f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(4.1665795894e-2f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(1.6666665459e-1f));
  poly = _mm256_fmadd_ps(poly, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 y =
      _mm256_add_ps(_mm256_fmadd_ps(poly, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
  // y · 2^n with one rounding, as scalef: 2^n as 2^h · 2^(n-h) with h = floor(n/2), both
  // normal for n in [-150, 128]; y · 2^h is exact (y is near 1), so only the second
  // product rounds (to a denormal or zero where the true value is one).
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, bias), 23));
  const __m256 p2 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(y, p1), p2);
}

}  // namespace conveyor::kernels::internal
