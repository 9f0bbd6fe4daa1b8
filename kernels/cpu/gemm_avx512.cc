// AVX-512 micro-kernel: up to 12 rows × 32 columns of accumulators in registers.
// Compiled with -mavx512f -mfma; called only when the CPU reports AVX-512F.
#include <immintrin.h>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

template <int kRows>
void Kernel(const float* x, int ldx, const float* panel, int k, const float* bias, float* y,
            int ldy, int cols, const float* prefetch, int prefetch_lines) {
  __m512 acc[kRows][2];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }
  auto step = [&](int i) {
    const __m512 b0 = _mm512_load_ps(panel + i * kGemmPanelWidth);
    const __m512 b1 = _mm512_load_ps(panel + i * kGemmPanelWidth + 16);
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      const __m512 a = _mm512_set1_ps(x[r * ldx + i]);
      acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
    }
  };
  if (prefetch_lines == 0) {
    for (int i = 0; i < k; ++i) step(i);
  } else {
    // The prefetches are spread evenly over the k loop (prefetch_lines / k per step), so
    // they trickle out while the FMAs run instead of queuing up at once.
    const char* line = reinterpret_cast<const char*>(prefetch);
    int credit = 0;
    for (int i = 0; i < k; ++i) {
      credit += prefetch_lines;
      for (; credit >= k; credit -= k, line += 64) _mm_prefetch(line, _MM_HINT_T1);
      step(i);
    }
  }
  const __mmask16 m0 = cols >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << cols) - 1);
  const __mmask16 m1 =
      cols >= 32 ? 0xFFFF : (cols <= 16 ? 0 : static_cast<__mmask16>((1u << (cols - 16)) - 1));
  __m512 bias0 = _mm512_setzero_ps(), bias1 = _mm512_setzero_ps();
  if (bias != nullptr) {
    bias0 = _mm512_maskz_loadu_ps(m0, bias);
    bias1 = _mm512_maskz_loadu_ps(m1, bias + 16);
  }
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    float* out = y + static_cast<long>(r) * ldy;
    // The bias is added after the chain, so it never changes the reduction order.
    if (bias != nullptr) {
      acc[r][0] = _mm512_add_ps(acc[r][0], bias0);
      acc[r][1] = _mm512_add_ps(acc[r][1], bias1);
    }
    _mm512_mask_storeu_ps(out, m0, acc[r][0]);
    _mm512_mask_storeu_ps(out + 16, m1, acc[r][1]);
  }
}

}  // namespace

void GemmPanelAvx512(const float* x, int ldx, int m, const float* panel, int k, const float* bias,
                     float* y, int ldy, int cols, const float* prefetch, int prefetch_lines) {
  switch (m) {
    case 1:
      return Kernel<1>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 2:
      return Kernel<2>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 3:
      return Kernel<3>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 4:
      return Kernel<4>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 5:
      return Kernel<5>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 6:
      return Kernel<6>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 7:
      return Kernel<7>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 8:
      return Kernel<8>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 9:
      return Kernel<9>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 10:
      return Kernel<10>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 11:
      return Kernel<11>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    case 12:
      return Kernel<12>(x, ldx, panel, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    default:
      return;
  }
}

}  // namespace conveyor::kernels::internal
