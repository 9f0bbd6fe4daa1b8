// exp(x) on 16 floats with AVX-512F, shared by the AVX-512 kernels (attention, SiLU).
//
// Include only from files compiled with -mavx512f -mfma -ffp-contract=off: the function
// is inline, so every file that includes it must compile it to the same instructions.
#pragma once

// GCC 12 reports the intrinsics' own _mm512_undefined_ps() placeholders as maybe
// uninitialized (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace conveyor::kernels::internal {

// exp(x) to ~1 ulp for x <= 0 (Cephes expf's range reduction and polynomial); values
// below -104 give 0, as their true value is under half the smallest denormal.
inline __m512 ExpAvx512(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-104.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // x - n·ln2 in two steps (ln2 = 0.693359375 - 2.12194440e-4 + ...): the first product
  // is exact, which keeps r accurate.
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 poly = _mm512_set1_ps(1.9875691500e-4f);
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.3981999507e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(8.3334519073e-3f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(4.1665795894e-2f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(1.6666665459e-1f));
  poly = _mm512_fmadd_ps(poly, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 y =
      _mm512_add_ps(_mm512_fmadd_ps(poly, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
  // scalef multiplies by 2^n with correct underflow to denormals and zero.
  return _mm512_scalef_ps(y, n);
}

}  // namespace conveyor::kernels::internal
