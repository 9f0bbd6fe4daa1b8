// AVX-512 micro-kernels: up to 12 rows × 32 columns of accumulators in registers, for
// float32, bfloat16 and int8 panels, all float32 FMA chains. int8 is widened as it is
// loaded (an integer-to-float conversion, exact); bf16 reproduces vdpbf16ps (the widening
// of a pair's halves is exact, the flushing is MXCSR's, gemm_kernels.h). Compiled with
// -mavx512f -mfma -ffp-contract=off; called only when the CPU reports AVX-512F.
// GCC 12 reports the intrinsics' own _mm512_undefined_ps() placeholders as maybe
// uninitialized (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_avx512_tile.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

struct F32Panel {
  const float* panel;
  static int Steps(int k) { return k; }
  template <int kRows>
  void Step(int i, const float* x, int ldx, __m512 (&acc)[kRows][2]) const {
    FmaRows<kRows>(x, ldx, i, _mm512_load_ps(panel + i * kGemmPanelWidth),
                   _mm512_load_ps(panel + i * kGemmPanelWidth + 16), acc);
  }
};

// Step j is pair j: first k = 2j + 1 (the dwords' high halves, with x[2j], since x is in
// chain order), then k = 2j (the low halves, with x[2j + 1]).
struct Bf16Panel {
  const uint16_t* panel;
  static int Steps(int k) { return k / 2; }
  template <int kRows>
  void Step(int j, const float* x, int ldx, __m512 (&acc)[kRows][2]) const {
    const uint16_t* pair = panel + j * 2 * kGemmPanelWidth;
    const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
    const __m512i raw0 = _mm512_load_si512(pair);
    const __m512i raw1 = _mm512_load_si512(pair + 32);
    FmaRows<kRows>(x, ldx, 2 * j, _mm512_castsi512_ps(_mm512_and_si512(raw0, high)),
                   _mm512_castsi512_ps(_mm512_and_si512(raw1, high)), acc);
    FmaRows<kRows>(x, ldx, 2 * j + 1, _mm512_castsi512_ps(_mm512_slli_epi32(raw0, 16)),
                   _mm512_castsi512_ps(_mm512_slli_epi32(raw1, 16)), acc);
  }
};

struct Int8Panel {
  const int8_t* panel;
  static int Steps(int k) { return k; }
  template <int kRows>
  void Step(int i, const float* x, int ldx, __m512 (&acc)[kRows][2]) const {
    // Each 16-byte half sign-extended straight from memory (no extract from a 32-byte load).
    const auto* step = reinterpret_cast<const __m128i*>(panel + i * kGemmPanelWidth);
    FmaRows<kRows>(x, ldx, i, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(step))),
                   _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_load_si128(step + 1))), acc);
  }
};

}  // namespace

void GemmPanelAvx512(const float* x, int ldx, int m, const void* panel, const float*, int k,
                     const float* bias, float* y, int ldy, int cols, const void* prefetch,
                     int prefetch_lines) {
  Dispatch(x, ldx, m, F32Panel{static_cast<const float*>(panel)}, nullptr, k, bias, y, ldy, cols,
           prefetch, prefetch_lines);
}

void GemmPanelBf16Avx512(const float* x, int ldx, int m, const void* panel, const float*, int k,
                         const float* bias, float* y, int ldy, int cols, const void* prefetch,
                         int prefetch_lines) {
  WithDenormalsFlushed([&] {
    Dispatch(x, ldx, m, Bf16Panel{static_cast<const uint16_t*>(panel)}, nullptr, k, bias, y, ldy,
             cols, prefetch, prefetch_lines);
  });
}

void GemmPanelInt8Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                         int k, const float* bias, float* y, int ldy, int cols,
                         const void* prefetch, int prefetch_lines) {
  Dispatch(x, ldx, m, Int8Panel{static_cast<const int8_t*>(panel)}, scales, k, bias, y, ldy, cols,
           prefetch, prefetch_lines);
}

// One row against two adjacent panels (gemm_kernels.h): four chains at once.
void GemmPanelPairAvx512(const float* x, int, int, const void* panel, const float*, int k,
                         const float* bias, float* y, int, int cols, const void* prefetch,
                         int prefetch_lines) {
  PanelPairTile<F32Panel, float>(x, panel, nullptr, k, bias, y, cols, prefetch, prefetch_lines);
}

void GemmPanelPairBf16Avx512(const float* x, int, int, const void* panel, const float*, int k,
                             const float* bias, float* y, int, int cols, const void* prefetch,
                             int prefetch_lines) {
  WithDenormalsFlushed([&] {
    PanelPairTile<Bf16Panel, uint16_t>(x, panel, nullptr, k, bias, y, cols, prefetch,
                                       prefetch_lines);
  });
}

void GemmPanelPairInt8Avx512(const float* x, int, int, const void* panel, const float* scales,
                             int k, const float* bias, float* y, int, int cols,
                             const void* prefetch, int prefetch_lines) {
  PanelPairTile<Int8Panel, int8_t>(x, panel, scales, k, bias, y, cols, prefetch, prefetch_lines);
}

}  // namespace conveyor::kernels::internal
