// The AVX-512 panel tile (up to 12 rows × 32 columns of accumulators in registers) that
// gemm_avx512.cc and gemm_avx512_bf16.cc both run, each with its own Panel types, each
// compiled with its own instruction flags: so this header's templates live in an
// anonymous namespace, one copy per file. Include <immintrin.h> before it.
//
// A Panel says how many steps a k of its panel takes (Steps) and adds one step to every
// row's two accumulators (Step<kRows>); the tile owns the loop, the prefetch hint, and the
// int8 scale, bias and masked stores after the chain.
#pragma once

#include "kernels/cpu/gemm.h"

namespace conveyor::kernels::internal {
namespace {

// acc[r] += broadcast(x[r][i]) · (b0, b1) for every row: the float32 step.
template <int kRows>
inline void FmaRows(const float* x, int ldx, int i, __m512 b0, __m512 b1, __m512 (&acc)[kRows][2]) {
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    const __m512 a = _mm512_set1_ps(x[r * ldx + i]);
    acc[r][0] = _mm512_fmadd_ps(a, b0, acc[r][0]);
    acc[r][1] = _mm512_fmadd_ps(a, b1, acc[r][1]);
  }
}

// The epilogue of a tile: each row's chain times the int8 scales (if any), plus the bias
// (if any), stored to the first `cols` columns (none if cols <= 0).
template <int kRows>
inline void StoreRows(__m512 (&acc)[kRows][2], const float* scales, const float* bias, float* y,
                      int ldy, int cols) {
  if (cols <= 0) return;
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

template <int kRows, typename Panel>
void Tile(const float* x, int ldx, Panel panel, const float* scales, int k, const float* bias,
          float* y, int ldy, int cols, const void* prefetch, int prefetch_lines) {
  __m512 acc[kRows][2];
#pragma GCC unroll 12
  for (int r = 0; r < kRows; ++r) {
    acc[r][0] = _mm512_setzero_ps();
    acc[r][1] = _mm512_setzero_ps();
  }
  const int steps = Panel::Steps(k);
  if (prefetch_lines == 0) {
    for (int i = 0; i < steps; ++i) panel.template Step<kRows>(i, x, ldx, acc);
  } else {
    // The prefetches are spread evenly over the loop (prefetch_lines / steps per step), so
    // they trickle out while the arithmetic runs instead of queuing up at once.
    const char* line = static_cast<const char*>(prefetch);
    int credit = 0;
    for (int i = 0; i < steps; ++i) {
      credit += prefetch_lines;
      for (; credit >= steps; credit -= steps, line += 64) _mm_prefetch(line, _MM_HINT_T1);
      panel.template Step<kRows>(i, x, ldx, acc);
    }
  }
  StoreRows<kRows>(acc, scales, bias, y, ldy, cols);
}

// One row against two adjacent panels (`cols` <= 64 from the first's column 0; scales
// and bias cover both): four chains at once instead of two, which keeps the arithmetic
// units busy while a decode step streams the weights. Each panel's chains are the same
// as in a one-panel call.
template <typename Panel>
void PairTile(const float* x, Panel first, Panel second, const float* scales, int k,
              const float* bias, float* y, int cols, const void* prefetch, int prefetch_lines) {
  __m512 acc0[1][2] = {{_mm512_setzero_ps(), _mm512_setzero_ps()}};
  __m512 acc1[1][2] = {{_mm512_setzero_ps(), _mm512_setzero_ps()}};
  const int steps = Panel::Steps(k);
  const char* line = static_cast<const char*>(prefetch);
  int credit = 0;
  for (int i = 0; i < steps; ++i) {
    credit += prefetch_lines;
    for (; credit >= steps; credit -= steps, line += 64) _mm_prefetch(line, _MM_HINT_T1);
    first.template Step<1>(i, x, 0, acc0);
    second.template Step<1>(i, x, 0, acc1);
  }
  StoreRows<1>(acc0, scales, bias, y, 0, cols);
  StoreRows<1>(acc1, scales != nullptr ? scales + kGemmPanelWidth : nullptr,
               bias != nullptr ? bias + kGemmPanelWidth : nullptr, y + kGemmPanelWidth, 0,
               cols - kGemmPanelWidth);
}

// PairTile over `panel` and the panel after it (k steps of 32 Elements each).
template <typename Panel, typename Element>
void PanelPairTile(const float* x, const void* panel, const float* scales, int k, const float* bias,
                   float* y, int cols, const void* prefetch, int prefetch_lines) {
  const auto* first = static_cast<const Element*>(panel);
  PairTile(x, Panel{first}, Panel{first + static_cast<long>(k) * kGemmPanelWidth}, scales, k, bias,
           y, cols, prefetch, prefetch_lines);
}

template <typename Panel>
void Dispatch(const float* x, int ldx, int m, Panel panel, const float* scales, int k,
              const float* bias, float* y, int ldy, int cols, const void* prefetch,
              int prefetch_lines) {
  switch (m) {
#define CONVEYOR_GEMM_ROWS(R) \
  case R:                     \
    return Tile<R>(x, ldx, panel, scales, k, bias, y, ldy, cols, prefetch, prefetch_lines);
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
}  // namespace conveyor::kernels::internal
