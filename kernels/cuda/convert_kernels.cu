// Element-wise conversions between float32 and the compute dtype (weight upload,
// activation download) and the bias add used when cuBLASLt cannot fuse the bias.
// Grid-stride loops: these run at load time or once per step on small tensors.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void F32ToComputeKernel(const float* __restrict__ src, T* __restrict__ dst,
                                   size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = FromFloat<T>(src[i]);
  }
}

template <typename T>
__global__ void ComputeToF32Kernel(const T* __restrict__ src, float* __restrict__ dst,
                                   size_t count) {
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    dst[i] = ToFloat(src[i]);
  }
}

template <typename T>
__global__ void AddBiasKernel(T* __restrict__ y, const T* __restrict__ bias, size_t rows, int cols,
                              int ld) {
  const size_t count = rows * cols;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    T& out = y[(i / cols) * ld + i % cols];
    out = FromFloat<T>(ToFloat(out) + ToFloat(bias[i % cols]));
  }
}

}  // namespace

cudaError_t LaunchF32ToCompute(const float* src, void* dst, size_t count, DType dtype,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    F32ToComputeKernel<T><<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(
        src, static_cast<T*>(dst), count);
    return cudaGetLastError();
  });
}

cudaError_t LaunchComputeToF32(const void* src, float* dst, size_t count, DType dtype,
                               cudaStream_t stream) {
  if (count == 0) return cudaSuccess;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    ComputeToF32Kernel<T><<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(
        static_cast<const T*>(src), dst, count);
    return cudaGetLastError();
  });
}

cudaError_t LaunchAddBias(void* y, const void* bias, int rows, int cols, int ld, DType dtype,
                          cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  if (ld < cols) return cudaErrorInvalidValue;
  const size_t count = static_cast<size_t>(rows) * cols;
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    AddBiasKernel<T><<<GridStrideBlocks(count, kThreads), kThreads, 0, stream>>>(
        static_cast<T*>(y), static_cast<const T*>(bias), static_cast<size_t>(rows), cols, ld);
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
