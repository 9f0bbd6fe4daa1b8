// Which instruction set the CPU backend's kernels use: chosen once per process, from what
// the CPU reports, and lowered (never raised) by the environment variable
// CONVEYOR_CPU_ISA=portable|avx2|avx512, so one machine can exercise every path below its
// own. The GEMM, the attention tile kernel and the row kernels all follow this one choice.
//
// The chain is AVX-512F → AVX2+FMA → portable. AVX512-BF16, AVX512-VNNI and AMX are
// detected and logged (CpuFeatureSummary) but have no kernels of their own:
// docs/cpu-weights.md says why the narrow weights are widened to float32 instead.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace conveyor::kernels {

// Ordered: a level can run every kernel of the levels below it.
enum class CpuIsa { kPortable = 0, kAvx2 = 1, kAvx512 = 2 };

const char* CpuIsaName(CpuIsa isa);

// "portable", "avx2" or "avx512"; nullopt for anything else.
std::optional<CpuIsa> ParseCpuIsa(std::string_view name);

// The highest level this CPU (and its OS) can run: AVX-512F, or AVX2 with FMA.
CpuIsa DetectedCpuIsa();

// The level the kernels use: DetectedCpuIsa(), or CONVEYOR_CPU_ISA if that names a level
// at or below it. Read once, on first use; fixed for the life of the process, so every
// token of every batch takes the same kernels.
CpuIsa ActiveCpuIsa();

// Checks CONVEYOR_CPU_ISA for a binary to report at start: empty if unset or usable,
// else a message saying what to set instead. (ActiveCpuIsa ignores an unusable value.)
std::string CpuIsaEnvironmentError();

// Whether the CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16), read from CPUID directly:
// compilers differ in which names __builtin_cpu_supports knows.
bool CpuHasBf16Arithmetic();

// The x86 features that matter to the kernels and that this CPU has, for the log, e.g.
// "avx2 fma avx512f avx512_bf16 avx512_vnni amx_bf16 amx_int8".
std::string CpuFeatureSummary();

}  // namespace conveyor::kernels
