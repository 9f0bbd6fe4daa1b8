// AVX-512 micro-kernels: up to 12 rows × 32 columns of accumulators in registers, for
// float32, bfloat16 and int8 panels. The narrow types are widened to float32 as they are
// loaded (bf16: a 16-bit shift, exact; int8: an integer-to-float conversion, exact), so
// all three run the same FMA chain. Compiled with -mavx512f -mfma -ffp-contract=off;
// called only when the CPU reports AVX-512F.
// GCC 12 reports the intrinsics' own _mm512_undefined_ps() placeholders as maybe
// uninitialized (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

// Loads the 32 weights of step i of a panel as two registers of 16 floats.
struct F32Panel {
  const float* panel;
  void Load(int i, __m512* b0, __m512* b1) const {
    *b0 = _mm512_load_ps(panel + i * kGemmPanelWidth);
    *b1 = _mm512_load_ps(panel + i * kGemmPanelWidth + 16);
  }
};

struct Bf16Panel {
  const uint16_t* panel;
  void Load(int i, __m512* b0, __m512* b1) const {
    const __m512i raw = _mm512_load_si512(panel + i * kGemmPanelWidth);
    const __m512i lo = _mm512_cvtepu16_epi32(_mm512_castsi512_si256(raw));
    const __m512i hi = _mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(raw, 1));
    *b0 = _mm512_castsi512_ps(_mm512_slli_epi32(lo, 16));
    *b1 = _mm512_castsi512_ps(_mm512_slli_epi32(hi, 16));
  }
};

struct Int8Panel {
  const int8_t* panel;
  void Load(int i, __m512* b0, __m512* b1) const {
    const __m256i raw =
        _mm256_load_si256(reinterpret_cast<const __m256i*>(panel + i * kGemmPanelWidth));
    *b0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_castsi256_si128(raw)));
    *b1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm256_extracti128_si256(raw, 1)));
  }
};

template <int kRows, typename Panel>
void Kernel(const float* x, int ldx, Panel panel, const float* scales, int k, const float* bias,
            float* y, int ldy, int cols, const void* prefetch, int prefetch_lines) {
  __m512 acc[kRows][2];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }
  auto step = [&](int i) {
    __m512 b0, b1;
    panel.Load(i, &b0, &b1);
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
    const char* line = static_cast<const char*>(prefetch);
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
  __m512 scale0 = _mm512_set1_ps(1.0f), scale1 = _mm512_set1_ps(1.0f);
  if (scales != nullptr) {
    scale0 = _mm512_loadu_ps(scales);  // Panels' scales are padded to 32.
    scale1 = _mm512_loadu_ps(scales + 16);
  }
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    float* out = y + static_cast<long>(r) * ldy;
    // Scale and bias come after the chain, so they never change the reduction order.
    if (scales != nullptr) {
      acc[r][0] = _mm512_mul_ps(acc[r][0], scale0);
      acc[r][1] = _mm512_mul_ps(acc[r][1], scale1);
    }
    if (bias != nullptr) {
      acc[r][0] = _mm512_add_ps(acc[r][0], bias0);
      acc[r][1] = _mm512_add_ps(acc[r][1], bias1);
    }
    _mm512_mask_storeu_ps(out, m0, acc[r][0]);
    _mm512_mask_storeu_ps(out + 16, m1, acc[r][1]);
  }
}

template <typename Panel>
void Dispatch(const float* x, int ldx, int m, Panel panel, const float* scales, int k,
              const float* bias, float* y, int ldy, int cols, const void* prefetch,
              int prefetch_lines) {
  switch (m) {
#define CONVEYOR_GEMM_ROWS(R) \
  case R:                     \
    return Kernel<R>(x, ldx, panel, scales, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    CONVEYOR_GEMM_ROWS(1)
    CONVEYOR_GEMM_ROWS(2)
    CONVEYOR_GEMM_ROWS(3)
    CONVEYOR_GEMM_ROWS(4)
    CONVEYOR_GEMM_ROWS(5)
    CONVEYOR_GEMM_ROWS(6)
    CONVEYOR_GEMM_ROWS(7)
    CONVEYOR_GEMM_ROWS(8)
    CONVEYOR_GEMM_ROWS(9)
    CONVEYOR_GEMM_ROWS(10)
    CONVEYOR_GEMM_ROWS(11)
    CONVEYOR_GEMM_ROWS(12)
#undef CONVEYOR_GEMM_ROWS
    default:
      return;
  }
}

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
  Dispatch(x, ldx, m, Bf16Panel{static_cast<const uint16_t*>(panel)}, nullptr, k, bias, y, ldy,
           cols, prefetch, prefetch_lines);
}

void GemmPanelInt8Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                         int k, const float* bias, float* y, int ldy, int cols,
                         const void* prefetch, int prefetch_lines) {
  Dispatch(x, ldx, m, Int8Panel{static_cast<const int8_t*>(panel)}, scales, k, bias, y, ldy, cols,
           prefetch, prefetch_lines);
}

}  // namespace conveyor::kernels::internal
