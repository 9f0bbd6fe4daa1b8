// Paged attention over the flat mixed batch (prefill chunks and decode tokens of many
// sequences), split-KV style:
//
// 1. Partition kernel, grid (token, group of H query heads sharing one KV head,
//    partition). A block takes kAttentionPartitionTokens positions of the token's
//    context, reads each K/V row from its paged slot once for all H heads (GQA), and
//    computes scores, softmax and P·V in float32 for that partition. 4 warps split the
//    positions; inside a warp each lane owns E consecutive elements of head_dim.
//    A context of one partition writes the final output directly; otherwise the block
//    writes its normalized partial output, max and sum to scratch.
// 2. Reduce kernel, grid (token, head): merges a token's partitions in order,
//    rescaling each by exp(max_p - max) (the log-sum-exp merge).
//
// Partitions are always kAttentionPartitionTokens long and merged in a fixed order,
// so a token's output depends only on its own context, never on the batch. Blocks
// whose partition lies past a token's context exit at once; the grid is sized for the
// longest context the block tables can describe, as the host does not know positions.
//
// The kernel streams K/V through CUDA cores (no tensor cores): right for decode, where
// attention is bound by reading the cache, but a prefill chunk re-reads its context
// once per query token (from L2). A tiled tensor-core prefill kernel is future work.
#include <algorithm>
#include <cmath>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kPartition = kAttentionPartitionTokens;
// The reduce kernel keeps one weight per partition in shared memory.
constexpr int kMaxPartitions = 8192;

// Elements of head_dim per lane: the smallest of 2, 4, 8 with 32 lanes covering it.
int ElemsPerLane(int head_dim) { return head_dim <= 64 ? 2 : (head_dim <= 128 ? 4 : 8); }

// Query heads per block: the largest of 8, 4, 2, 1 that divides the GQA group.
int HeadsPerBlock(int group) {
  for (int h : {8, 4, 2}) {
    if (group % h == 0) return h;
  }
  return 1;
}

int MaxPartitions(const PagedAttentionArgs& a) {
  const int64_t max_context = static_cast<int64_t>(a.max_blocks_per_seq) * a.block_size;
  return static_cast<int>((max_context + kPartition - 1) / kPartition);
}

// Float32 scratch layout for one launch of `tokens` tokens: partial outputs
// [tokens, num_heads, max_parts, head_dim], then stats [tokens, num_heads, max_parts, 2]
// holding (max, sum) of each partition.
struct Partials {
  float* out;
  float* stats;
};
Partials PartialsIn(float* scratch, int tokens, int num_heads, int max_parts, int head_dim) {
  const size_t rows = static_cast<size_t>(tokens) * num_heads * max_parts;
  return {scratch, scratch + rows * head_dim};
}

template <typename T, int E, int H>
__global__ void __launch_bounds__(kThreads)
    AttentionPartitionKernel(const PagedAttentionArgs args, float* __restrict__ partial_out,
                             float* __restrict__ partial_stats, int max_parts) {
  // Scores [H][kPartition] during the softmax; later the per-warp P·V sums
  // [kWarps][H][E][32], laid out so that a warp's 32 lanes hit 32 different banks.
  constexpr int kScores = H * kPartition;
  constexpr int kWarpSums = kWarps * H * E * 32;
  __shared__ float work[kScores > kWarpSums ? kScores : kWarpSums];
  __shared__ int slots[kPartition];
  __shared__ float head_max[H];
  __shared__ float head_sum[H];

  const int t = blockIdx.x;
  const int part = blockIdx.z;
  const int context = args.token_pos[t] + 1;
  const int num_parts = (context + kPartition - 1) / kPartition;
  if (part >= num_parts) return;  // The whole block leaves; no barrier is skipped.

  const int head_dim = args.head_dim;
  const int head0 = blockIdx.y * H;
  const int kv_head = head0 / (args.num_heads / args.num_kv_heads);
  const int begin = part * kPartition;
  const int len = min(kPartition, context - begin);
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int d0 = lane * E;
  const bool active = d0 < head_dim;  // Lanes past head_dim hold zeros.

  // This partition's cache slots, looked up in the block table once.
  const int32_t* table =
      args.block_tables + static_cast<size_t>(args.token_seq[t]) * args.max_blocks_per_seq;
  for (int j = threadIdx.x; j < len; j += kThreads) {
    const int pos = begin + j;
    slots[j] = table[pos / args.block_size] * args.block_size + pos % args.block_size;
  }

  const T* q = static_cast<const T*>(args.q) + static_cast<size_t>(t) * args.q_row_stride +
               static_cast<size_t>(head0) * head_dim;
  float qf[H][E];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    if (active) {
      LoadFloats<E>(q + h * head_dim + d0, qf[h]);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) qf[h][e] = 0.0f;
    }
  }
  __syncthreads();

  const size_t slot_stride = static_cast<size_t>(args.num_kv_heads) * head_dim;
  const size_t head_offset = static_cast<size_t>(kv_head) * head_dim + d0;
  const T* k_cache = static_cast<const T*>(args.k_cache) + head_offset;
  const T* v_cache = static_cast<const T*>(args.v_cache) + head_offset;

  // Scores: warp w takes positions w, w + kWarps, ...; lanes split head_dim.
  float* scores = work;
