// AVX2 paged-attention tile kernel: the ISA operations of attention_tile.h on 8-float
// registers, a chunk's 16 scores in two. Every lane runs the AVX-512 kernel's operations
// in the same order (the same even/odd FMA chains for the scores, ExpAvx2 = ExpAvx512,
// the same P·V chains), so the two give the same bits. Compiled with -mavx2 -mfma
// -ffp-contract=off; called only through the avx2 level's kernel set (cpu_kernels.h),
// where head_dim is a multiple of 16 (where the AVX-512 kernel would run: so a model's
// bits do not depend on which of the two a CPU has).
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/attention_tile.h"
#include "kernels/cpu/exp_avx2.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 8;
static_assert(kAttentionChunk == 2 * kLanes, "a chunk's scores fill two registers");

// 8 cache elements widened to float32 (bf16 exactly: its bits are a float's top half).
__m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
__m256 Load8(const uint16_t* p) {
  const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
}

float ExpScalar(float x) { return _mm256_cvtss_f32(ExpAvx2(_mm256_set1_ps(x))); }

// s[r][0..1] lanes j = q_r · K_j for R rows: two FMA chains over even and odd
// coordinates, added at the end (as the AVX-512 kernel).
template <typename T, int R>
void ChunkScores(const TileState<T>& st, int row0, __m256 s[][2]) {
  const float* const* q = st.q_rows + row0;
  __m256 even[R][2], odd[R][2];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    even[r][0] = even[r][1] = odd[r][0] = odd[r][1] = _mm256_setzero_ps();
  }
  LineRun next_k = *st.next_k;  // In registers over the loop.
  for (int i = 0; i < st.d; i += 2) {
    const T* k0 = st.kt + static_cast<size_t>(i) * st.kt_stride;
    const T* k1 = k0 + st.kt_stride;
    const __m256 k0lo = Load8(k0), k0hi = Load8(k0 + kLanes);
    next_k.Issue();  // One line per 16 positions of a coordinate loaded.
    next_k.Issue();
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(q[r] + i);
      even[r][0] = _mm256_fmadd_ps(a, k0lo, even[r][0]);
      even[r][1] = _mm256_fmadd_ps(a, k0hi, even[r][1]);
    }
    const __m256 k1lo = Load8(k1), k1hi = Load8(k1 + kLanes);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 a = _mm256_broadcast_ss(q[r] + i + 1);
      odd[r][0] = _mm256_fmadd_ps(a, k1lo, odd[r][0]);
      odd[r][1] = _mm256_fmadd_ps(a, k1hi, odd[r][1]);
    }
  }
  *st.next_k = next_k;
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    s[r][0] = _mm256_add_ps(even[r][0], odd[r][0]);
    s[r][1] = _mm256_add_ps(even[r][1], odd[r][1]);
  }
}

// acc_r = acc_r · alpha_r + Σ_{j<n} p_r[j] · V_j, j ascending, for R rows.
template <typename T, int R>
void ChunkPv(const TileState<T>& st, int row0, int n) {
  LineRun next_v = *st.next_v;
  for (int c = 0; c < st.d; c += kLanes) {
    __m256 acc[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_mul_ps(_mm256_load_ps(st.acc_rows[row0 + r] + c),
                             _mm256_set1_ps(st.alpha[row0 + r]));
    }
    for (int j = 0; j < n; ++j) {
      const __m256 v = Load8(st.v_rows[j] + c);
      next_v.Issue();
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(st.p + (row0 + r) * kAttentionChunk + j), v,
                                 acc[r]);
      }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) _mm256_store_ps(st.acc_rows[row0 + r] + c, acc[r]);
  }
  *st.next_v = next_v;
}

// Lanes [0, valid) of 8, as a float mask.
__m256 FirstLanes(int valid) {
  return _mm256_castsi256_ps(
      _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)));
}

// Rows [row0, row0 + R) against the chunk at position `chunk_pos` holding n positions;
// every row attends to at least its first position.
template <typename T, int R>
void ProcessRows(const TileState<T>& st, int row0, int chunk_pos, int n) {
  __m256 s[R][2];
  ChunkScores<T, R>(st, row0, s);
  int row_n[R];
  bool uniform = true;
  const __m256 minus_inf = _mm256_set1_ps(-INFINITY);
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    row_n[r] = st.RowPositions(row, chunk_pos, n);
    uniform = uniform && row_n[r] == n;
    const __m256 valid_lo = FirstLanes(row_n[r]), valid_hi = FirstLanes(row_n[r] - kLanes);
    const __m256 scale = _mm256_set1_ps(st.scale);
    const __m256 x_lo = _mm256_mul_ps(s[r][0], scale), x_hi = _mm256_mul_ps(s[r][1], scale);
    // The largest valid score (max is exact, so the order of the reduction is free).
    __m256 most = _mm256_max_ps(_mm256_blendv_ps(minus_inf, x_lo, valid_lo),
                                _mm256_blendv_ps(minus_inf, x_hi, valid_hi));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(most), _mm256_extractf128_ps(most, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float chunk_max = _mm_cvtss_f32(_mm_max_ss(m4, _mm_shuffle_ps(m4, m4, 1)));
    float alpha = 1.0f;
    if (chunk_max > st.m[row]) {
      alpha = st.m[row] == -INFINITY ? 0.0f : ExpScalar(st.m[row] - chunk_max);
      st.m[row] = chunk_max;
    }
    const __m256 m = _mm256_set1_ps(st.m[row]);
    const __m256 p_lo = _mm256_and_ps(valid_lo, ExpAvx2(_mm256_sub_ps(x_lo, m)));
    const __m256 p_hi = _mm256_and_ps(valid_hi, ExpAvx2(_mm256_sub_ps(x_hi, m)));
    float* p = st.p + row * kAttentionChunk;
    _mm256_store_ps(p, p_lo);
    _mm256_store_ps(p + kLanes, p_hi);
    float* l = st.l + row * kAttentionChunk;
    const __m256 a = _mm256_set1_ps(alpha);
    _mm256_store_ps(l, _mm256_fmadd_ps(_mm256_load_ps(l), a, p_lo));
    _mm256_store_ps(l + kLanes, _mm256_fmadd_ps(_mm256_load_ps(l + kLanes), a, p_hi));
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

struct Avx2 {
  // 4 score accumulators per row: 3 rows take 12 of the 16 registers.
  static constexpr int kMaxBlockRows = 3;

  template <typename T>
  static void ProcessRowBlock(const TileState<T>& st, int row0, int rows, int chunk_pos, int n) {
    switch (rows) {
      case 1:
        return ProcessRows<T, 1>(st, row0, chunk_pos, n);
      case 2:
        return ProcessRows<T, 2>(st, row0, chunk_pos, n);
      case 3:
        return ProcessRows<T, 3>(st, row0, chunk_pos, n);
      default:
        return;
    }
  }

  static void Normalize(const float* acc, float inv, int d, float* out) {
    const __m256 v = _mm256_set1_ps(inv);
    for (int c = 0; c < d; c += kLanes) {
      _mm256_storeu_ps(out + c, _mm256_mul_ps(_mm256_load_ps(acc + c), v));
    }
  }
};

}  // namespace

void AttentionTileAvx2(const AttentionArgs& args, const AttentionTile& tile) {
  if (args.kv_dtype == CpuKvDtype::kBf16) return RunAttentionTile<Avx2, uint16_t>(args, tile);
  RunAttentionTile<Avx2, float>(args, tile);
}

}  // namespace conveyor::kernels::internal
