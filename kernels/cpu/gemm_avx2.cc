// AVX2+FMA micro-kernels for float32, bfloat16 and int8 panels: the same FMA chain per
// output as the AVX-512 and portable kernels (f32, int8: k ascending from zero, then the
// int8 scale, then the bias; bf16: vdpbf16ps's pairs, gemm_kernels.h), so all give the
// same bits. Compiled with
// -mavx2 -mfma -ffp-contract=off; called only when the CPU reports AVX2 and FMA.
//
// Sixteen 8-float registers hold fewer accumulators than AVX-512's 32 × 16, so a panel's
// 32 columns are not always computed at once: up to 2 rows take all 32 columns (4
// registers each), more rows take the panel in two halves of 16 columns, 6 rows at a
// time (12 accumulators, 2 weight registers, 1 broadcast: the classic 6×16 tile). How a
// panel is cut into tiles never changes an output's chain.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 8;

// Loads the 8 weights of columns [8q, 8q + 8) at step i of a panel, as float32.
// Steps come in pairs (kPaired) for bf16, whose Load takes the step's parity as a type
// (Half<0>: even step, Half<1>: odd); the other panels ignore it.
template <int kHalf>
using Half = std::integral_constant<int, kHalf>;

struct F32Panel {
  static constexpr bool kPaired = false;
  const float* panel;
  template <typename H>
  __m256 Load(int i, int q, H) const {
    return _mm256_load_ps(panel + i * kGemmPanelWidth + q * 8);
  }
};

// Step i takes the weights of k = i ^ 1 (x is in chain order): the high halves of pair
// i / 2's dwords for an even step, the low halves for an odd one.
struct Bf16Panel {
  static constexpr bool kPaired = true;
  const uint16_t* panel;
  template <int kHalf>
  __m256 Load(int i, int q, Half<kHalf>) const {
    const __m256i raw = _mm256_load_si256(
        reinterpret_cast<const __m256i*>(panel + (i >> 1) * 2 * kGemmPanelWidth + q * 16));
    if constexpr (kHalf == 0) {
      return _mm256_castsi256_ps(
          _mm256_and_si256(raw, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u))));
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16));
    }
  }
};

struct Int8Panel {
  static constexpr bool kPaired = false;
  const int8_t* panel;
  template <typename H>
  __m256 Load(int i, int q, H) const {
    const __m128i raw =
        _mm_loadl_epi64(reinterpret_cast<const __m128i*>(panel + i * kGemmPanelWidth + q * 8));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(raw));
  }
};

// Two adjacent panels (of k steps each) as one of 64 columns: quads 0-3 from the first,
// 4-7 from the second.
template <typename Panel, typename Element>
struct PanelPair {
  static constexpr bool kPaired = Panel::kPaired;
  Panel first, second;
  PanelPair(const Element* panel, int k)
      : first{panel}, second{panel + static_cast<long>(k) * kGemmPanelWidth} {}
  template <typename H>
  __m256 Load(int i, int q, H half) const {
    return q < 4 ? first.Load(i, q, half) : second.Load(i, q - 4, half);
  }
};