#pragma unroll 2
  for (int j = warp; j < len; j += kWarps) {
    float kf[E];
    if (active) {
      LoadFloats<E>(k_cache + static_cast<size_t>(slots[j]) * slot_stride, kf);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) kf[e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < H; ++h) {
      float dot = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) dot = fmaf(qf[h][e], kf[e], dot);
      dot = WarpSum(dot);
      if (lane == 0) scores[h * kPartition + j] = dot * args.scale;
    }
  }
  __syncthreads();

  // Softmax numerators in place, with each head's max and sum.
  for (int h = warp; h < H; h += kWarps) {
    float* s = scores + h * kPartition;
    float m = -INFINITY;
    for (int j = lane; j < len; j += 32) m = fmaxf(m, s[j]);
    m = WarpMax(m);
    float sum = 0.0f;
    for (int j = lane; j < len; j += 32) {
      const float p = expf(s[j] - m);
      s[j] = p;
      sum += p;
    }
    sum = WarpSum(sum);
    if (lane == 0) {
      head_max[h] = m;
      head_sum[h] = sum;
    }
  }
  __syncthreads();

  // P·V: the same split of positions over warps.
  float acc[H][E];
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int e = 0; e < E; ++e) acc[h][e] = 0.0f;
  }
#pragma unroll 2
  for (int j = warp; j < len; j += kWarps) {
    float vf[E];
    if (active) {
      LoadFloats<E>(v_cache + static_cast<size_t>(slots[j]) * slot_stride, vf);
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) vf[e] = 0.0f;
    }
#pragma unroll
    for (int h = 0; h < H; ++h) {
      const float p = scores[h * kPartition + j];
#pragma unroll
      for (int e = 0; e < E; ++e) acc[h][e] = fmaf(p, vf[e], acc[h][e]);
    }
  }
  __syncthreads();  // Scores are dead: reuse `work` for the per-warp sums.
  float* warp_sums = work;
#pragma unroll
  for (int h = 0; h < H; ++h) {
#pragma unroll
    for (int e = 0; e < E; ++e) warp_sums[((warp * H + h) * E + e) * 32 + lane] = acc[h][e];
  }
  __syncthreads();

  const bool single = num_parts == 1;
  T* out = static_cast<T*>(args.out) + (static_cast<size_t>(t) * args.num_heads + head0) * head_dim;
  for (int i = threadIdx.x; i < H * head_dim; i += kThreads) {
    const int h = i / head_dim;
    const int d = i % head_dim;
    float o = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) o += warp_sums[((w * H + h) * E + d % E) * 32 + d / E];
    o *= 1.0f / head_sum[h];
    if (single) {
      out[i] = FromFloat<T>(o);
    } else {
      const size_t row = (static_cast<size_t>(t) * args.num_heads + head0 + h) * max_parts + part;
      partial_out[row * head_dim + d] = o;
    }
  }
  if (!single && threadIdx.x < H) {
    const size_t row =
        (static_cast<size_t>(t) * args.num_heads + head0 + threadIdx.x) * max_parts + part;
    partial_stats[2 * row] = head_max[threadIdx.x];
    partial_stats[2 * row + 1] = head_sum[threadIdx.x];
  }
}

// Merges the partitions of (token blockIdx.x, head blockIdx.y) in partition order.
template <typename T>
__global__ void __launch_bounds__(kThreads)
    AttentionReduceKernel(const PagedAttentionArgs args, const float* __restrict__ partial_out,
                          const float* __restrict__ partial_stats, int max_parts) {
  extern __shared__ float weights[];  // [num_parts]
  const int t = blockIdx.x;
  const int h = blockIdx.y;
  const int context = args.token_pos[t] + 1;
  const int num_parts = (context + kPartition - 1) / kPartition;
  if (num_parts == 1) return;  // The partition kernel wrote the output.

  const size_t row0 = (static_cast<size_t>(t) * args.num_heads + h) * max_parts;
  const float* stats = partial_stats + 2 * row0;
  // Every thread computes the max and the total in the same order: same bits.
  float global_max = -INFINITY;
  for (int p = 0; p < num_parts; ++p) global_max = fmaxf(global_max, stats[2 * p]);
  for (int p = threadIdx.x; p < num_parts; p += blockDim.x) {
    weights[p] = stats[2 * p + 1] * expf(stats[2 * p] - global_max);
  }
  __syncthreads();
  float total = 0.0f;
  for (int p = 0; p < num_parts; ++p) total += weights[p];
  const float inv_total = 1.0f / total;

  const int head_dim = args.head_dim;
  const float* po = partial_out + row0 * head_dim;
  T* out = static_cast<T*>(args.out) + (static_cast<size_t>(t) * args.num_heads + h) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float o = 0.0f;
    for (int p = 0; p < num_parts; ++p) o = fmaf(weights[p], po[p * head_dim + d], o);
    out[d] = FromFloat<T>(o * inv_total);
  }
}

