// Device-side helpers shared by the kernels: conversion between the 16-bit compute
// dtypes and float, vector loads/stores of a few elements at a time, warp and block
// reductions with a fixed order, and the dtype dispatch of the launchers.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {

template <typename T>
__device__ __forceinline__ float ToFloat(T x);
template <>
__device__ __forceinline__ float ToFloat<__nv_bfloat16>(__nv_bfloat16 x) {
  return __bfloat162float(x);
}
template <>
__device__ __forceinline__ float ToFloat<__half>(__half x) {
  return __half2float(x);
}

template <typename T>
__device__ __forceinline__ T FromFloat(float x);
template <>
__device__ __forceinline__ __nv_bfloat16 FromFloat<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}
template <>
__device__ __forceinline__ __half FromFloat<__half>(float x) {
  return __float2half_rn(x);
}

// N elements moved as one aligned access (N * sizeof(T) of 2, 4, 8 or 16 bytes).
template <typename T, int N>
struct alignas(sizeof(T) * N) Pack {
  T v[N];
};

// Loads N elements at `p` (aligned to N * sizeof(T)) as floats.
template <int N, typename T>
__device__ __forceinline__ void LoadFloats(const T* p, float (&out)[N]) {
  const Pack<T, N> pack = *reinterpret_cast<const Pack<T, N>*>(p);
#pragma unroll
  for (int i = 0; i < N; ++i) out[i] = ToFloat(pack.v[i]);
}

// Stores N floats at `p` (aligned to N * sizeof(T)), rounding to T.
template <int N, typename T>
__device__ __forceinline__ void StoreFloats(T* p, const float (&in)[N]) {
  Pack<T, N> pack;
#pragma unroll
  for (int i = 0; i < N; ++i) pack.v[i] = FromFloat<T>(in[i]);
  *reinterpret_cast<Pack<T, N>*>(p) = pack;
}

// Butterfly sum over the 32 lanes; every lane gets the same bits.
__device__ __forceinline__ float WarpSum(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

__device__ __forceinline__ float WarpMax(float x) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  }
  return x;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024), returned to every
// thread. The order depends only on blockDim.x. `shared` holds 32 floats; the call
// contains barriers, so every thread of the block must make it.
__device__ __forceinline__ float BlockSum(float x, float* shared) {
  const int lane = threadIdx.x % 32;
  const int warp = threadIdx.x / 32;
  const int num_warps = blockDim.x / 32;
  x = WarpSum(x);
  __syncthreads();  // `shared` may still be read by a previous call.
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  float total = lane < num_warps ? shared[lane] : 0.0f;
  return WarpSum(total);
}

// Whether `p` is aligned to `bytes`.
inline bool IsAligned(const void* p, size_t bytes) {
  return reinterpret_cast<uintptr_t>(p) % bytes == 0;
}

// Blocks for a grid-stride loop over `count` items with `threads` per block: enough to
// fill the GPU several times over, never more than the items need.
inline unsigned GridStrideBlocks(size_t count, int threads) {
  const size_t needed = (count + threads - 1) / threads;
  constexpr size_t kMaxBlocks = 4096;
  return static_cast<unsigned>(needed < kMaxBlocks ? needed : kMaxBlocks);
}

// Calls f(T{}) with T the CUDA type of `dtype`.
template <typename F>
cudaError_t DispatchDType(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kBf16:
      return f(__nv_bfloat16{});
    case DType::kFp16:
      return f(__half{});
  }
  return cudaErrorInvalidValue;
}

}  // namespace conveyor::kernels::cuda
