// Weight-only quantized linear layers in the layout of quant_layout.h: a fused decode GEMV
// (weights dequantized in registers) and the dequantization of rows into a weight tile
// for the GEMM. Both read a row's weights eight at a time: eight codes are one 4- or
// 8-byte load, and eight consecutive weights always share one group's scale (groups are
// multiples of 8), so the per-weight work is one integer subtraction and two roundings.
#include "kernels/cuda/dtype.cuh"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {
namespace {

constexpr int kWeightsPerLoad = 8;
// GEMV: warps per block, each one output row.
constexpr int kGemvWarps = 8;
constexpr int kDequantizeThreads = 256;

// The eight codes of weights col..col+7 (col a multiple of 8) of a row.
template <int kBits>
__device__ __forceinline__ void LoadCodes(const uint8_t* row_codes, int col,
                                          int (&codes)[kWeightsPerLoad]) {
  if constexpr (kBits == 4) {
    // Little-endian: weight col + j is nibble j of the word (low nibble first).
    const uint32_t word = *reinterpret_cast<const uint32_t*>(row_codes + col / 2);
#pragma unroll
    for (int j = 0; j < kWeightsPerLoad; ++j) codes[j] = static_cast<int>((word >> (4 * j)) & 0xfu);
  } else {
    const uint2 words = *reinterpret_cast<const uint2*>(row_codes + col);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      codes[j] = static_cast<int>((words.x >> (8 * j)) & 0xffu);
      codes[j + 4] = static_cast<int>((words.y >> (8 * j)) & 0xffu);
    }
  }
}

// Weights col..col+7 of row `row` as float32: scale · (code − zero) − min, each operation
// rounded on its own (the intrinsics are never fused into an FMA), as ggml rounds them.
template <int kBits>
__device__ __forceinline__ void DequantizeEight(const QuantLinearPart& p, int row, int col,
                                                float (&w)[kWeightsPerLoad]) {
  const size_t code_bytes_per_row = static_cast<size_t>(p.in) * kBits / 8;
  int codes[kWeightsPerLoad];
  LoadCodes<kBits>(p.codes + row * code_bytes_per_row, col, codes);
  const size_t group = static_cast<size_t>(row) * (p.in / p.group) + col / p.group;
  const float scale = p.scales[group];
#pragma unroll
  for (int j = 0; j < kWeightsPerLoad; ++j) {
    w[j] = __fmul_rn(scale, static_cast<float>(codes[j] - p.zero));
  }
  if (p.mins != nullptr) {
    const float min = p.mins[group];
#pragma unroll
    for (int j = 0; j < kWeightsPerLoad; ++j) w[j] = __fsub_rn(w[j], min);
  }
}

// One warp per output row; lane l takes weights 8l..8l+7 of every 256. Every token's sum
// runs through the same lanes in the same order whatever n is.
template <typename T, int kBits>
__global__ void __launch_bounds__(kGemvWarps * 32)
    QuantGemvKernel(QuantLinearPart p, const T* __restrict__ x, int n, const T* __restrict__ bias,
                    T* __restrict__ y, int ldy) {
  const int lane = threadIdx.x % 32;
  const int row = blockIdx.x * kGemvWarps + threadIdx.x / 32;
  if (row >= p.rows) return;  // The whole warp: its lanes share the row.
  float acc[kMaxQuantGemvTokens];
#pragma unroll
  for (int t = 0; t < kMaxQuantGemvTokens; ++t) acc[t] = 0.0f;
  for (int col = lane * kWeightsPerLoad; col < p.in; col += 32 * kWeightsPerLoad) {
    float w[kWeightsPerLoad];
    DequantizeEight<kBits>(p, row, col, w);
#pragma unroll
    for (int t = 0; t < kMaxQuantGemvTokens; ++t) {
      if (t < n) {
        const T* xt = x + static_cast<size_t>(t) * p.in + col;
#pragma unroll
        for (int j = 0; j < kWeightsPerLoad; ++j) acc[t] = fmaf(w[j], ToFloat(xt[j]), acc[t]);
      }
    }
  }
#pragma unroll
  for (int t = 0; t < kMaxQuantGemvTokens; ++t) {
    if (t < n) {  // n is the same in every lane: the whole warp shuffles.
      float sum = WarpSum(acc[t]);
      if (lane == 0) {
        if (bias != nullptr) sum += ToFloat(bias[row]);
        y[static_cast<size_t>(t) * ldy + row] = FromFloat<T>(sum);
      }
    }
  }
}

