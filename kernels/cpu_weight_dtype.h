// How the CPU backend stores linear-layer weights (docs/cpu-weights.md):
// the one enum the backend factory (backend.h), the packed GEMM (cpu/gemm.h) and the
// benchmarks share.
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

}  // namespace conveyor::kernels
