// How the avx512_bf16 level's bf16 GEMM multiplies (internal to kernels/cpu): with
// vdpbf16ps, or with the float32 FMAs the levels below use, which compute the same bits
// (docs/cpu-weights.md). Having the instruction does not make it fast: it does twice the
// FMA's multiply-adds per second on a Zen 5, half on an Intel Xeon without AMX
// (docs/cpu-isa.md). So the process decides once, at start, when cpu_kernels.cc chooses
// its kernel set: CONVEYOR_BF16_GEMM if it names one; else vdpbf16ps is checked against
// the specification on this CPU and, where it computes the specification's bits, timed
// against the FMAs.
#pragma once

#include <string>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"

namespace conveyor::kernels::internal {

// Which bf16 arithmetic a level uses, and why (for the log).
struct Bf16Choice {
  Bf16Arithmetic arithmetic = Bf16Arithmetic::kFma;
  std::string reason;
};

// The choice for kernels that run at `level`: below avx512_bf16 always the FMAs; on it
// CONVEYOR_BF16_GEMM's, else the FMAs where vdpbf16ps fails Bf16KernelMismatches, else
// the faster of the two, timed on this core (about a millisecond; the check 1-2 ms).
// Runs the check and the timing on every call: call it once per process.
Bf16Choice ChooseBf16Arithmetic(CpuIsa level);

// Checks a bf16 panel kernel against the specification (GemmPanelBf16Portable): a
// 12-row tile against one panel of k = 300, with a bias, once on values of normal size
// and once on values around 3e-20, whose products and sums fall around FLT_MIN, where
// the flushing decides. `layout` is the activations the kernel takes. Returns how many
// outputs differ in any bit, of `*checked` (if not null) compared.
int Bf16KernelMismatches(GemmPanelKernel kernel, Bf16Activations layout, int* checked = nullptr);

}  // namespace conveyor::kernels::internal
