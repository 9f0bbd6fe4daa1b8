// AVX-512 paged-attention tile kernel: the ISA operations of attention_tile.h on
// 16-float registers (a chunk's 16 scores in one). Compiled with -mavx512f -mfma
// -ffp-contract=off; called only through the AVX-512 levels' kernel sets (cpu_kernels.h),
// where head_dim is a multiple of 16.

// GCC 12 reports the intrinsics' own _mm512_undefined_ps() placeholders as maybe
// uninitialized (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/exp_avx512.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 16;
static_assert(kAttentionChunk == kLanes, "a chunk's scores fill one register");

// 16 cache elements widened to float32 (bf16 exactly: its bits are a float's top half).
__m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
__m512 Load16(const uint16_t* p) {
  const __m512i wide =
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  return _mm512_castsi512_ps(_mm512_slli_epi32(wide, 16));
}

float ExpScalar(float x) {
  return _mm_cvtss_f32(_mm512_castps512_ps128(ExpAvx512(_mm512_set1_ps(x))));
}

// s[r] lane j = q_r · K_j for R rows: two FMA chains over even and odd coordinates
// (for latency), added at the end.
template <typename T, int R>
void ChunkScores(const TileState<T>& st, int row0, __m512* s) {
  const float* const* q = st.q_rows + row0;
  __m512 even[R], odd[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    even[r] = _mm512_setzero_ps();
    odd[r] = _mm512_setzero_ps();
  }
  LineRun next_k = *st.next_k;  // In registers over the loop.
  for (int i = 0; i < st.d; i += 2) {
    const __m512 k0 = Load16(st.kt + static_cast<size_t>(i) * st.kt_stride);
    const __m512 k1 = Load16(st.kt + static_cast<size_t>(i + 1) * st.kt_stride);
    next_k.Issue();
    next_k.Issue();
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      even[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][i]), k0, even[r]);
      odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][i + 1]), k1, odd[r]);
    }
  }
  *st.next_k = next_k;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) s[r] = _mm512_add_ps(even[r], odd[r]);
}

// acc_r = acc_r · alpha_r + Σ_{j<n} p_r[j] · V_j, j ascending, for R rows.
template <typename T, int R>
void ChunkPv(const TileState<T>& st, int row0, int n) {
  LineRun next_v = *st.next_v;
  for (int c = 0; c < st.d; c += kLanes) {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_mul_ps(_mm512_load_ps(st.acc_rows[row0 + r] + c),
                             _mm512_set1_ps(st.alpha[row0 + r]));
    }
    for (int j = 0; j < n; ++j) {
      const __m512 v = Load16(st.v_rows[j] + c);
      next_v.Issue();
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(st.p[(row0 + r) * kLanes + j]), v, acc[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_store_ps(st.acc_rows[row0 + r] + c, acc[r]);
  }
  *st.next_v = next_v;
}

// Rows [row0, row0 + R) against the chunk at position `chunk_pos` holding n positions;
// every row attends to at least its first position.
template <typename T, int R>
void ProcessRows(const TileState<T>& st, int row0, int chunk_pos, int n) {
  __m512 s[R];
  ChunkScores<T, R>(st, row0, s);
  int row_n[R];
  bool uniform = true;
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    row_n[r] = st.RowPositions(row, chunk_pos, n);
    uniform = uniform && row_n[r] == n;
    const __mmask16 valid = static_cast<__mmask16>((1u << row_n[r]) - 1);
    const __m512 x = _mm512_mul_ps(s[r], _mm512_set1_ps(st.scale));
    const float chunk_max = _mm512_mask_reduce_max_ps(valid, x);
    float alpha = 1.0f;
    if (chunk_max > st.m[row]) {
      alpha = st.m[row] == -INFINITY ? 0.0f : ExpScalar(st.m[row] - chunk_max);
      st.m[row] = chunk_max;
    }
    const __m512 p =
        _mm512_maskz_mov_ps(valid, ExpAvx512(_mm512_sub_ps(x, _mm512_set1_ps(st.m[row]))));
    _mm512_store_ps(st.p + row * kLanes, p);
    float* l = st.l + row * kLanes;
    _mm512_store_ps(l, _mm512_fmadd_ps(_mm512_load_ps(l), _mm512_set1_ps(alpha), p));
    st.alpha[row] = alpha;
  }
  if (uniform) {
    ChunkPv<T, R>(st, row0, n);
  } else {
    // Causal diagonal: rows stop at different positions, so each runs alone (the same
    // FMA sequence as in a block), never adding 0·V for positions past its own.
    for (int r = 0; r < R; ++r) ChunkPv<T, 1>(st, row0 + r, row_n[r]);
  }
}

struct Avx512 {
  static constexpr int kMaxBlockRows = 8;

  template <typename T>
  static void ProcessRowBlock(const TileState<T>& st, int row0, int rows, int chunk_pos, int n) {
    switch (rows) {
#define CONVEYOR_ATTENTION_ROWS(R) \
  case R:                          \
    return ProcessRows<T, R>(st, row0, chunk_pos, n);
      CONVEYOR_ATTENTION_ROWS(1)
      CONVEYOR_ATTENTION_ROWS(2)
      CONVEYOR_ATTENTION_ROWS(3)
      CONVEYOR_ATTENTION_ROWS(4)
      CONVEYOR_ATTENTION_ROWS(5)
      CONVEYOR_ATTENTION_ROWS(6)
      CONVEYOR_ATTENTION_ROWS(7)
      CONVEYOR_ATTENTION_ROWS(8)
#undef CONVEYOR_ATTENTION_ROWS
      default:
        return;
    }
  }

  static void Normalize(const float* acc, float inv, int d, float* out) {
    const __m512 v = _mm512_set1_ps(inv);
    for (int c = 0; c < d; c += kLanes) {
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_load_ps(acc + c), v));
    }
  }
};

}  // namespace

void AttentionTileAvx512(const AttentionArgs& args, const AttentionTile& tile) {
  if (args.kv_dtype == CpuKvDtype::kBf16) return RunAttentionTile<Avx512, uint16_t>(args, tile);
  RunAttentionTile<Avx512, float>(args, tile);
}

}  // namespace conveyor::kernels::internal
