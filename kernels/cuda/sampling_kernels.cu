// Sampling on the device: the host sampler's semantics (model/sampler.cc) for a batch
// of logit rows, so that only token ids (and requested log-probabilities) leave the GPU.
//
//   1. Prepare, one block per row: read the row out of the all-gathered logits
//      ([world, rows, shard] in the compute dtype) into float32 work space; log-softmax
//      normaliser and the top-n log-probabilities of the raw logits; the penalties; the
//      argmax, which is the answer for greedy rows. Rows that draw get ids 0..V-1.
//   2. Sort each drawing row by penalised logit, descending, stably (cub's segmented
//      sort): (logit desc, id asc), the order in which the host sampler's top-k, top-p,
//      min-p and inverse CDF are defined.
//   3. Draw, one block per drawing row: weights exp((l - max) / T) over the top-k prefix,
//      the min-p prefix, the top-p prefix (shortest reaching top_p of the top-k mass),
//      then the first prefix reaching u times the kept mass, u from the counter-based
//      stream of (seed, draw index) that the host sampler uses.
// Sums run in double in a fixed order, so a row's result depends on nothing else in the
// batch and repeats bit for bit.
#include <cub/block/block_reduce.cuh>
#include <cub/block/block_scan.cuh>
#include <cub/device/device_segmented_sort.cuh>

#include <cfloat>
#include <climits>

#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// worker::UniformFromCounter, bit for bit.
__device__ __forceinline__ double UniformFromCounter(uint64_t seed, uint64_t index) {
  const uint64_t bits = Mix64(Mix64(seed) + (index + 1) * 0x9e3779b97f4a7c15ULL);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// Logit v of row `row` in the all-gathered layout [world, rows, shard].
template <typename T>
__device__ __forceinline__ float RawLogit(const T* logits, int rows, int shard, int row, int v) {
  const int part = v / shard;
  return ToFloat(logits[(static_cast<size_t>(part) * rows + row) * shard + (v - part * shard)]);
}

struct Candidate {
  float value;
  int id;
};

// (value desc, id asc): whether a comes before b.
__device__ __forceinline__ bool Before(Candidate a, Candidate b) {
  return a.value > b.value || (a.value == b.value && a.id < b.id);
}

__device__ __forceinline__ Candidate WarpFirst(Candidate c) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    Candidate other{__shfl_xor_sync(0xffffffffu, c.value, offset),
                    __shfl_xor_sync(0xffffffffu, c.id, offset)};
    if (Before(other, c)) c = other;
  }
  return c;
}

// The first candidate of the block in (value desc, id asc) order, to every thread.
__device__ Candidate BlockFirst(Candidate c, Candidate* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  c = WarpFirst(c);
  __syncthreads();
  if (lane == 0) shared[warp] = c;
  __syncthreads();
  c = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : Candidate{-INFINITY, INT_MAX};
  return WarpFirst(c);
}

__device__ float BlockMaxF(float x, float* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  x = WarpMax(x);
  __syncthreads();
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < static_cast<int>(blockDim.x / 32) ? shared[lane] : -INFINITY;
  return WarpMax(x);
}

