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

#include <cstdint>

#include "kernels/backend.h"

namespace conveyor::kernels {

class ThreadPool;

// out[t, h, :] for every token t and query head h, as Backend::PagedAttention specifies
// (float32 q, cache and out). Runs on `pool` (null: the calling thread).
void PagedAttentionCpu(const float* q, int q_row_stride, const AttentionBatch& batch,
                       const AttentionShape& shape, KvLayer layer, float* out, ThreadPool* pool);

namespace internal {

// Positions per softmax chunk: one AVX-512 register of scores (two AVX2 registers).
inline constexpr int kAttentionChunk = 16;

struct AttentionArgs {
  const float* q = nullptr;
  int q_row_stride = 0;
  const AttentionBatch* batch = nullptr;
  AttentionShape shape;
  const float* k_cache = nullptr;
  const float* v_cache = nullptr;
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