template <typename T, int E, int H>
cudaError_t LaunchChunk(const PagedAttentionArgs& args, float* scratch, int max_parts,
                        cudaStream_t stream) {
  const Partials partials =
      PartialsIn(scratch, args.num_tokens, args.num_heads, max_parts, args.head_dim);
  const dim3 grid(args.num_tokens, args.num_heads / H, max_parts);
  AttentionPartitionKernel<T, E, H>
      <<<grid, kThreads, 0, stream>>>(args, partials.out, partials.stats, max_parts);
  if (cudaError_t err = cudaGetLastError(); err != cudaSuccess) return err;
  if (max_parts == 1) return cudaSuccess;
  AttentionReduceKernel<T>
      <<<dim3(args.num_tokens, args.num_heads), kThreads, max_parts * sizeof(float), stream>>>(
          args, partials.out, partials.stats, max_parts);
  return cudaGetLastError();
}

template <typename T, int E>
cudaError_t LaunchChunkForHeads(int heads_per_block, const PagedAttentionArgs& args, float* scratch,
                                int max_parts, cudaStream_t stream) {
  switch (heads_per_block) {
    case 8:
      return LaunchChunk<T, E, 8>(args, scratch, max_parts, stream);
    case 4:
      return LaunchChunk<T, E, 4>(args, scratch, max_parts, stream);
    case 2:
      return LaunchChunk<T, E, 2>(args, scratch, max_parts, stream);
    default:
      return LaunchChunk<T, E, 1>(args, scratch, max_parts, stream);
  }
}

template <typename T>
cudaError_t LaunchChunkForShape(const PagedAttentionArgs& args, float* scratch, int max_parts,
                                cudaStream_t stream) {
  const int heads_per_block = HeadsPerBlock(args.num_heads / args.num_kv_heads);
  switch (ElemsPerLane(args.head_dim)) {
    case 2:
      return LaunchChunkForHeads<T, 2>(heads_per_block, args, scratch, max_parts, stream);
    case 4:
      return LaunchChunkForHeads<T, 4>(heads_per_block, args, scratch, max_parts, stream);
    default:
      return LaunchChunkForHeads<T, 8>(heads_per_block, args, scratch, max_parts, stream);
  }
}

}  // namespace

const char* CheckPagedAttentionShape(const PagedAttentionArgs& a, DType dtype) {
  if (a.num_heads <= 0 || a.num_kv_heads <= 0 || a.num_heads % a.num_kv_heads != 0) {
    return "num_heads must be a positive multiple of num_kv_heads";
  }
  if (a.head_dim < 2 || a.head_dim > kMaxAttentionHeadDim || a.head_dim % 2 != 0) {
    return "head_dim must be even and at most 256";
  }
  const int e = ElemsPerLane(a.head_dim);
  if (a.head_dim % e != 0) {
    return "head_dim must be a multiple of 4 above 64 and of 8 above 128";
  }
  if (a.block_size <= 0 || a.max_blocks_per_seq <= 0) {
    return "block_size and max_blocks_per_seq must be positive";
  }
  if (MaxPartitions(a) > kMaxPartitions) return "block tables describe too long a context";
  const size_t access_bytes = e * DTypeBytes(dtype);
  if (a.q_row_stride % e != 0 || !IsAligned(a.q, access_bytes) ||
      !IsAligned(a.k_cache, access_bytes) || !IsAligned(a.v_cache, access_bytes)) {
    return "q, its row stride and the KV cache must be aligned to the vector width";
  }
  return nullptr;
}

size_t PagedAttentionScratchBytesPerToken(const PagedAttentionArgs& a) {
  const int max_parts = MaxPartitions(a);
  if (max_parts <= 1) return 0;
  return static_cast<size_t>(a.num_heads) * max_parts * (a.head_dim + 2) * sizeof(float);
}

cudaError_t LaunchPagedAttention(const PagedAttentionArgs& args, float* scratch,
                                 int tokens_per_launch, DType dtype, cudaStream_t stream) {
  if (args.num_tokens <= 0) return cudaSuccess;
  if (tokens_per_launch <= 0) return cudaErrorInvalidValue;
  const int max_parts = MaxPartitions(args);
  const size_t elem = DTypeBytes(dtype);
  for (int t0 = 0; t0 < args.num_tokens; t0 += tokens_per_launch) {
    PagedAttentionArgs chunk = args;
    chunk.num_tokens = std::min(tokens_per_launch, args.num_tokens - t0);
    chunk.q = static_cast<const char*>(args.q) + static_cast<size_t>(t0) * args.q_row_stride * elem;
    chunk.out = static_cast<char*>(args.out) +
                static_cast<size_t>(t0) * args.num_heads * args.head_dim * elem;
    chunk.token_seq = args.token_seq + t0;
    chunk.token_pos = args.token_pos + t0;
    const cudaError_t err = DispatchDType(dtype, [&](auto t) {
      return LaunchChunkForShape<decltype(t)>(chunk, scratch, max_parts, stream);
    });
    if (err != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace conveyor::kernels::cuda
