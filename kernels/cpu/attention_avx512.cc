// AVX-512 paged-attention tile kernel. Compiled with -mavx512f -mfma; called only when
// the CPU reports AVX-512F and head_dim is a multiple of 16.
//
// Per chunk of 16 positions, the chunk's K rows are transposed once (so a register holds
// one head_dim coordinate of all 16 positions) and shared by every query row of the tile:
// each row's 16 scores come out in one register from FMA chains over head_dim, with no
// horizontal sums. Each row then updates its own online-softmax state and accumulates
// P·V into its own accumulators. Which rows share a pass only changes which loads are
// shared, never a row's arithmetic, so the result is batch-invariant (see attention.h).

// GCC 12 reports the intrinsics' own _mm512_undefined_ps() placeholders as maybe
// uninitialized (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/exp_avx512.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kLanes = 16;
static_assert(kAttentionChunk == kLanes, "a chunk's scores fill one register");

// Query rows register-blocked together: 2 score accumulators each, 16 of 32 registers.
constexpr int kMaxBlockRows = 8;

float ExpScalar(float x) {
  return _mm_cvtss_f32(_mm512_castps512_ps128(ExpAvx512(_mm512_set1_ps(x))));
}

__m512 UnpackLo64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpacklo_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}
__m512 UnpackHi64(__m512 a, __m512 b) {
  return _mm512_castpd_ps(_mm512_unpackhi_pd(_mm512_castps_pd(a), _mm512_castps_pd(b)));
}

// Transposes the 16x16 matrix whose rows are r[0..15], in place.
void Transpose16(__m512 r[16]) {
  __m512 t[16];
  for (int i = 0; i < 16; i += 2) {
    t[i] = _mm512_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm512_unpackhi_ps(r[i], r[i + 1]);
  }
  // u[4g + c], 128-bit lane k: column 4k + c of rows 4g..4g+3.
  __m512 u[16];
  for (int g = 0; g < 16; g += 4) {
    u[g] = UnpackLo64(t[g], t[g + 2]);
    u[g + 1] = UnpackHi64(t[g], t[g + 2]);
    u[g + 2] = UnpackLo64(t[g + 1], t[g + 3]);
    u[g + 3] = UnpackHi64(t[g + 1], t[g + 3]);
  }
  for (int c = 0; c < 4; ++c) {
    // Lanes: columns c, 8+c (rows 0-3), c, 8+c (rows 4-7); and 4+c, 12+c likewise.
    const __m512 lo_even = _mm512_shuffle_f32x4(u[c], u[4 + c], 0x88);
    const __m512 lo_odd = _mm512_shuffle_f32x4(u[c], u[4 + c], 0xDD);
    const __m512 hi_even = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0x88);
    const __m512 hi_odd = _mm512_shuffle_f32x4(u[8 + c], u[12 + c], 0xDD);
    r[c] = _mm512_shuffle_f32x4(lo_even, hi_even, 0x88);
    r[8 + c] = _mm512_shuffle_f32x4(lo_even, hi_even, 0xDD);
    r[4 + c] = _mm512_shuffle_f32x4(lo_odd, hi_odd, 0x88);
    r[12 + c] = _mm512_shuffle_f32x4(lo_odd, hi_odd, 0xDD);
  }
}

// 64-byte aligned float storage that only grows; one per thread, reused across tiles.
class FloatBuffer {
 public:
  FloatBuffer() = default;
  FloatBuffer(const FloatBuffer&) = delete;
  FloatBuffer& operator=(const FloatBuffer&) = delete;
  ~FloatBuffer() { std::free(data_); }

  float* Get(size_t count) {
    if (count > capacity_) {
      std::free(data_);
      data_ = static_cast<float*>(std::aligned_alloc(64, (count * sizeof(float) + 63) / 64 * 64));
      if (data_ == nullptr) std::abort();
      capacity_ = count;
    }
    return data_;
  }

 private:
  float* data_ = nullptr;
  size_t capacity_ = 0;
};

// One tile's state while it walks its sequence's chunks.
struct TileState {
  int d = 0;          // head_dim.
  int group = 0;      // Query heads per KV head.
  int first_pos = 0;  // Position of the tile's first token.
  float scale = 1.0f;
  const float* kt = nullptr;             // [d][16]: the chunk's K, transposed.
  const float* const* v_rows = nullptr;  // [16]: the chunk's V rows (this KV head).
  const float* const* q_rows = nullptr;  // [rows]
  float* const* acc_rows = nullptr;      // [rows] -> [d]: unnormalized outputs.
  // [rows][16]: the chunk's softmax weights.
  float* p = nullptr;
  // [rows][16]: running softmax denominators, one partial sum per lane.
  float* l = nullptr;
  // [rows]: running max score.
  float* m = nullptr;
  // [rows]: factor that rescales the row's sums from the old max to the new one.
  float* alpha = nullptr;
};