// Lanes [0, valid) of a mask for maskload/maskstore.
__m256i FirstLanes(int valid) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(std::clamp(valid, 0, kLanes)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// Rows [0, kRows) × columns [8·q0, 8·(q0 + kQuads)) of a panel. `cols` counts the panel's
// valid columns (from column 0); the prefetch hint is spread over the k loop as in the
// AVX-512 kernel.
template <int kRows, int kQuads, typename Panel>
void Tile(const float* x, int ldx, Panel panel, int q0, const float* scales, int k,
          const float* bias, float* y, int ldy, int cols, const void* prefetch,
          int prefetch_lines) {
  __m256 acc[kRows][kQuads];
#pragma GCC unroll 6
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 8
    for (int q = 0; q < kQuads; ++q) acc[r][q] = _mm256_setzero_ps();
  }
  // The step's weights first, then one row at a time: each broadcast is used at once, so
  // accumulators, weights and one broadcast fit in the 16 registers (at most 12 + 2 + 1
  // or 8 + 4 + 1); hoisting all broadcasts would spill accumulators to the stack. One row
  // over up to 8 quads (a panel pair) uses each weight register at once instead.
  auto step = [&](int i, auto half) {
    if constexpr (kRows == 1) {
      const __m256 a = _mm256_broadcast_ss(x + i);
#pragma GCC unroll 8
      for (int q = 0; q < kQuads; ++q) {
        acc[0][q] = _mm256_fmadd_ps(a, panel.Load(i, q0 + q, half), acc[0][q]);
      }
    } else {
      __m256 b[kQuads];
#pragma GCC unroll 4
      for (int q = 0; q < kQuads; ++q) b[q] = panel.Load(i, q0 + q, half);
#pragma GCC unroll 6
      for (int r = 0; r < kRows; ++r) {
        const __m256 a = _mm256_broadcast_ss(x + r * ldx + i);
#pragma GCC unroll 4
        for (int q = 0; q < kQuads; ++q) acc[r][q] = _mm256_fmadd_ps(a, b[q], acc[r][q]);
      }
    }
  };
  // bf16's k is even (Bf16PaddedK): its steps go two at a time, parity known.
  constexpr int kStride = Panel::kPaired ? 2 : 1;
  auto advance = [&](int i) {
    step(i, Half<0>{});
    if constexpr (Panel::kPaired) step(i + 1, Half<1>{});
  };
  if (prefetch_lines == 0) {
    for (int i = 0; i < k; i += kStride) advance(i);
  } else {
    const char* line = static_cast<const char*>(prefetch);
    int credit = 0;
    for (int i = 0; i < k; i += kStride) {
      credit += prefetch_lines * kStride;
      for (; credit >= k; credit -= k, line += 64) _mm_prefetch(line, _MM_HINT_T1);
      advance(i);
    }
  }
#pragma GCC unroll 8
  for (int q = 0; q < kQuads; ++q) {
    const int col = (q0 + q) * kLanes;
    const __m256i mask = FirstLanes(cols - col);
    // Scale and bias come after the chain, so they never change the reduction order.
    const __m256 scale = scales != nullptr ? _mm256_loadu_ps(scales + col) : _mm256_set1_ps(1.0f);
    const __m256 b = bias != nullptr ? _mm256_maskload_ps(bias + col, mask) : _mm256_setzero_ps();
#pragma GCC unroll 6
    for (int r = 0; r < kRows; ++r) {
      __m256 v = acc[r][q];
      if (scales != nullptr) v = _mm256_mul_ps(v, scale);  // Panels' scales are padded to 32.
      if (bias != nullptr) v = _mm256_add_ps(v, b);
      _mm256_maskstore_ps(y + static_cast<long>(r) * ldy + col, mask, v);
    }
  }
}

// One group of up to 6 rows over the whole panel.
template <int kRows, typename Panel>
void Rows(const float* x, int ldx, Panel panel, const float* scales, int k, const float* bias,
          float* y, int ldy, int cols, const void* prefetch, int prefetch_lines) {
  if constexpr (kRows <= 2) {
    Tile<kRows, 4>(x, ldx, panel, 0, scales, k, bias, y, ldy, cols, prefetch, prefetch_lines);
  } else if (cols <= 16) {
    Tile<kRows, 2>(x, ldx, panel, 0, scales, k, bias, y, ldy, cols, prefetch, prefetch_lines);
  } else {
    // Two passes over the panel: each prefetches half of the hint's lines.
    const int first = prefetch_lines / 2;
    Tile<kRows, 2>(x, ldx, panel, 0, scales, k, bias, y, ldy, cols, prefetch, first);
    Tile<kRows, 2>(x, ldx, panel, 2, scales, k, bias, y, ldy, cols,
                   static_cast<const char*>(prefetch) + static_cast<long>(first) * 64,
                   prefetch_lines - first);
  }
}

