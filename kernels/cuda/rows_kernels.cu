// Row copies: gathering rows by index (embedding lookup, GatherRows) and scattering K/V
// rows into their paged-cache slots. One block per row; 16-byte accesses when the row
// widths and pointers allow it, element copies otherwise.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 128;

// out[i, :] = table[rows[i], :]; `N` elements per access, hidden % N == 0.
template <typename T, int N>
__global__ void GatherRowsKernel(const T* __restrict__ table, int hidden,
                                 const int32_t* __restrict__ rows, T* __restrict__ out) {
  const int i = blockIdx.x;
  const T* src = table + static_cast<size_t>(rows[i]) * hidden;
  T* dst = out + static_cast<size_t>(i) * hidden;
  for (int c = threadIdx.x * N; c < hidden; c += blockDim.x * N) {
    *reinterpret_cast<Pack<T, N>*>(dst + c) = *reinterpret_cast<const Pack<T, N>*>(src + c);
  }
}

// Copies token t's K and V rows (`width` elements) into slot slot_mapping[t].
template <typename T, int N>
__global__ void WriteKvKernel(const T* __restrict__ k, const T* __restrict__ v, int row_stride,
                              int width, const int32_t* __restrict__ slots, T* __restrict__ cache_k,
                              T* __restrict__ cache_v) {
  const int t = blockIdx.x;
  const int slot = slots[t];
  if (slot < 0) return;
  const T* k_row = k + static_cast<size_t>(t) * row_stride;
  const T* v_row = v + static_cast<size_t>(t) * row_stride;
  T* k_dst = cache_k + static_cast<size_t>(slot) * width;
  T* v_dst = cache_v + static_cast<size_t>(slot) * width;
  for (int c = threadIdx.x * N; c < width; c += blockDim.x * N) {
    *reinterpret_cast<Pack<T, N>*>(k_dst + c) = *reinterpret_cast<const Pack<T, N>*>(k_row + c);
    *reinterpret_cast<Pack<T, N>*>(v_dst + c) = *reinterpret_cast<const Pack<T, N>*>(v_row + c);
  }
}

// One block per token: each thread owns columns c, c + blockDim.x, ... and sums the
// token's k weighted rows into them in order j = 0..k-1, in float32.
template <typename T>
__global__ void WeightedRowSumKernel(const T* __restrict__ rows, int width,
                                     const int32_t* __restrict__ sources,
                                     const float* __restrict__ weights, int k,
                                     T* __restrict__ out) {
  const int t = blockIdx.x;
  T* dst = out + static_cast<size_t>(t) * width;
  for (int c = threadIdx.x; c < width; c += blockDim.x) {
    float sum = 0.0f;
    for (int j = 0; j < k; ++j) {
      const size_t src = static_cast<size_t>(sources[t * k + j]) * width;
      sum += weights[t * k + j] * ToFloat(rows[src + c]);
    }
    dst[c] = FromFloat<T>(sum);
  }
}

}  // namespace

cudaError_t LaunchWeightedRowSum(const void* rows, int width, const int32_t* sources,
                                 const float* weights, int n, int k, void* out, DType dtype,
                                 cudaStream_t stream) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    WeightedRowSumKernel<T><<<n, kThreads, 0, stream>>>(static_cast<const T*>(rows), width, sources,
                                                        weights, k, static_cast<T*>(out));
    return cudaGetLastError();
  });
}

cudaError_t LaunchGatherRows(const void* table, int hidden, const int32_t* rows, int n, void* out,
                             DType dtype, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = 16 / sizeof(T);
    const T* src = static_cast<const T*>(table);
    T* dst = static_cast<T*>(out);
    if (hidden % kVec == 0 && IsAligned(src, 16) && IsAligned(dst, 16)) {
      GatherRowsKernel<T, kVec><<<n, kThreads, 0, stream>>>(src, hidden, rows, dst);
    } else {
      GatherRowsKernel<T, 1><<<n, kThreads, 0, stream>>>(src, hidden, rows, dst);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchWriteKv(const void* k, const void* v, int n, int row_stride, int width,
                          const int32_t* slot_mapping, void* cache_k, void* cache_v, DType dtype,
                          cudaStream_t stream) {
  if (n <= 0 || width <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = 16 / sizeof(T);
    const T* ks = static_cast<const T*>(k);
    const T* vs = static_cast<const T*>(v);
    T* kc = static_cast<T*>(cache_k);
    T* vc = static_cast<T*>(cache_v);
    const bool vectorized = width % kVec == 0 && row_stride % kVec == 0 && IsAligned(ks, 16) &&
                            IsAligned(vs, 16) && IsAligned(kc, 16) && IsAligned(vc, 16);
    if (vectorized) {
      WriteKvKernel<T, kVec>
          <<<n, kThreads, 0, stream>>>(ks, vs, row_stride, width, slot_mapping, kc, vc);
    } else {
      WriteKvKernel<T, 1>
          <<<n, kThreads, 0, stream>>>(ks, vs, row_stride, width, slot_mapping, kc, vc);
    }
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
