// AVX2+FMA row kernels (row_kernels.h). Compiled with -mavx2 -mfma -ffp-contract=off; used
// only where the CPU reports them (the avx2 level's kernel set, cpu_kernels.h). The same
// rounding steps as the portable and AVX-512 sets: RMSNorm and RoPE give all three sets'
// bits, SiLU the AVX-512 set's (its exp is ExpAvx512's, lane for lane). A row's tail is
// handled with masked loads and stores, so a lane's arithmetic never depends on its
// neighbours.
#include "kernels/cpu/exp_avx2.h"
#include "kernels/cpu/row_kernels.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 8;
static_assert(kRmsLanes == 2 * kLanes, "RMSNorm's 16 lanes are two blocks of 8 floats");

// Mask of the first min(max(remaining, 0), 8) lanes.
__m256i FirstLanes(int remaining) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(remaining),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// RMSNorm's 16 float64 lanes, 4 per register: element i goes to lane i % 16.
struct SquareLanes {
  __m256d lane[4] = {_mm256_setzero_pd(), _mm256_setzero_pd(), _mm256_setzero_pd(),
                     _mm256_setzero_pd()};

  // Adds the squares of 8 floats that are elements [8·half, 8·half + 8) of a 16-block.
  // x² is exact in float64, so the FMA rounds once, as the portable x·x + lane does.
  void Add(__m256 x, int half) {
    const __m256d a = _mm256_cvtps_pd(_mm256_castps256_ps128(x));
    const __m256d b = _mm256_cvtps_pd(_mm256_extractf128_ps(x, 1));
    lane[2 * half] = _mm256_fmadd_pd(a, a, lane[2 * half]);
    lane[2 * half + 1] = _mm256_fmadd_pd(b, b, lane[2 * half + 1]);
  }

  float InverseRms(int hidden, float eps) const {
    double lanes[kRmsLanes];
    for (int i = 0; i < 4; ++i) _mm256_storeu_pd(lanes + 4 * i, lane[i]);
    return InverseRmsFromLanes(lanes, hidden, eps);
  }
};

// out = x · inv · weight, rounding after each product as the portable kernel does.
void Scale(const float* x, float inv, const float* weight, int hidden, float* out) {
  const __m256 vinv = _mm256_set1_ps(inv);
  for (int i = 0; i < hidden; i += kLanes) {
    const __m256i m = FirstLanes(hidden - i);
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), vinv);
    _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(weight + i, m)));
  }
}

void RmsNorm(const float* x, const float* weight, int hidden, float eps, float* out) {
  SquareLanes sums;
  // Masked-off lanes load 0 and add 0·0, which leaves a lane's sum unchanged.
  for (int i = 0; i < hidden; i += kLanes) {
    sums.Add(_mm256_maskload_ps(x + i, FirstLanes(hidden - i)), (i / kLanes) % 2);
  }
  Scale(x, sums.InverseRms(hidden, eps), weight, hidden, out);
}

void AddRmsNorm(float* residual, const float* x, const float* weight, int hidden, float eps,
                float* out) {
  SquareLanes sums;
  for (int i = 0; i < hidden; i += kLanes) {
    const __m256i m = FirstLanes(hidden - i);
    const __m256 r =
        _mm256_add_ps(_mm256_maskload_ps(residual + i, m), _mm256_maskload_ps(x + i, m));
    _mm256_maskstore_ps(residual + i, m, r);
    sums.Add(r, (i / kLanes) % 2);
  }
  Scale(residual, sums.InverseRms(hidden, eps), weight, hidden, out);
}

void Rope(float* heads, int num_heads, int head_dim, const float* cos, const float* sin) {
  const int half = head_dim / 2;
  for (int i = 0; i < half; i += kLanes) {
    const __m256i m = FirstLanes(half - i);
    const __m256 c = _mm256_maskload_ps(cos + i, m);
    const __m256 s = _mm256_maskload_ps(sin + i, m);
    for (int h = 0; h < num_heads; ++h) {
      float* lo = heads + static_cast<long>(h) * head_dim + i;
      float* hi = lo + half;
      const __m256 x1 = _mm256_maskload_ps(lo, m);
      const __m256 x2 = _mm256_maskload_ps(hi, m);
      _mm256_maskstore_ps(lo, m, _mm256_sub_ps(_mm256_mul_ps(x1, c), _mm256_mul_ps(x2, s)));
      _mm256_maskstore_ps(hi, m, _mm256_add_ps(_mm256_mul_ps(x2, c), _mm256_mul_ps(x1, s)));
    }
  }
}

// silu(g) = g·σ(g), with σ from e = exp(-|g|) <= 1 so nothing overflows:
// σ(g) = 1 / (1 + e) for g >= 0 and e / (1 + e) for g < 0 (as the AVX-512 set).
void SiluMul(const float* gate, const float* up, int n, float* out) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  const __m256 one = _mm256_set1_ps(1.0f);
  for (int i = 0; i < n; i += kLanes) {
    const __m256i m = FirstLanes(n - i);
    const __m256 g = _mm256_maskload_ps(gate + i, m);
    const __m256 e = ExpAvx2(_mm256_or_ps(g, sign));
    const __m256 negative = _mm256_cmp_ps(g, _mm256_setzero_ps(), _CMP_LT_OQ);
    const __m256 numerator = _mm256_blendv_ps(g, _mm256_mul_ps(g, e), negative);
    const __m256 silu = _mm256_div_ps(numerator, _mm256_add_ps(one, e));
    _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(silu, _mm256_maskload_ps(up + i, m)));
  }
}

}  // namespace

const RowKernels kAvx2RowKernels = {"avx2", RmsNorm, AddRmsNorm, Rope, SiluMul};

}  // namespace conveyor::kernels::internal
