// The AVX512-BF16 kernel for bf16 panels: one vdpbf16ps per 16 columns and k pair, twice
// the multiply-adds of an FMA, on activations rounded to bf16 pairs
// (Bf16Activations::kPairs). The FMA kernels of the other levels reproduce its rounding
// (gemm_kernels.h). Compiled with -mavx512f -mavx512bw -mavx512bf16 -ffp-contract=off;
// called only on the avx512_bf16 level (its kernel set, cpu_kernels.h, and the check
// and timing of bf16_arithmetic.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // GCC bug 105593, as in gemm_avx512.cc.
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx512_tile.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

// Step j: pair j of every row (a dword of x, broadcast) against pair j of 32 columns.
struct Bf16DotPanel {
  const uint16_t* panel;
  static int Steps(int k) { return k / 2; }
  template <int kRows>
  void Step(int j, const float* x, int ldx, __m512 (&acc)[kRows][2]) const {
    const uint16_t* pair = panel + j * 2 * kGemmPanelWidth;
    const __m512bh b0 = reinterpret_cast<__m512bh>(_mm512_load_si512(pair));
    const __m512bh b1 = reinterpret_cast<__m512bh>(_mm512_load_si512(pair + 32));
#pragma GCC unroll 12
    for (int r = 0; r < kRows; ++r) {
      // The pair's 32 bits, broadcast as they are (a float broadcast moves bits only).
      const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_ps(x[r * ldx + j]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], a, b0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], a, b1);
    }
  }
};

}  // namespace

void RoundBf16PairsAvx512Bf16(const float* x, int ldx, int m, int k, void* out) {
  const int padded = Bf16PaddedK(k);
  for (int r = 0; r < m; ++r) {
    const float* row = x + static_cast<size_t>(r) * ldx;
    auto* dst = static_cast<uint16_t*>(out) + static_cast<size_t>(r) * padded;
    for (int i = 0; i < padded; i += 32) {
      const int left = k - i;  // Lanes past k (the pad, and past the row) load as zero.
      const auto lanes = [](int n) {
        return n >= 16 ? static_cast<__mmask16>(0xFFFF)
                       : static_cast<__mmask16>(n <= 0 ? 0 : (1u << n) - 1);
      };
      const __m512 lo = _mm512_maskz_loadu_ps(lanes(left), row + i);
      const __m512 hi = _mm512_maskz_loadu_ps(lanes(left - 16), row + i + 16);
      const __m512i both = reinterpret_cast<__m512i>(_mm512_cvtne2ps_pbh(hi, lo));
      const int store = padded - i;  // Elements of the row's padded width from i on.
      _mm512_mask_storeu_epi16(dst + i, store >= 32 ? ~__mmask32{0} : (__mmask32{1} << store) - 1,
                               both);
    }
  }
}

void GemmPanelBf16Avx512Bf16(const float* x, int ldx, int m, const void* panel, const float*, int k,
                             const float* bias, float* y, int ldy, int cols, const void* prefetch,
                             int prefetch_lines) {
  // vdpbf16ps ignores MXCSR; the bias sum after the chain does not.
  WithDenormalsFlushed([&] {
    Dispatch(x, ldx, m, Bf16DotPanel{static_cast<const uint16_t*>(panel)}, nullptr, k, bias, y, ldy,
             cols, prefetch, prefetch_lines);
  });
}

void GemmPanelPairBf16Avx512Bf16(const float* x, int, int, const void* panel, const float*, int k,
                                 const float* bias, float* y, int, int cols, const void* prefetch,
                                 int prefetch_lines) {
  WithDenormalsFlushed([&] {
    PanelPairTile<Bf16DotPanel, uint16_t>(x, panel, nullptr, k, bias, y, cols, prefetch,
                                          prefetch_lines);
  });
}

}  // namespace conveyor::kernels::internal