// Rows row_begin..row_begin+num_rows-1 into out [num_rows, in], eight weights per thread
// and step (one 16-byte store).
template <typename T, int kBits>
__global__ void QuantDequantizeKernel(QuantLinearPart p, int row_begin, int num_rows,
                                      T* __restrict__ out) {
  const size_t loads_per_row = p.in / kWeightsPerLoad;
  const size_t count = static_cast<size_t>(num_rows) * loads_per_row;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < count;
       i += stride) {
    const int r = static_cast<int>(i / loads_per_row);
    const int col = static_cast<int>(i % loads_per_row) * kWeightsPerLoad;
    float w[kWeightsPerLoad];
    DequantizeEight<kBits>(p, row_begin + r, col, w);
    StoreFloats<kWeightsPerLoad>(out + static_cast<size_t>(r) * p.in + col, w);
  }
}

}  // namespace

const char* CheckQuantLinearPart(const QuantLinearPart& p) {
  if (p.bits != 4 && p.bits != 8) return "codes must be 4 or 8 bits";
  if (p.in <= 0 || p.group <= 0 || p.group % kWeightsPerLoad != 0 || p.in % p.group != 0) {
    return "the group must be a multiple of 8 weights that divides the row";
  }
  if (p.rows < 0) return "negative row count";
  if (p.codes == nullptr || p.scales == nullptr) return "no codes or scales";
  if (!IsAligned(p.codes, 8) || !IsAligned(p.scales, 4) ||
      (p.mins != nullptr && !IsAligned(p.mins, 4))) {
    return "codes must be 8-byte and scales 4-byte aligned";
  }
  return nullptr;
}

cudaError_t LaunchQuantGemv(const QuantLinearPart& part, const void* x, int n, const void* bias,
                            void* y, int ldy, DType dtype, cudaStream_t stream) {
  if (n <= 0 || part.rows <= 0) return cudaSuccess;
  if (n > kMaxQuantGemvTokens || ldy < part.rows || CheckQuantLinearPart(part) != nullptr) {
    return cudaErrorInvalidValue;
  }
  const unsigned blocks = static_cast<unsigned>((part.rows + kGemvWarps - 1) / kGemvWarps);
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    const auto* xt = static_cast<const T*>(x);
    const auto* bt = static_cast<const T*>(bias);
    auto* yt = static_cast<T*>(y);
    if (part.bits == 4) {
      QuantGemvKernel<T, 4><<<blocks, kGemvWarps * 32, 0, stream>>>(part, xt, n, bt, yt, ldy);
    } else {
      QuantGemvKernel<T, 8><<<blocks, kGemvWarps * 32, 0, stream>>>(part, xt, n, bt, yt, ldy);
    }
    return cudaGetLastError();
  });
}

cudaError_t LaunchQuantDequantize(const QuantLinearPart& part, int row_begin, int num_rows,
                                  void* out, DType dtype, cudaStream_t stream) {
  if (num_rows <= 0) return cudaSuccess;
  if (row_begin < 0 || row_begin + num_rows > part.rows || CheckQuantLinearPart(part) != nullptr ||
      !IsAligned(out, 16)) {
    return cudaErrorInvalidValue;
  }
  const size_t count = static_cast<size_t>(num_rows) * (part.in / kWeightsPerLoad);
  const unsigned blocks = GridStrideBlocks(count, kDequantizeThreads);
  return DispatchDType(dtype, [&](auto t) {
    using T = decltype(t);
    auto* tile = static_cast<T*>(out);
    if (part.bits == 4) {
      QuantDequantizeKernel<T, 4>
          <<<blocks, kDequantizeThreads, 0, stream>>>(part, row_begin, num_rows, tile);
    } else {
      QuantDequantizeKernel<T, 8>
          <<<blocks, kDequantizeThreads, 0, stream>>>(part, row_begin, num_rows, tile);
    }
    return cudaGetLastError();
  });
}

}  // namespace conveyor::kernels::cuda