// How many passes over the panel Rows<rows> makes.
int RowPasses(int rows, int cols) { return rows <= 2 || cols <= 16 ? 1 : 2; }

template <typename Panel>
void RowGroup(int rows, const float* x, int ldx, Panel panel, const float* scales, int k,
              const float* bias, float* y, int ldy, int cols, const void* prefetch,
              int prefetch_lines) {
  switch (rows) {
#define CONVEYOR_GEMM_ROWS(R) \
  case R:                     \
    return Rows<R>(x, ldx, panel, scales, k, bias, y, ldy, cols, prefetch, prefetch_lines);
    CONVEYOR_GEMM_ROWS(1)
    CONVEYOR_GEMM_ROWS(2)
    CONVEYOR_GEMM_ROWS(3)
    CONVEYOR_GEMM_ROWS(4)
    CONVEYOR_GEMM_ROWS(5)
    CONVEYOR_GEMM_ROWS(6)
#undef CONVEYOR_GEMM_ROWS
    default:
      return;
  }
}

// Rows in groups of 6 (the last group takes the rest). The prefetch hint is shared out
// over every pass the groups make over the panel, in proportion: given to the first pass
// alone (m = 8 makes three), the next panel's lines were requested in a third of the
// call and the memory sat idle for the rest. The model's 48 layer GEMMs at the AVX2
// level of a Zen 4, first pass → shared, in one process: f32 m = 3-12 27-45% faster;
// bf16 m = 3-4 ~20%, m = 8-12 and int8 within 5% (bound by arithmetic there).
template <typename Panel>
void Dispatch(const float* x, int ldx, int m, Panel panel, const float* scales, int k,
              const float* bias, float* y, int ldy, int cols, const void* prefetch,
              int prefetch_lines) {
  int passes = 0;
  for (int r = 0; r < m; r += 6) passes += RowPasses(std::min(6, m - r), cols);
  const char* line = static_cast<const char*>(prefetch);
  int done = 0, lines_given = 0;
  for (int r = 0; r < m; r += 6) {
    const int rows = std::min(6, m - r);
    done += RowPasses(rows, cols);
    const int lines = prefetch_lines * done / passes - lines_given;
    RowGroup(rows, x + static_cast<long>(r) * ldx, ldx, panel, scales, k, bias,
             y + static_cast<long>(r) * ldy, ldy, cols, lines > 0 ? line : nullptr, lines);
    line += static_cast<long>(lines) * 64;
    lines_given += lines;
  }
}

// ToBf16 (gemm.cc) on 8 floats, as float32 values: nearest even, a denormal to a zero of
// its sign, a NaN to a quiet NaN.
__m256 RoundToBf16(__m256 x) {
  const __m256i bits = _mm256_castps_si256(x);
  const __m256i magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fffffff));
  const __m256i is_nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f800000));
  const __m256i is_denormal = _mm256_cmpeq_epi32(
      _mm256_and_si256(bits, _mm256_set1_epi32(0x7f800000)), _mm256_setzero_si256());
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));  // Wraps as uint32.
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xffff0000u));
  __m256i out = _mm256_and_si256(rounded, high);
  out = _mm256_blendv_epi8(
      out, _mm256_or_si256(_mm256_and_si256(bits, high), _mm256_set1_epi32(0x00400000)), is_nan);
  out = _mm256_blendv_epi8(
      out, _mm256_and_si256(bits, _mm256_set1_epi32(static_cast<int>(0x80000000u))), is_denormal);
  return _mm256_castsi256_ps(out);
}

}  // namespace

