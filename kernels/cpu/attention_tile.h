// The paged-attention tile driver shared by the AVX-512 and AVX2 kernels, templated on
// the instruction set's few operations (scoring a block of query rows against a chunk and
// updating their softmax and P·V, normalizing a row). Include only from an ISA file
// (attention_avx512.cc, attention_avx2.cc): everything here has internal linkage, so each
// file gets its own copy compiled for its own instructions and the linker can never hand
// one file's instructions to a CPU that only runs the other's.
//
// Per chunk of 16 positions, the chunk's keys come as kt[d][16] (one head_dim coordinate
// of all 16 positions together): straight from the cache, which keeps K transposed per
// block (CpuKvLayout), or gathered into a buffer when block_size is not a multiple of 16
// and a chunk spans blocks. They are shared by every query row of the tile: each row's
// 16 scores come out of FMA chains over head_dim, with no horizontal sums. Each row then
// updates its own online-softmax state and accumulates P·V into its own accumulators.
// Which rows share a pass only changes which loads are shared, never a row's arithmetic,
// so the result is batch-invariant (see attention.h). Both ISAs run the same operations
// per lane, so they give the same bits.
#pragma once

#include <xmmintrin.h>  // _mm_prefetch

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "kernels/cpu/attention.h"

namespace conveyor::kernels::internal {
namespace {

constexpr int kChunk = kAttentionChunk;

// 64-byte aligned storage of T that only grows; one per thread, reused across tiles.
template <typename T>
class AlignedBuffer {
 public:
  AlignedBuffer() = default;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;
  ~AlignedBuffer() { std::free(data_); }

  T* Get(size_t count) {
    if (count > capacity_) {
      std::free(data_);
      data_ = static_cast<T*>(std::aligned_alloc(64, (count * sizeof(T) + 63) / 64 * 64));
      if (data_ == nullptr) std::abort();
      capacity_ = count;
    }
    return data_;
  }

 private:
  T* data_ = nullptr;
  size_t capacity_ = 0;
};

// Lines at a fixed stride to prefetch into L2, one per Issue. The kernels issue the next
// chunk's K lines one per K load and its V lines one per V load, so they stream in while
// the current chunk computes. In a decode step the K/V come from memory (the weights went
// through the caches since the layer's last step); on a Zen 4 the kernel read them there
// at half the rate of a plain read of the same lines whether the next chunk was
// prefetched all at once at the chunk's start (into L1 or L2, 1 to 8 chunks ahead) or
// one line per load into L1; one line per load into L2 reads them at the plain read's
// rate (docs/cpu-attention.md). A full chunk makes at least as many vector loads as the
// next chunk has lines; what a shorter one leaves goes out after it.
struct LineRun {
  const char* next = nullptr;
  const char* end = nullptr;
  ptrdiff_t step = 64;

  void Issue() {
    if (next < end) {
      _mm_prefetch(next, _MM_HINT_T1);
      next += step;
    }
  }
  void IssueRest() {
    while (next < end) Issue();
  }
};

// One tile's state while it walks its sequence's chunks. T: the cache's element, float
// or bf16 bits (uint16_t), widened to float32 exactly as it is loaded.
template <typename T>
struct TileState {
  int d = 0;          // head_dim.
  int group = 0;      // Query heads per KV head.
  int first_pos = 0;  // Position of the tile's first token.
  float scale = 1.0f;
  const T* kt = nullptr;  // [d][16] at kt_stride elements per coordinate: the chunk's K.
  int kt_stride = 0;
  const T* const* v_rows = nullptr;      // [16]: the chunk's V rows (this KV head).
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
  // The next chunk's K and V lines, issued as the loops load this chunk's (LineRun).
  LineRun* next_k = nullptr;
  LineRun* next_v = nullptr;

