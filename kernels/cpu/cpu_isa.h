// Which instruction set the CPU backend's kernels use: chosen once per process, from what
// the CPU reports, and lowered (never raised) by the environment variable
// CONVEYOR_CPU_ISA=portable|avx2|avx512|avx512_bf16, so one machine can exercise every
// path below its own. The level is applied in one place: it picks the kernel set
// (cpu_kernels.h) that the GEMM, the attention tile kernel and the row kernels all take
// theirs from.
//
// The chain is AVX512-BF16 → AVX-512F → AVX2+FMA → portable. Only the bf16 GEMM has an
// AVX512-BF16 kernel (vdpbf16ps); the levels below compute the same bits with FMA
// (docs/cpu-weights.md). Where both run, the faster on this CPU is used
// (bf16_arithmetic.h: vdpbf16ps does twice the FMA's multiply-adds per second on a Zen 5,
// half on an Intel Xeon without AMX). AMX is detected and logged
// (CpuFeatureSummary) but has no kernels yet; VNNI runs the quantized GEMM (quant_gemm.h).
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace conveyor::kernels {

// Ordered: a level can run every kernel of the levels below it.
enum class CpuIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2, kAvx512Bf16 = 3 };

const char* CpuIsaName(CpuIsa isa);

// "portable", "avx2", "avx512" or "avx512_bf16"; nullopt for anything else.
std::optional<CpuIsa> ParseCpuIsa(std::string_view name);

// The highest level this CPU (and its OS) can run: AVX512-BF16 (with AVX-512F and BW),
// AVX-512F, or AVX2 with FMA.
CpuIsa DetectedCpuIsa();

// The level the kernels use: DetectedCpuIsa(), or CONVEYOR_CPU_ISA if that names a level
// at or below it. Read once, on first use; fixed for the life of the process, so every
// token of every batch takes the same kernels.
CpuIsa ActiveCpuIsa();

// How the bf16 GEMM multiplies on the AVX512-BF16 level: with vdpbf16ps, or with the
// float32 FMAs the levels below use (the same bits, docs/cpu-weights.md). Below that
// level it is always kFma.
enum class Bf16Arithmetic { kFma, kVdpbf16ps };

const char* Bf16ArithmeticName(Bf16Arithmetic a);  // "fma" or "vdpbf16ps"

// What CONVEYOR_BF16_GEMM=fma|vdpbf16ps asks for; nullopt where unset, "auto" or
// unusable (vdpbf16ps on a level without it). Otherwise the process checks and times
// vdpbf16ps (bf16_arithmetic.h).
std::optional<Bf16Arithmetic> RequestedBf16Arithmetic();

// Checks CONVEYOR_CPU_ISA and CONVEYOR_BF16_GEMM for a binary to report at start: empty
// if unset or usable, else a message saying what to set instead. (The kernels ignore an
// unusable value.)
std::string CpuIsaEnvironmentError();

// Whether the CPU (and OS) run AVX512-VNNI on 256-bit vectors (with AVX512VL and BW, and
// F16C): the quantized GEMM's kernel at the avx512 levels (quant_gemm.h).
bool CpuHasAvx512Vnni();

// The x86 features that matter to the kernels and that this CPU has, for the log, e.g.
// "avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8".
std::string CpuFeatureSummary();

}  // namespace conveyor::kernels