using DoubleReduce = cub::BlockReduce<double, kThreads>;
using IntReduce = cub::BlockReduce<int, kThreads>;
using DoubleScan = cub::BlockScan<double, kThreads>;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    PrepareKernel(const T* __restrict__ logits, int layout_rows, int shard, int vocab,
                  const SampleRowParams* __restrict__ params,
                  const PenaltyEntry* __restrict__ penalties, float* __restrict__ work,
                  int32_t* __restrict__ ids, float* __restrict__ row_lse,
                  SampleRowResult* __restrict__ results) {
  __shared__ Candidate candidates[32];
  __shared__ float floats[32];
  __shared__ typename DoubleReduce::TempStorage reduce;
  const int row = blockIdx.x;
  const SampleRowParams p = params[row];
  float* w = work + static_cast<size_t>(row) * vocab;
  SampleRowResult* result = results + row;

  float max_logit = -INFINITY;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const float x = RawLogit(logits, layout_rows, shard, row, v);
    w[v] = x;
    max_logit = fmaxf(max_logit, x);
  }
  max_logit = BlockMaxF(max_logit, floats);

  // The raw distribution's normaliser: log-probabilities describe the model.
  const bool need_lse = p.want_logprob || p.num_logprobs > 0;
  float lse = -INFINITY;  // Every token impossible: every log-probability is -inf.
  if (need_lse && max_logit != -INFINITY) {
    double sum = 0.0;
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) sum += exp(double(w[v]) - max_logit);
    sum = DoubleReduce(reduce).Sum(sum);  // Valid in thread 0.
    __shared__ float shared_lse;
    if (threadIdx.x == 0) shared_lse = max_logit + static_cast<float>(log(sum));
    __syncthreads();
    lse = shared_lse;
  }
  // Top-n of the raw logits: each round takes the first candidate after the previous one
  // in (value desc, id asc) order.
  const int num_logprobs = min(p.num_logprobs, min(kMaxSampleLogprobs, vocab));
  Candidate previous{INFINITY, -1};
  for (int k = 0; k < num_logprobs; ++k) {
    Candidate best{-INFINITY, INT_MAX};
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
      const Candidate c{w[v], v};
      if (Before(previous, c) && Before(c, best)) best = c;
    }
    best = BlockFirst(best, candidates);
    if (threadIdx.x == 0) {
      result->top_ids[k] = best.id;
      result->top_logprobs[k] = lse == -INFINITY ? -INFINITY : best.value - lse;
    }
    previous = best;
  }
  if (threadIdx.x == 0) result->num_top = num_logprobs;
  __syncthreads();  // Every raw read of w is done.

  // Penalties: one entry per distinct token, so no two threads touch one logit.
  for (int e = p.penalty_begin + threadIdx.x; e < p.penalty_end; e += blockDim.x) {
    const PenaltyEntry entry = penalties[e];
    if (entry.token < 0 || entry.token >= vocab) continue;
    float x = w[entry.token];
    if (entry.in_context && p.repetition_penalty != 1.0f) {
      x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
    }
    if (entry.output_count > 0) {
      x -= static_cast<float>(entry.output_count) * p.frequency_penalty + p.presence_penalty;
    }
    w[entry.token] = x;
  }
  __syncthreads();

  Candidate best{-INFINITY, INT_MAX};
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
    const Candidate c{w[v], v};
    if (Before(c, best)) best = c;
  }
  best = BlockFirst(best, candidates);
  if (p.temperature == 0.0f) {
    if (threadIdx.x == 0) {
      result->token_id = best.id;
      result->logprob = need_lse ? RawLogit(logits, layout_rows, shard, row, best.id) - lse : 0.0f;
    }
    return;
  }
  // A drawing row: ids for the sort (the draw falls back to the argmax when every logit
  // is -inf, as the host sampler does).
  int32_t* row_ids = ids + static_cast<size_t>(row) * vocab;
  for (int v = threadIdx.x; v < vocab; v += blockDim.x) row_ids[v] = v;
  if (threadIdx.x == 0) row_lse[row] = lse;
}

