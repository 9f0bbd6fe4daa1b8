// The CPU backend's kernels, one set per instruction level (internal to kernels/cpu): the
// GEMM's panel kernels, the attention tile kernel and the row kernels a level runs, in one
// table. The process chooses its set once (ActiveCpuKernels), from ActiveCpuIsa() and, on
// the avx512_bf16 level, from how the bf16 GEMM multiplies (bf16_arithmetic.h); the GEMM,
// attention and the backend take their kernels from it and never ask which level runs.
// Every token of every batch takes the same kernels, and every level computes the same
// bits (docs/cpu-isa.md says where the portable level differs).
#pragma once

#include <string>

#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/row_kernels.h"

namespace conveyor::kernels::internal {

struct CpuKernels {
  CpuIsa isa = CpuIsa::kPortable;
  // How the bf16 GEMM multiplies: vdpbf16ps only in one of the avx512_bf16 level's sets.
  Bf16Arithmetic bf16_arithmetic = Bf16Arithmetic::kFma;
  GemmKernels gemm;
  // For head_dim % 16 == 0. Other head sizes take AttentionTilePortable on every level,
  // so that a model's bits never depend on which vector level a CPU has.
  AttentionTileKernel attention_tile = nullptr;
  const RowKernels* rows = nullptr;
};

// The set of `isa`. On the avx512_bf16 level `bf16` picks the bf16 GEMM's arithmetic
// (its f32, int8, attention and row kernels are the avx512 level's); below it the FMAs
// run whatever `bf16` says. Call a level's kernels only where DetectedCpuIsa() reaches it.
const CpuKernels& CpuKernelsFor(CpuIsa isa, Bf16Arithmetic bf16 = Bf16Arithmetic::kFma);

// The set this process runs: CpuKernelsFor(ActiveCpuIsa(), ChooseBf16Arithmetic(...)),
// chosen on first use (which on the avx512_bf16 level checks and times vdpbf16ps, 2-3 ms)
// and fixed for the life of the process.
const CpuKernels& ActiveCpuKernels();

// Why the active set's bf16 GEMM multiplies as it does, for the log: "CONVEYOR_BF16_GEMM",
// "timed: vdpbf16ps at 0.55x the FMAs' speed; its bits checked on 768 outputs", ...
const std::string& ActiveBf16ArithmeticReason();

}  // namespace conveyor::kernels::internal
