// Rotary position embedding (rotate-half convention, as in Llama and the CPU backend),
// applied in place to q and k of each token. One block per token; each thread rotates
// (x[i], x[i + half]) pairs of the token's q and k heads in float32.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 128;

template <typename T>
__global__ void __launch_bounds__(kThreads)
    RopeKernel(T* __restrict__ q, T* __restrict__ k, int row_stride,
               const int32_t* __restrict__ positions, const float* __restrict__ cos_table,
               const float* __restrict__ sin_table, int num_heads, int num_kv_heads, int head_dim) {
  const int t = blockIdx.x;
  const int half = head_dim / 2;
  const size_t table_row = static_cast<size_t>(positions[t]) * half;
  const int pairs = (num_heads + num_kv_heads) * half;
  for (int p = threadIdx.x; p < pairs; p += blockDim.x) {
    const int head = p / half;
    const int i = p % half;
    T* x = head < num_heads
               ? q + static_cast<size_t>(t) * row_stride + head * head_dim
               : k + static_cast<size_t>(t) * row_stride + (head - num_heads) * head_dim;
    const float cs = cos_table[table_row + i];
    const float sn = sin_table[table_row + i];
    const float x1 = ToFloat(x[i]);
    const float x2 = ToFloat(x[i + half]);
    x[i] = FromFloat<T>(x1 * cs - x2 * sn);
    x[i + half] = FromFloat<T>(x2 * cs + x1 * sn);
  }
}

}  // namespace

cudaError_t LaunchRope(void* q, void* k, int n, int row_stride, const int32_t* positions,
                       const float* rope_table, int max_positions, int num_heads, int num_kv_heads,
                       int head_dim, DType dtype, cudaStream_t stream) {
  if (n <= 0 || head_dim < 2) return cudaSuccess;
  const float* sin_table = rope_table + static_cast<size_t>(max_positions) * (head_dim / 2);
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    RopeKernel<T><<<n, kThreads, 0, stream>>>(static_cast<T*>(q), static_cast<T*>(k), row_stride,
                                              positions, rope_table, sin_table, num_heads,
                                              num_kv_heads, head_dim);
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