void RoundBf16ChainOrderAvx2(const float* x, int ldx, int m, int k, void* out) {
  const int padded = Bf16PaddedK(k);
  for (int r = 0; r < m; ++r) {
    const float* row = x + static_cast<size_t>(r) * ldx;
    float* dst = static_cast<float*>(out) + static_cast<size_t>(r) * padded;
    int i = 0;
    for (; i + kLanes <= k; i += kLanes) {
      // Rounded, then each pair's two elements swapped: the chain takes the odd one first.
      const __m256 v = RoundToBf16(_mm256_loadu_ps(row + i));
      _mm256_storeu_ps(dst + i, _mm256_permute_ps(v, 0xB1));
    }
    for (; i < padded; ++i) {  // The tail (i is even here), and the pad.
      const int from = i ^ 1;
      dst[i] = from < k ? FromBf16(ToBf16(row[from])) : 0.0f;
    }
  }
}

void WidenBf16PanelAvx2(const void* panel, int k, float* out) {
  const auto* pairs = static_cast<const __m256i*>(panel);
  const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  for (int j = 0; j < k / 2; ++j) {
    float* even = out + static_cast<long>(2 * j) * kGemmPanelWidth;  // Weights of k = 2j + 1.
    float* odd = even + kGemmPanelWidth;                             // Weights of k = 2j.
#pragma GCC unroll 4
    for (int q = 0; q < kGemmPanelWidth / kLanes; ++q) {
      const __m256i raw = _mm256_load_si256(pairs + j * (kGemmPanelWidth / kLanes) + q);
      _mm256_store_ps(even + q * kLanes, _mm256_castsi256_ps(_mm256_and_si256(raw, high)));
      _mm256_store_ps(odd + q * kLanes, _mm256_castsi256_ps(_mm256_slli_epi32(raw, 16)));
    }
  }
}

void GemmPanelAvx2(const float* x, int ldx, int m, const void* panel, const float*, int k,
                   const float* bias, float* y, int ldy, int cols, const void* prefetch,
                   int prefetch_lines) {
  Dispatch(x, ldx, m, F32Panel{static_cast<const float*>(panel)}, nullptr, k, bias, y, ldy, cols,
           prefetch, prefetch_lines);
}

void GemmPanelBf16Avx2(const float* x, int ldx, int m, const void* panel, const float*, int k,
                       const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines) {
  WithDenormalsFlushed([&] {
    Dispatch(x, ldx, m, Bf16Panel{static_cast<const uint16_t*>(panel)}, nullptr, k, bias, y, ldy,
             cols, prefetch, prefetch_lines);
  });
}

void GemmPanelInt8Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines) {
  Dispatch(x, ldx, m, Int8Panel{static_cast<const int8_t*>(panel)}, scales, k, bias, y, ldy, cols,
           prefetch, prefetch_lines);
}

// One row against two adjacent panels (cols <= 64): eight FMA chains instead of four,
// which keeps the FMA units busy while a decode step streams the weights.
void GemmPanelPairAvx2(const float* x, int, int, const void* panel, const float*, int k,
                       const float* bias, float* y, int, int cols, const void* prefetch,
                       int prefetch_lines) {
  Tile<1, 8>(x, 0, PanelPair<F32Panel, float>(static_cast<const float*>(panel), k), 0, nullptr, k,
             bias, y, 0, cols, prefetch, prefetch_lines);
}

void GemmPanelPairBf16Avx2(const float* x, int, int, const void* panel, const float*, int k,
                           const float* bias, float* y, int, int cols, const void* prefetch,
                           int prefetch_lines) {
  WithDenormalsFlushed([&] {
    Tile<1, 8>(x, 0, PanelPair<Bf16Panel, uint16_t>(static_cast<const uint16_t*>(panel), k), 0,
               nullptr, k, bias, y, 0, cols, prefetch, prefetch_lines);
  });
}

void GemmPanelPairInt8Avx2(const float* x, int, int, const void* panel, const float* scales, int k,
                           const float* bias, float* y, int, int cols, const void* prefetch,
                           int prefetch_lines) {
  Tile<1, 8>(x, 0, PanelPair<Int8Panel, int8_t>(static_cast<const int8_t*>(panel), k), 0, scales, k,
             bias, y, 0, cols, prefetch, prefetch_lines);
}

}  // namespace conveyor::kernels::internal
