// Paged attention for the CPU backend (Backend::PagedAttention on float32 activations).
//
// Work is split into tiles: up to a few dozen query rows made of consecutive tokens of one
// sequence at consecutive positions (a prefill chunk, or one decode token) times the
// query heads that share one KV head. A tile walks its sequence's K/V once, so a K/V row
// loaded from the cache serves every row of the tile.
//
// Batch invariance: a tile only decides which loop is outer and which loads are shared.
// Each query row keeps its own softmax state and runs through its positions 0..pos with
// the same sequence of operations whatever tile it is in (the vector kernels in chunks of
// kAttentionChunk positions counted from position 0, whatever the block size), so its bits
// depend only on its query, its position and its sequence's K/V: never on the tile, the
// rest of the batch, or the thread that ran it.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/backend.h"
#include "kernels/cpu_weight_dtype.h"

namespace conveyor::kernels {

class ThreadPool;

// out[t, h, :] for every token t and query head h, as Backend::PagedAttention specifies
// (float32 q, cache and out). Runs on `pool` (null: the calling thread).
// float32 q and out; the cache holds `kv_dtype` elements.
void PagedAttentionCpu(const float* q, int q_row_stride, const AttentionBatch& batch,
                       const AttentionShape& shape, KvLayer layer, CpuKvDtype kv_dtype, float* out,
                       ThreadPool* pool);

namespace internal {

// Positions per softmax chunk: one AVX-512 register of scores (two AVX2 registers).
inline constexpr int kAttentionChunk = 16;

// Where the CPU backend keeps a layer's K and V (each num_blocks * block_size slots of
// num_kv_heads * head_dim elements: float32, or bf16 with --cpu_kv_dtype=bf16). For each block and
// KV head, K is stored transposed and V as rows:
//   K: [num_blocks][num_kv_heads][head_dim][block_size]  (coordinate c of every position)
//   V: [num_blocks][num_kv_heads][block_size][head_dim]
// A head's K and V of a block are each one contiguous run, and when block_size is a
// multiple of kAttentionChunk a chunk's keys are head_dim aligned vectors of 16 positions
// read straight from the cache: no transpose per chunk, no copy.
struct CpuKvLayout {
  int num_kv_heads = 0;
  int head_dim = 0;
  int block_size = 0;

  // First element of KV head h's part of block `block`, in K and in V alike.
  size_t HeadBase(int32_t block, int h) const {
    return (static_cast<size_t>(block) * num_kv_heads + h) * head_dim * block_size;
  }
  // Element index of coordinate c of KV head h at `slot`, in K and in V.
  size_t K(size_t slot, int h, int c) const {
    return HeadBase(static_cast<int32_t>(slot / block_size), h) +
           static_cast<size_t>(c) * block_size + slot % block_size;
  }
  size_t V(size_t slot, int h, int c) const {
    return HeadBase(static_cast<int32_t>(slot / block_size), h) + (slot % block_size) * head_dim +
           c;
  }
};

struct AttentionArgs {
  const float* q = nullptr;
  int q_row_stride = 0;
  const AttentionBatch* batch = nullptr;
  AttentionShape shape;
  // CpuKvLayout with block_size = batch->block_size; float or bf16 (uint16_t) elements.
  const void* k_cache = nullptr;
  const void* v_cache = nullptr;
  CpuKvDtype kv_dtype = CpuKvDtype::kF32;
  float* out = nullptr;
};

// Batch tokens [first_token, first_token + num_tokens), which belong to one sequence and
// sit at consecutive positions, with the query heads of KV head `kv_head`.
struct AttentionTile {
  int first_token = 0;
  int num_tokens = 0;
  int kv_head = 0;
};

using AttentionTileKernel = void (*)(const AttentionArgs& args, const AttentionTile& tile);

// AVX-512F kernel; needs head_dim % 16 == 0. Online softmax over 16-position chunks.
void AttentionTileAvx512(const AttentionArgs& args, const AttentionTile& tile);
// AVX2+FMA kernel with the same arithmetic per lane, so the same bits; head_dim % 16 == 0.
void AttentionTileAvx2(const AttentionArgs& args, const AttentionTile& tile);
// Plain C++ kernel for any CPU and head_dim; two-pass softmax per query row. Its bits
// differ from the vector kernels', but it is batch-invariant in the same way.
void AttentionTilePortable(const AttentionArgs& args, const AttentionTile& tile);

// Splits the batch into tiles and runs `kernel` on each, on `pool` (null: inline).
void PagedAttentionWith(AttentionTileKernel kernel, const AttentionArgs& args, ThreadPool* pool);

}  // namespace internal
}  // namespace conveyor::kernels
