// AVX-512 row kernels (row_kernels.h). Compiled with -mavx512f -mfma -ffp-contract=off;
// used only when the CPU reports AVX-512F. A row's tail is handled with masked loads and
// stores, so any length works and a lane's arithmetic never depends on its neighbours.
#include "kernels/cpu/exp_avx512.h"
#include "kernels/cpu/row_kernels.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 16;
static_assert(kRmsLanes == kLanes, "RMSNorm's lanes are one register of 16 floats");

// Mask of the first min(remaining, 16) lanes.
__mmask16 FirstLanes(int remaining) {
  return remaining >= kLanes ? static_cast<__mmask16>(0xFFFF)
                             : static_cast<__mmask16>((1u << remaining) - 1);
}

// Adds the squares of x's 16 floats, in float64, to lanes 0-7 (lo) and 8-15 (hi).
// x² is exact in float64, so the FMA rounds once, as the portable x·x + lane does.
void AccumulateSquares(__m512 x, __m512d* lo, __m512d* hi) {
  const __m512d a = _mm512_cvtps_pd(_mm512_castps512_ps256(x));
  const __m512d b =
      _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1)));
  *lo = _mm512_fmadd_pd(a, a, *lo);
  *hi = _mm512_fmadd_pd(b, b, *hi);
}

float InverseRmsFrom(__m512d lo, __m512d hi, int hidden, float eps) {
  double lanes[kRmsLanes];
  _mm512_storeu_pd(lanes, lo);
  _mm512_storeu_pd(lanes + 8, hi);
  return InverseRmsFromLanes(lanes, hidden, eps);
}

// out = x · inv · weight, rounding after each product as the portable kernel does.
void Scale(const float* x, float inv, const float* weight, int hidden, float* out) {
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int i = 0; i < hidden; i += kLanes) {
    const __mmask16 m = FirstLanes(hidden - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vinv);
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

void RmsNorm(const float* x, const float* weight, int hidden, float eps, float* out) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  // Masked-off lanes load 0 and add 0·0, which leaves a lane's sum unchanged.
  for (int i = 0; i < hidden; i += kLanes) {
    AccumulateSquares(_mm512_maskz_loadu_ps(FirstLanes(hidden - i), x + i), &lo, &hi);
  }
  Scale(x, InverseRmsFrom(lo, hi, hidden, eps), weight, hidden, out);
}

void AddRmsNorm(float* residual, const float* x, const float* weight, int hidden, float eps,
                float* out) {
  __m512d lo = _mm512_setzero_pd(), hi = _mm512_setzero_pd();
  // One pass adds and sums the squares; the second (Scale) reads the row back from L1.
  for (int i = 0; i < hidden; i += kLanes) {
    const __mmask16 m = FirstLanes(hidden - i);
    const __m512 r =
        _mm512_add_ps(_mm512_maskz_loadu_ps(m, residual + i), _mm512_maskz_loadu_ps(m, x + i));
    _mm512_mask_storeu_ps(residual + i, m, r);
    AccumulateSquares(r, &lo, &hi);
  }
  Scale(residual, InverseRmsFrom(lo, hi, hidden, eps), weight, hidden, out);
}

void Rope(float* heads, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; i += kLanes) {
    const __mmask16 m = FirstLanes(half - i);
    const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
    const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
    for (int h = 0; h < num_heads; ++h) {
      float* lo = heads + static_cast<long>(h) * head_dim + i;
      float* hi = lo + half;
      const __m512 x1 = _mm512_maskz_loadu_ps(m, lo);
      const __m512 x2 = _mm512_maskz_loadu_ps(m, hi);
      _mm512_mask_storeu_ps(lo, m, _mm512_sub_ps(_mm512_mul_ps(x1, c), _mm512_mul_ps(x2, s)));
      _mm512_mask_storeu_ps(hi, m, _mm512_add_ps(_mm512_mul_ps(x2, c), _mm512_mul_ps(x1, s)));
    }
  }
}

// silu(g) = g·σ(g), with σ from e = exp(-|g|) <= 1 so nothing overflows:
// σ(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0.
void SiluMul(const float* gate, const float* up, int n, float* out) {
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int i = 0; i < n; i += kLanes) {
    const __mmask16 m = FirstLanes(n - i);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + i);
    const __m512 minus_abs = _mm512_castsi512_ps(_mm512_or_si512(_mm512_castps_si512(g), sign));
    const __m512 e = ExpAvx512(minus_abs);
    const __mmask16 negative = _mm512_cmp_ps_mask(g, _mm512_setzero_ps(), _CMP_LT_OQ);
    const __m512 numerator = _mm512_mask_mul_ps(g, negative, g, e);
    const __m512 silu = _mm512_div_ps(numerator, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

}  // namespace

const RowKernels kAvx512RowKernels = {"avx512", RmsNorm, AddRmsNorm, Rope, SiluMul};

}  // namespace conveyor::kernels::internal