// s[r] lane j = q_r · K_j for R rows: two FMA chains over even and odd coordinates
// (for latency), added at the end.
template <int R>
void ChunkScores(const TileState& st, int row0, __m512* s) {
  const float* const* q = st.q_rows + row0;
  __m512 even[R], odd[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    even[r] = _mm512_setzero_ps();
    odd[r] = _mm512_setzero_ps();
  }
  for (int i = 0; i < st.d; i += 2) {
    const __m512 k0 = _mm512_load_ps(st.kt + i * kLanes);
    const __m512 k1 = _mm512_load_ps(st.kt + (i + 1) * kLanes);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      even[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][i]), k0, even[r]);
      odd[r] = _mm512_fmadd_ps(_mm512_set1_ps(q[r][i + 1]), k1, odd[r]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) s[r] = _mm512_add_ps(even[r], odd[r]);
}

// acc_r = acc_r · alpha_r + Σ_{j<n} p_r[j] · V_j, j ascending, for R rows.
template <int R>
void ChunkPv(const TileState& st, int row0, int n) {
  for (int c = 0; c < st.d; c += kLanes) {
    __m512 acc[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_mul_ps(_mm512_load_ps(st.acc_rows[row0 + r] + c),
                             _mm512_set1_ps(st.alpha[row0 + r]));
    }
    for (int j = 0; j < n; ++j) {
      const __m512 v = _mm512_loadu_ps(st.v_rows[j] + c);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(st.p[(row0 + r) * kLanes + j]), v, acc[r]);
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) _mm512_store_ps(st.acc_rows[row0 + r] + c, acc[r]);
  }
}

// Rows [row0, row0 + R) against the chunk at position `chunk_pos` holding n positions;
// every row attends to at least its first position.
template <int R>
void ProcessRows(const TileState& st, int row0, int chunk_pos, int n) {
  __m512 s[R];
  ChunkScores<R>(st, row0, s);
  int row_n[R];
  bool uniform = true;
  for (int r = 0; r < R; ++r) {
    const int row = row0 + r;
    row_n[r] = std::min(n, st.first_pos + row / st.group - chunk_pos + 1);
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
    ChunkPv<R>(st, row0, n);
  } else {
    // Causal diagonal: rows stop at different positions, so each runs alone (the same
    // FMA sequence as in a block), never adding 0·V for positions past its own.
    for (int r = 0; r < R; ++r) ChunkPv<1>(st, row0 + r, row_n[r]);
  }
}

void ProcessRowBlock(const TileState& st, int row0, int rows, int chunk_pos, int n) {
  switch (rows) {
    case 1:
      return ProcessRows<1>(st, row0, chunk_pos, n);
    case 2:
      return ProcessRows<2>(st, row0, chunk_pos, n);
    case 3:
      return ProcessRows<3>(st, row0, chunk_pos, n);
    case 4:
      return ProcessRows<4>(st, row0, chunk_pos, n);
    case 5:
      return ProcessRows<5>(st, row0, chunk_pos, n);
    case 6:
      return ProcessRows<6>(st, row0, chunk_pos, n);
    case 7:
      return ProcessRows<7>(st, row0, chunk_pos, n);
    case 8:
      return ProcessRows<8>(st, row0, chunk_pos, n);
    default:
      return;
  }
}

}  // namespace

