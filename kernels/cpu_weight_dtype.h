// How the CPU backend stores linear-layer weights (docs/cpu-weights.md) and its KV cache
// (docs/cpu-attention.md): the enums the backend factory (backend.h), the packed GEMM
// (cpu/gemm.h), the attention kernels and the benchmarks share.
#pragma once

namespace conveyor::kernels {

enum class CpuWeightDtype {
  kF32,
  kBf16,  // Half the bytes; bf16 products (GEMM inputs rounded too), float32 sums.
  kInt8,  // A quarter: weight-only, symmetric, one scale per output channel.
};

// "f32", "bf16" or "int8".
constexpr const char* CpuWeightDtypeName(CpuWeightDtype dtype) {
  switch (dtype) {
    case CpuWeightDtype::kBf16:
      return "bf16";
    case CpuWeightDtype::kInt8:
      return "int8";
    case CpuWeightDtype::kF32:
    default:
      return "f32";
  }
}

enum class CpuKvDtype {
  kF32,
  kBf16,  // Half the bytes: K and V rounded to bf16 when written; attention in float32.
};

// "f32" or "bf16".
constexpr const char* CpuKvDtypeName(CpuKvDtype dtype) {
  return dtype == CpuKvDtype::kBf16 ? "bf16" : "f32";
}

}  // namespace conveyor::kernels
