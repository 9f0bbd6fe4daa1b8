// Batch-invariant GEMM for linear layers: Y[m, n] = X[m, k] · Wᵀ + b, in float32.
//
// W is stored as float32, bfloat16 (half the bytes) or int8 with one float scale per
// output column (a quarter). float32 and int8 (widened in registers, exact) run float32
// FMA chains; bf16 runs AVX512-BF16's vdpbf16ps arithmetic (activations rounded to bf16,
// pairs of products summed in float32), which the CPUs without it reproduce bit for bit
// with FMAs (gemm_kernels.h, docs/cpu-weights.md).
//
// Every output element is one chain in a fixed order over k (f32, int8: 0, 1, …, K-1;
// bf16: pair by pair), starting from zero, whatever m is, wherever the row sits in X and
// however many threads run. That makes a token's result independent of the batch it is
// computed in, which OpenBLAS does not guarantee (its result for a row changes with the
// row's position in the call and with the thread count; docs/design.md).
// Each step is exactly rounded, so the AVX512-BF16, AVX-512, AVX2 and portable paths give
// the same bits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cpu_weight_dtype.h"

namespace conveyor::kernels {

class ThreadPool;

// Output columns per packed panel (two AVX-512 registers).
inline constexpr int kGemmPanelWidth = 32;

// Bytes PackGemmWeight writes for a weight of `n` outputs and `k` inputs.
size_t PackedGemmWeightBytes(int n, int k);

// Reorders row-major W [n, k] into panels of kGemmPanelWidth output columns, each stored
// k-major ([k][32]) and zero-padded, so the kernel streams one panel sequentially.
void PackGemmWeight(const float* w, int n, int k, float* packed);

// Y[m, n] (row stride ldy) = X[m, k] (row stride ldx) · Wᵀ (+ bias[n] if not null),
// with W packed by PackGemmWeight. Runs on `pool` (null: the calling thread).
void GemmPacked(const float* x, int ldx, int m, const float* packed, int n, int k,
                const float* bias, float* y, int ldy, ThreadPool* pool);

// The level of the kernels GemmPacked dispatches to: "avx512_bf16", "avx512", "avx2" or
// "portable", ActiveCpuIsa()'s (the environment variable CONVEYOR_CPU_ISA lowers it, see
// cpu_isa.h).
const char* GemmKernelName();

// How bf16 weights are multiplied, with the reason, for the log: "fma (timed: vdpbf16ps
// at 0.55x the FMAs' speed; ...)". On the AVX512-BF16 level the faster of vdpbf16ps and
// the FMAs, timed on this CPU once per process, when it picks its kernel set
// (cpu_kernels.h), unless CONVEYOR_BF16_GEMM names one; below it the FMAs
// (bf16_arithmetic.h). Both give the same bits, so the choice changes only the speed.
std::string Bf16ArithmeticChoice();

// A weight packed by PackGemmWeightAs, in panels of kGemmPanelWidth columns × k.
struct PackedGemmWeight {
  CpuWeightDtype type = CpuWeightDtype::kF32;
  int n = 0;
  int k = 0;
  void* panels = nullptr;   // 64-byte aligned, PackedGemmPanelBytes.
  float* scales = nullptr;  // kInt8: one per column, padded to whole panels; else null.
};

// Bytes of the panels and of the scales PackGemmWeightAs writes.
size_t PackedGemmPanelBytes(CpuWeightDtype type, int n, int k);
size_t PackedGemmScaleBytes(CpuWeightDtype type, int n);

// Packs row-major W [n, k] into `out` (whose panels and scales are allocated with the
// sizes above; out->type/n/k are set here).
void PackGemmWeightAs(CpuWeightDtype type, const float* w, int n, int k, PackedGemmWeight* out);

// GemmPacked for a weight of any type: the same loop, blocking and thread split, so
// the same batch invariance.
void GemmPackedAs(const float* x, int ldx, int m, const PackedGemmWeight& w, const float* bias,
                  float* y, int ldy, ThreadPool* pool);

}  // namespace conveyor::kernels