void AttentionTileAvx512(const AttentionArgs& args, const AttentionTile& tile) {
  const AttentionBatch& batch = *args.batch;
  const AttentionShape& shape = args.shape;
  const int d = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int rows = tile.num_tokens * group;
  const size_t slot_floats = static_cast<size_t>(shape.num_kv_heads) * d;
  const size_t head_offset = static_cast<size_t>(tile.kv_head) * d;
  const int first_pos = batch.token_pos[tile.first_token];
  const int last_pos = first_pos + tile.num_tokens - 1;
  const int32_t* table =
      batch.block_tables +
      static_cast<size_t>(batch.token_seq[tile.first_token]) * batch.max_blocks_per_seq;

  thread_local FloatBuffer kt_buf, acc_buf, p_buf, l_buf, m_buf, alpha_buf;
  thread_local std::vector<const float*> q_rows;
  thread_local std::vector<float*> acc_rows;
  TileState st;
  st.d = d;
  st.group = group;
  st.first_pos = first_pos;
  st.scale = shape.scale;
  float* kt = kt_buf.Get(static_cast<size_t>(d) * kLanes);
  float* acc = acc_buf.Get(static_cast<size_t>(rows) * d);
  st.kt = kt;
  st.p = p_buf.Get(static_cast<size_t>(rows) * kLanes);
  st.l = l_buf.Get(static_cast<size_t>(rows) * kLanes);
  st.m = m_buf.Get(rows);
  st.alpha = alpha_buf.Get(rows);
  q_rows.resize(rows);
  acc_rows.resize(rows);
  for (int row = 0; row < rows; ++row) {
    const int t = tile.first_token + row / group;
    const int h = tile.kv_head * group + row % group;
    q_rows[row] = args.q + static_cast<size_t>(t) * args.q_row_stride + static_cast<size_t>(h) * d;
    acc_rows[row] = acc + static_cast<size_t>(row) * d;
    st.m[row] = -INFINITY;
  }
  std::fill(acc, acc + static_cast<size_t>(rows) * d, 0.0f);
  std::fill(st.l, st.l + static_cast<size_t>(rows) * kLanes, 0.0f);
  st.q_rows = q_rows.data();
  st.acc_rows = acc_rows.data();

  // Row pointers of the current and the next chunk (the next one is prefetched while
  // the current one computes: decode reads K/V from beyond L2).
  const float* k_rows[2][kLanes];
  const float* v_rows[2][kLanes];
  // Walks positions to slots block by block: no division per position.
  int block = 0, offset = 0;
  auto locate = [&](int chunk_pos, int buf) {
    const int n = std::min(kLanes, last_pos - chunk_pos + 1);
    for (int j = 0; j < n; ++j) {
      const size_t slot = static_cast<size_t>(table[block]) * batch.block_size + offset;
      k_rows[buf][j] = args.k_cache + slot * slot_floats + head_offset;
      v_rows[buf][j] = args.v_cache + slot * slot_floats + head_offset;
      if (++offset == batch.block_size) {
        offset = 0;
        ++block;
      }
    }
  };
  locate(0, 0);
  for (int chunk_pos = 0, cur = 0; chunk_pos <= last_pos; chunk_pos += kLanes, cur ^= 1) {
    const int n = std::min(kLanes, last_pos - chunk_pos + 1);
    const int next_pos = chunk_pos + kLanes;
    if (next_pos <= last_pos) {
      locate(next_pos, cur ^ 1);
      const int next_n = std::min(kLanes, last_pos - next_pos + 1);
      for (int j = 0; j < next_n; ++j) {
        for (int c = 0; c < d; c += kLanes) {
          _mm_prefetch(reinterpret_cast<const char*>(k_rows[cur ^ 1][j] + c), _MM_HINT_T0);
          _mm_prefetch(reinterpret_cast<const char*>(v_rows[cur ^ 1][j] + c), _MM_HINT_T0);
        }
      }
    }
    st.v_rows = v_rows[cur];
    for (int c = 0; c < d; c += kLanes) {
      __m512 r[kLanes];
      // Positions past the chunk's end may be unwritten (even NaN): zeros stand in, and
      // no row's softmax looks at those lanes.
      for (int j = 0; j < kLanes; ++j) {
        r[j] = j < n ? _mm512_loadu_ps(k_rows[cur][j] + c) : _mm512_setzero_ps();
      }
      Transpose16(r);
      for (int i = 0; i < kLanes; ++i) _mm512_store_ps(kt + (c + i) * kLanes, r[i]);
    }
    // Tokens before chunk_pos do not see this chunk; the rest form a suffix of the rows.
    const int first_row = std::max(0, chunk_pos - first_pos) * group;
    for (int row0 = first_row; row0 < rows; row0 += kMaxBlockRows) {
      ProcessRowBlock(st, row0, std::min(kMaxBlockRows, rows - row0), chunk_pos, n);
    }
  }

  for (int row = 0; row < rows; ++row) {
    const int t = tile.first_token + row / group;
    const int h = tile.kv_head * group + row % group;
    float* out =
        args.out + static_cast<size_t>(t) * shape.num_heads * d + static_cast<size_t>(h) * d;
    const __m512 inv =
        _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(_mm512_load_ps(st.l + row * kLanes)));
    for (int c = 0; c < d; c += kLanes) {
      _mm512_storeu_ps(out + c, _mm512_mul_ps(_mm512_load_ps(acc_rows[row] + c), inv));
    }
  }
}

}  // namespace conveyor::kernels::internal