  // Positions of the chunk at chunk_pos (holding n) that row `row` attends to: at least 1.
  int RowPositions(int row, int chunk_pos, int n) const {
    return std::min(n, first_pos + row / group - chunk_pos + 1);
  }
};

// The 16 lanes of a row's softmax denominator added in one fixed tree (lane i + i+8, then
// + i+4, then (0+2) + (1+3)), spelled out so that it does not depend on how a compiler
// implements a horizontal-sum intrinsic.
float SumLanes16(const float* l) {
  float t8[8], t4[4];
  for (int i = 0; i < 8; ++i) t8[i] = l[i + 8] + l[i];
  for (int i = 0; i < 4; ++i) t4[i] = t8[i + 4] + t8[i];
  return (t4[0] + t4[2]) + (t4[1] + t4[3]);
}

// Isa provides:
//   kMaxBlockRows: query rows register-blocked together;
//   ProcessRowBlock(st, row0, rows, chunk_pos, n): scores, softmax update and P·V of
//     rows [row0, row0 + rows) against the chunk;
//   Normalize(acc, inv, d, out): out[c] = acc[c] · inv.
template <typename Isa, typename T>
void RunAttentionTile(const AttentionArgs& args, const AttentionTile& tile) {
  const AttentionBatch& batch = *args.batch;
  const AttentionShape& shape = args.shape;
  const int d = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const int rows = tile.num_tokens * group;
  const CpuKvLayout layout{shape.num_kv_heads, d, batch.block_size};
  const int block_size = batch.block_size;
  // Blocks of whole chunks: each chunk's K is read in place.
  const bool direct = block_size % kChunk == 0;
  const int first_pos = batch.token_pos[tile.first_token];
  const int last_pos = first_pos + tile.num_tokens - 1;
  const int32_t* table =
      batch.block_tables +
      static_cast<size_t>(batch.token_seq[tile.first_token]) * batch.max_blocks_per_seq;

  thread_local AlignedBuffer<T> kt_buf;
  thread_local AlignedBuffer<float> acc_buf, p_buf, l_buf, m_buf, alpha_buf;
  thread_local std::vector<const float*> q_rows;
  thread_local std::vector<float*> acc_rows;
  TileState<T> st;
  st.d = d;
  st.group = group;
  st.first_pos = first_pos;
  st.scale = shape.scale;
  T* kt_gathered = direct ? nullptr : kt_buf.Get(static_cast<size_t>(d) * kChunk);
  float* acc = acc_buf.Get(static_cast<size_t>(rows) * d);
  st.p = p_buf.Get(static_cast<size_t>(rows) * kChunk);
  st.l = l_buf.Get(static_cast<size_t>(rows) * kChunk);
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
  for (size_t i = 0; i < static_cast<size_t>(rows) * d; ++i) acc[i] = 0.0f;
  for (size_t i = 0; i < static_cast<size_t>(rows) * kChunk; ++i) st.l[i] = 0.0f;
  st.q_rows = q_rows.data();
  st.acc_rows = acc_rows.data();

  // Where the current and the next chunk are (the next one is prefetched while the
  // current one computes: decode reads K/V from memory). Per position: its V row, and the
  // start of its K column (coordinate c at + c * block_size).
  const T* k_cache = static_cast<const T*>(args.k_cache);
  const T* v_cache = static_cast<const T*>(args.v_cache);
  const T* k_cols[2][kChunk];
  const T* v_rows[2][kChunk];
  auto locate = [&](int chunk_pos, int buf) {
    const int n = std::min(kChunk, last_pos - chunk_pos + 1);
    int block = chunk_pos / block_size, offset = chunk_pos % block_size;
    for (int j = 0; j < n; ++j) {
      const size_t base = layout.HeadBase(table[block], tile.kv_head);
      k_cols[buf][j] = k_cache + base + offset;
      v_rows[buf][j] = v_cache + base + static_cast<size_t>(offset) * d;
      if (++offset == block_size) {
        offset = 0;
        ++block;
      }
    }
  };
  // A chunk in a block of whole chunks: its keys are coordinate c's 16 positions at
  // + c * block_size (contiguous over c with blocks of 16), its values 16 rows together.
  // A chunk spanning blocks (block_size not a multiple of 16) is left to the hardware.
  LineRun next_k, next_v;
  st.next_k = &next_k;
  st.next_v = &next_v;
  const ptrdiff_t coord_bytes = static_cast<ptrdiff_t>(block_size) * sizeof(T);
  auto queue_chunk = [&](int chunk_pos) {
    const size_t base = layout.HeadBase(table[chunk_pos / block_size], tile.kv_head);
    const int offset = chunk_pos % block_size;
    const char* k = reinterpret_cast<const char*>(k_cache + base + offset);
    next_k.next = k;
    next_k.step = std::max<ptrdiff_t>(64, coord_bytes);  // A line, or one per coordinate.
    next_k.end = k + d * coord_bytes;
    const char* v = reinterpret_cast<const char*>(v_cache + base + static_cast<size_t>(offset) * d);
    next_v.next = v;
    next_v.end = v + static_cast<ptrdiff_t>(std::min(kChunk, last_pos - chunk_pos + 1)) * d *
                         static_cast<ptrdiff_t>(sizeof(T));
  };
  locate(0, 0);
  for (int chunk_pos = 0, cur = 0; chunk_pos <= last_pos; chunk_pos += kChunk, cur ^= 1) {
    const int n = std::min(kChunk, last_pos - chunk_pos + 1);
    const int next_pos = chunk_pos + kChunk;
    next_k = next_v = LineRun{};
    if (next_pos <= last_pos) {
      locate(next_pos, cur ^ 1);
      if (direct) queue_chunk(next_pos);
    }
    st.v_rows = v_rows[cur];
    // Lanes past the chunk's end (n < 16) hold whatever the cache holds there, even NaN:
    // no row's softmax looks at those lanes, and P·V stops at n.
    if (direct) {
      st.kt = k_cols[cur][0];
      st.kt_stride = block_size;
    } else {
      for (int c = 0; c < d; ++c) {
        for (int j = 0; j < n; ++j) kt_gathered[c * kChunk + j] = k_cols[cur][j][c * block_size];
      }
      st.kt = kt_gathered;
      st.kt_stride = kChunk;
    }
    // Tokens before chunk_pos do not see this chunk; the rest form a suffix of the rows.
    const int first_row = std::max(0, chunk_pos - first_pos) * group;
    for (int row0 = first_row; row0 < rows; row0 += Isa::kMaxBlockRows) {
      Isa::ProcessRowBlock(st, row0, std::min(Isa::kMaxBlockRows, rows - row0), chunk_pos, n);
    }
    next_k.IssueRest();  // What the loops did not get to.
    next_v.IssueRest();
  }

  for (int row = 0; row < rows; ++row) {
    const int t = tile.first_token + row / group;
    const int h = tile.kv_head * group + row % group;
    float* out =
        args.out + static_cast<size_t>(t) * shape.num_heads * d + static_cast<size_t>(h) * d;
    Isa::Normalize(acc_rows[row], 1.0f / SumLanes16(st.l + row * kChunk), d, out);
  }
}

}  // namespace
}  // namespace conveyor::kernels::internal
