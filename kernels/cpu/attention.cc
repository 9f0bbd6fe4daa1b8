#include "kernels/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm_kernels.h"  // FromBf16
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace internal {

namespace {

float Widen(float x) { return x; }
float Widen(uint16_t bf16) { return FromBf16(bf16); }

template <typename T>
void PortableTile(const AttentionArgs& args, const AttentionTile& tile) {
  const T* k_cache = static_cast<const T*>(args.k_cache);
  const T* v_cache = static_cast<const T*>(args.v_cache);
  const AttentionBatch& batch = *args.batch;
  const AttentionShape& shape = args.shape;
  const int d = shape.head_dim;
  const int group = shape.num_heads / shape.num_kv_heads;
  const CpuKvLayout layout{shape.num_kv_heads, d, batch.block_size};
  const int32_t* table =
      batch.block_tables +
      static_cast<size_t>(batch.token_seq[tile.first_token]) * batch.max_blocks_per_seq;
  // Calls fn(j, base, offset) for each position j < context, in order, walking the block
  // table block by block: the position is slot `offset` of the block whose KV head
  // starts at float `base` (CpuKvLayout).
  auto for_each_position = [&](int context, auto&& fn) {
    for (int block = 0, j = 0; j < context; ++block) {
      const size_t base = layout.HeadBase(table[block], tile.kv_head);
      for (int offset = 0; offset < batch.block_size && j < context; ++offset, ++j) {
        fn(j, base, offset);
      }
    }
  };
  thread_local std::vector<float> scores;  // [group][context]
  thread_local std::vector<float> acc;     // [group][d]
  thread_local std::vector<double> denom;  // [group]
  for (int i = 0; i < tile.num_tokens; ++i) {
    const int t = tile.first_token + i;
    const int context = batch.token_pos[t] + 1;
    const float* q = args.q + static_cast<size_t>(t) * args.q_row_stride +
                     static_cast<size_t>(tile.kv_head) * group * d;
    scores.resize(static_cast<size_t>(group) * context);
    // Each K row is read once for all query heads of the group.
    for_each_position(context, [&](int j, size_t base, int offset) {
      const T* k = k_cache + base + offset;  // Coordinate c at k[c * block_size].
      for (int g = 0; g < group; ++g) {
        const float* qg = q + static_cast<size_t>(g) * d;
        float dot = 0.0f;
        for (int c = 0; c < d; ++c) {
          dot += qg[c] * Widen(k[static_cast<size_t>(c) * batch.block_size]);
        }
        scores[static_cast<size_t>(g) * context + j] = dot * shape.scale;
      }
    });
    denom.assign(group, 0.0);
    for (int g = 0; g < group; ++g) {
      float* s = scores.data() + static_cast<size_t>(g) * context;
      const float max_score = *std::max_element(s, s + context);
      for (int j = 0; j < context; ++j) {
        s[j] = std::exp(s[j] - max_score);
        denom[g] += s[j];
      }
    }
    acc.assign(static_cast<size_t>(group) * d, 0.0f);
    for_each_position(context, [&](int j, size_t base, int offset) {
      const T* v = v_cache + base + static_cast<size_t>(offset) * d;
      for (int g = 0; g < group; ++g) {
        const float p = scores[static_cast<size_t>(g) * context + j];
        float* ag = acc.data() + static_cast<size_t>(g) * d;
        for (int c = 0; c < d; ++c) ag[c] += p * Widen(v[c]);
      }
    });
    float* out = args.out + static_cast<size_t>(t) * shape.num_heads * d +
                 static_cast<size_t>(tile.kv_head) * group * d;
    for (int g = 0; g < group; ++g) {
      const float inv = static_cast<float>(1.0 / denom[g]);
      for (int c = 0; c < d; ++c) {
        out[static_cast<size_t>(g) * d + c] = acc[static_cast<size_t>(g) * d + c] * inv;
      }
    }
  }
}

}  // namespace

void AttentionTilePortable(const AttentionArgs& args, const AttentionTile& tile) {
  if (args.kv_dtype == CpuKvDtype::kBf16) return PortableTile<uint16_t>(args, tile);
  PortableTile<float>(args, tile);
}

void PagedAttentionWith(AttentionTileKernel kernel, const AttentionArgs& args, ThreadPool* pool) {
  const AttentionBatch& batch = *args.batch;
  const int num_kv_heads = args.shape.num_kv_heads;
  const int group = args.shape.num_heads / num_kv_heads;
  // About 48 query rows per tile: enough to amortize loading (and transposing) each K
  // chunk, few enough that the tile's accumulators stay in L1/L2. Tiles end at multiples
  // of this power of two, so they line up with the 16-position chunks and the causal
  // diagonal cuts through as few chunks as it can.
  const int max_tile_tokens =
      static_cast<int>(std::bit_floor(static_cast<unsigned>(std::clamp(48 / group, 1, 64))));
  struct Item {
    AttentionTile tile;
    int64_t cost;  // Query rows x positions, for ordering.
  };
  std::vector<Item> items;
  for (int t = 0; t < batch.num_tokens;) {
    int len = 1;
    while (t + len < batch.num_tokens && len < max_tile_tokens &&
           batch.token_seq[t + len] == batch.token_seq[t] &&
           batch.token_pos[t + len] == batch.token_pos[t] + len &&
           batch.token_pos[t + len] % max_tile_tokens != 0) {
      ++len;
    }
    const int64_t cost = static_cast<int64_t>(len) * (batch.token_pos[t] + len);
    for (int h = 0; h < num_kv_heads; ++h) items.push_back({{t, len, h}, cost});
    t += len;
  }
  // Largest first, so the long tiles of a prefill do not start last and leave threads
  // idle at the end.
  std::stable_sort(items.begin(), items.end(),
                   [](const Item& a, const Item& b) { return a.cost > b.cost; });
  auto run = [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) kernel(args, items[i].tile);
  };
  if (pool == nullptr) {
    run(0, static_cast<int64_t>(items.size()));
  } else {
    pool->ParallelFor(static_cast<int64_t>(items.size()), 1, run);
  }
}

}  // namespace internal

void PagedAttentionCpu(const float* q, int q_row_stride, const AttentionBatch& batch,
                       const AttentionShape& shape, KvLayer layer, CpuKvDtype kv_dtype, float* out,
                       ThreadPool* pool) {
  internal::AttentionArgs args;
  args.q = q;
  args.q_row_stride = q_row_stride;
  args.batch = &batch;
  args.shape = shape;
  args.k_cache = layer.k;
  args.v_cache = layer.v;
  args.kv_dtype = kv_dtype;
  args.out = out;
  // The choice depends only on the CPU and the model, so every token of every batch
  // takes the same kernel; AVX-512 and AVX2 give the same bits.
  const internal::AttentionTileKernel kernel = shape.head_dim % 16 == 0
                                                   ? internal::ActiveCpuKernels().attention_tile
                                                   : internal::AttentionTilePortable;
  internal::PagedAttentionWith(kernel, args, pool);
}

}  // namespace conveyor::kernels
