// RMSNorm and the fused residual-add + RMSNorm. One block per row: each thread sums
// the squares of its strided slice in float32, a fixed-shape block reduction combines
// them (so a row's result never depends on the batch), then a second pass over the
// row (an L1/L2 hit) scales it. The weight is float32.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// kAdd: residual = T(residual + x), then normalize residual. Otherwise normalize x.
// `N` elements per access, hidden % N == 0.
template <typename T, int N, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    RmsNormKernel(T* __restrict__ residual, const T* __restrict__ x,
                  const float* __restrict__ weight, int hidden, float eps, T* __restrict__ out) {
  __shared__ float shared[32];
  const size_t row_offset = static_cast<size_t>(blockIdx.x) * hidden;
  const T* in = (kAdd ? residual : x) + row_offset;
  float sum_squares = 0.0f;
  for (int c = threadIdx.x * N; c < hidden; c += blockDim.x * N) {
    float v[N];
    LoadFloats<N>(in + c, v);
    if constexpr (kAdd) {
      float a[N];
      LoadFloats<N>(x + row_offset + c, a);
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] += a[i];
      StoreFloats<N>(residual + row_offset + c, v);
      // Normalize the residual as stored, so the next layer sees what this one used.
#pragma unroll
      for (int i = 0; i < N; ++i) v[i] = ToFloat(FromFloat<T>(v[i]));
    }
#pragma unroll
    for (int i = 0; i < N; ++i) sum_squares += v[i] * v[i];
  }
  const float total = BlockSum(sum_squares, shared);
  const float inv_rms = 1.0f / sqrtf(total / hidden + eps);
  T* out_row = out + row_offset;
  for (int c = threadIdx.x * N; c < hidden; c += blockDim.x * N) {
    float v[N];
    LoadFloats<N>(in + c, v);  // Rereads this thread's own writes when kAdd.
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = v[i] * inv_rms * weight[c + i];
    StoreFloats<N>(out_row + c, v);
  }
}

template <bool kAdd>
cudaError_t LaunchNorm(void* residual, const void* x, const float* weight, int n, int hidden,
                       float eps, void* out, DType dtype, cudaStream_t stream) {
  if (n <= 0 || hidden <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = 16 / sizeof(T);
    T* res = static_cast<T*>(residual);
    const T* xs = static_cast<const T*>(x);
    T* o = static_cast<T*>(out);
    const bool vectorized = hidden % kVec == 0 && IsAligned(xs, 16) && IsAligned(o, 16) &&
                            (!kAdd || IsAligned(res, 16));
    if (vectorized) {
      RmsNormKernel<T, kVec, kAdd><<<n, kThreads, 0, stream>>>(res, xs, weight, hidden, eps, o);
    } else {
      RmsNormKernel<T, 1, kAdd><<<n, kThreads, 0, stream>>>(res, xs, weight, hidden, eps, o);
    }
    return cudaGetLastError();
  });
}

// One warp per (token, head): lane i sums the squares of elements i, i + 32, ... in
// float32, a fixed warp reduction combines them, then the head is scaled in place.
template <typename T>
__global__ void HeadRmsNormKernel(T* __restrict__ x, int row_stride, int num_heads, int head_dim,
                                  const float* __restrict__ weight, float eps) {
  const int head = blockIdx.y * blockDim.y + threadIdx.y;
  if (head >= num_heads) return;
  T* h = x + static_cast<size_t>(blockIdx.x) * row_stride + static_cast<size_t>(head) * head_dim;
  float sum_squares = 0.0f;
  for (int c = threadIdx.x; c < head_dim; c += 32) {
    const float v = ToFloat(h[c]);
    sum_squares += v * v;
  }
  const float inv_rms = 1.0f / sqrtf(WarpSum(sum_squares) / head_dim + eps);
  for (int c = threadIdx.x; c < head_dim; c += 32) {
    h[c] = FromFloat<T>(ToFloat(h[c]) * inv_rms * weight[c]);
  }
}

}  // namespace

cudaError_t LaunchHeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim,
                              const float* weight, float eps, DType dtype, cudaStream_t stream) {
  if (n <= 0 || num_heads <= 0 || head_dim <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kHeadsPerBlock = 4;
    const dim3 block(32, kHeadsPerBlock);
    const dim3 grid(n, (num_heads + kHeadsPerBlock - 1) / kHeadsPerBlock);
    HeadRmsNormKernel<T><<<grid, block, 0, stream>>>(static_cast<T*>(x), row_stride, num_heads,
                                                     head_dim, weight, eps);
    return cudaGetLastError();
  });
}

cudaError_t LaunchRmsNorm(const void* x, const float* weight, int n, int hidden, float eps,
                          void* out, DType dtype, cudaStream_t stream) {
  return LaunchNorm<false>(nullptr, x, weight, n, hidden, eps, out, dtype, stream);
}

cudaError_t LaunchAddRmsNorm(void* residual, const void* x, const float* weight, int n, int hidden,
                             float eps, void* out, DType dtype, cudaStream_t stream) {
  return LaunchNorm<true>(residual, x, weight, n, hidden, eps, out, dtype, stream);
}

}  // namespace conveyor::kernels::cuda
