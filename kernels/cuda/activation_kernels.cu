// SwiGLU's gate: out = silu(gate) * up from the fused [gate; up] projection. Grid
// (token, column chunk) so a single decode token still spreads over many blocks;
// 16-byte accesses when the widths allow.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// `N` elements per access, ffn % N == 0.
template <typename T, int N>
__global__ void __launch_bounds__(kThreads)
    SiluMulKernel(const T* __restrict__ gate_up, int ffn, T* __restrict__ out) {
  const size_t t = blockIdx.x;
  const int c = (blockIdx.y * blockDim.x + threadIdx.x) * N;
  if (c >= ffn) return;
  float g[N], u[N], o[N];
  LoadFloats<N>(gate_up + t * 2 * ffn + c, g);
  LoadFloats<N>(gate_up + t * 2 * ffn + ffn + c, u);
#pragma unroll
  for (int i = 0; i < N; ++i) o[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
  StoreFloats<N>(out + t * ffn + c, o);
}

}  // namespace

cudaError_t LaunchSiluMul(const void* gate_up, int n, int ffn, void* out, DType dtype,
                          cudaStream_t stream) {
  if (n <= 0 || ffn <= 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    constexpr int kVec = 16 / sizeof(T);
    const T* gu = static_cast<const T*>(gate_up);
    T* o = static_cast<T*>(out);
    if (ffn % kVec == 0 && IsAligned(gu, 16) && IsAligned(o, 16)) {
      const dim3 grid(n, (ffn / kVec + kThreads - 1) / kThreads);
      SiluMulKernel<T, kVec><<<grid, kThreads, 0, stream>>>(gu, ffn, o);
    } else {
      const dim3 grid(n, (ffn + kThreads - 1) / kThreads);
      SiluMulKernel<T, 1><<<grid, kThreads, 0, stream>>>(gu, ffn, o);
    }
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