// The first i in [0, n) where Σ_{j<=i} weight(j) reaches `target`, or n if none; the
// sum up to and including it (all n if none) in *reached. Fixed order: tiles of the
// block size, each scanned by cub, carried in order.
template <typename WeightFn>
__device__ int FirstReaching(int n, double target, WeightFn weight,
                             typename DoubleScan::TempStorage& scan, double* reached) {
  __shared__ int found;
  __shared__ double found_sum;
  double carry = 0.0;
  for (int base = 0; base < n; base += blockDim.x) {
    const int i = base + threadIdx.x;
    const double w = i < n ? weight(i) : 0.0;
    double inclusive, aggregate;
    if (threadIdx.x == 0) found = INT_MAX;
    __syncthreads();
    DoubleScan(scan).InclusiveSum(w, inclusive, aggregate);
    inclusive += carry;
    if (i < n && inclusive >= target) atomicMin(&found, i);
    __syncthreads();
    const int first = found;
    if (first != INT_MAX) {
      if (i == first) found_sum = inclusive;
      __syncthreads();
      *reached = found_sum;
      return first;
    }
    carry += aggregate;
    __syncthreads();  // The scan's storage and `found` are reused.
  }
  *reached = carry;
  return n;
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
    DrawKernel(const T* __restrict__ logits, int layout_rows, int shard, int vocab,
               const SampleRowParams* __restrict__ params, const int32_t* __restrict__ draw_rows,
               const float* __restrict__ sorted_logits, const int32_t* __restrict__ sorted_ids,
               const float* __restrict__ row_lse, SampleRowResult* __restrict__ results) {
  __shared__ typename DoubleReduce::TempStorage reduce_d;
  __shared__ typename IntReduce::TempStorage reduce_i;
  __shared__ typename DoubleScan::TempStorage scan;
  __shared__ double shared_total, shared_kept_total;
  __shared__ int shared_kept;
  const int row = draw_rows[blockIdx.x];
  const SampleRowParams p = params[row];
  const float* keys = sorted_logits + static_cast<size_t>(row) * vocab;
  const int32_t* ids = sorted_ids + static_cast<size_t>(row) * vocab;
  SampleRowResult* result = results + row;
  const bool need_lse = p.want_logprob || p.num_logprobs > 0;
  const float max_logit = keys[0];
  auto finish = [&](int index) {
    if (threadIdx.x != 0) return;
    const int token = ids[index];
    result->token_id = token;
    result->logprob =
        need_lse ? RawLogit(logits, layout_rows, shard, row, token) - row_lse[row] : 0.0f;
  };
  // No distribution to draw from (every logit -inf, or a penalty overflowed one to +inf,
  // whose weight would be NaN): greedy, as the host sampler does.
  if (!isfinite(max_logit)) {
    finish(0);
    return;
  }
  const float temperature = p.temperature;
  auto weight_at = [&](int i) { return expf((keys[i] - max_logit) / temperature); };

  // Top-k prefix; within it, min-p keeps the prefix of weights >= min_p (and > 0) and the
  // total over the top-k prefix is what top-p is a share of.
  const int top_k = p.top_k > 0 && p.top_k < vocab ? p.top_k : vocab;
  const float min_weight = fminf(p.min_p, 1.0f);
  double total = 0.0, kept_total = 0.0;
  int kept = 0;
  for (int i = threadIdx.x; i < top_k; i += blockDim.x) {
    const float w = weight_at(i);
    total += w;
    if (w > 0.0f && w >= min_weight) {
      ++kept;
      kept_total += w;
    }
  }
  total = DoubleReduce(reduce_d).Sum(total);
  __syncthreads();
  kept_total = DoubleReduce(reduce_d).Sum(kept_total);
  kept = IntReduce(reduce_i).Sum(kept);
  if (threadIdx.x == 0) {
    shared_total = total;
    shared_kept_total = kept_total;
    shared_kept = kept;
  }
  __syncthreads();
  total = shared_total;
  kept_total = shared_kept_total;
  kept = shared_kept;

  auto weight_d = [&](int i) { return static_cast<double>(weight_at(i)); };
  if (p.top_p < 1.0f) {
    double reached = 0.0;
    const int end =
        FirstReaching(kept, static_cast<double>(p.top_p) * total, weight_d, scan, &reached);
    if (end < kept) {
      kept = end + 1;
      kept_total = reached;
    }
    __syncthreads();
  }
  const double u = UniformFromCounter(p.seed, p.draw_index);
  double reached = 0.0;
  const int drawn = FirstReaching(kept, u * kept_total, weight_d, scan, &reached);
  finish(min(drawn, kept - 1));
}

}  // namespace

cudaError_t LaunchSamplePrepare(const void* logits, int rows, int layout_rows, int shard, int vocab,
                                const SampleRowParams* params, const PenaltyEntry* penalties,
                                float* work, int32_t* ids, float* row_lse, SampleRowResult* results,
                                DType dtype, cudaStream_t stream) {
  if (rows <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    PrepareKernel<T><<<rows, kThreads, 0, stream>>>(static_cast<const T*>(logits), layout_rows,
                                                    shard, vocab, params, penalties, work, ids,
                                                    row_lse, results);
    return cudaGetLastError();
  });
}

cudaError_t SortRowsDescending(void* temp, size_t* temp_bytes, const float* keys_in,
                               float* keys_out, const int32_t* ids_in, int32_t* ids_out,
                               int64_t num_items, int num_segments, const int32_t* segment_begin,
                               const int32_t* segment_end, cudaStream_t stream) {
  return cub::DeviceSegmentedSort::StableSortPairsDescending(
      temp, *temp_bytes, keys_in, keys_out, ids_in, ids_out, num_items, num_segments, segment_begin,
      segment_end, stream);
}

cudaError_t LaunchSampleDraw(const void* logits, int layout_rows, int shard, int vocab,
                             const SampleRowParams* params, const int32_t* draw_rows, int num_draw,
                             const float* sorted_logits, const int32_t* sorted_ids,
                             const float* row_lse, SampleRowResult* results, DType dtype,
                             cudaStream_t stream) {
  if (num_draw <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    DrawKernel<T><<<num_draw, kThreads, 0, stream>>>(static_cast<const T*>(logits), layout_rows,
                                                     shard, vocab, params, draw_rows, sorted_logits,
                                                     sorted_ids, row_lse, results);
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
