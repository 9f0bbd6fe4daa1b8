// Micro-kernels behind GemmPacked (internal to kernels/cpu).
#pragma once

#include <xmmintrin.h>

#include <cstddef>
#include <cstdint>

namespace conveyor::kernels::internal {

// Computes rows [0, m) (m <= kGemmMaxRows) of one panel: y[r][j] for j < cols (<= 32),
// from x rows (stride ldx) and a k-major packed panel (float, bf16 or int8 elements as
// the kernel's name says; `scales` are the panel's 32 column scales for int8, else
// unused). Adds bias[j] if bias is not null. Meanwhile prefetches `prefetch_lines` 64-byte
// lines from `prefetch` on into L2, spread over the k loop (a hint for the panels computed
// next; it never changes the result).
using GemmPanelKernel = void (*)(const float* x, int ldx, int m, const void* panel,
                                 const float* scales, int k, const float* bias, float* y, int ldy,
                                 int cols, const void* prefetch, int prefetch_lines);

inline constexpr int kGemmMaxRows = 12;

// The *Pair* kernels take one row (m == 1) against two adjacent panels of k steps each
// (`panel` is the first; cols <= 64 counts from its column 0; scales and bias cover
// both): the same chains as two single-panel calls, twice as many at once. Where a level
// has them (GemmKernels), GemmPackedAs uses them for m == 1.

// float32 panels. The AVX-512, AVX2 and portable kernels of a type give the same bits.
void GemmPanelAvx512(const float* x, int ldx, int m, const void* panel, const float* scales, int k,
                     const float* bias, float* y, int ldy, int cols, const void* prefetch,
                     int prefetch_lines);
void GemmPanelAvx2(const float* x, int ldx, int m, const void* panel, const float* scales, int k,
                   const float* bias, float* y, int ldy, int cols, const void* prefetch,
                   int prefetch_lines);
void GemmPanelPairAvx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                         int k, const float* bias, float* y, int ldy, int cols,
                         const void* prefetch, int prefetch_lines);
void GemmPanelPairAvx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
void GemmPanelPortable(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
// bfloat16 panels compute what AVX512-BF16's vdpbf16ps does (docs/cpu-weights.md): the
// activations are rounded to bf16 too, and k is taken in pairs (2j, 2j+1); each output's
// chain adds the pair's odd product, then its even one, each step rounded to float32 and
// a denormal result flushed to zero (as is the bias sum after it). A panel stores pair j
// of its 32 columns as 32 dwords, bf16(w[2j]) in the low half and bf16(w[2j+1]) in the
// high half; `k` is the even Bf16PaddedK(K) (an odd K gets a zero pair partner). `x` is
// RoundBf16Activations' output and `ldx` its row stride in 4-byte units: the pairs layout
// for the AVX512-BF16 kernel, the chain-order layout for the kernels that reproduce it
// with float32 FMAs (which run under WithDenormalsFlushed).
void GemmPanelBf16Avx512Bf16(const float* x, int ldx, int m, const void* panel, const float* scales,
                             int k, const float* bias, float* y, int ldy, int cols,
                             const void* prefetch, int prefetch_lines);
void GemmPanelPairBf16Avx512Bf16(const float* x, int ldx, int m, const void* panel,
                                 const float* scales, int k, const float* bias, float* y, int ldy,
                                 int cols, const void* prefetch, int prefetch_lines);
void GemmPanelPairBf16Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                             int k, const float* bias, float* y, int ldy, int cols,
                             const void* prefetch, int prefetch_lines);
void GemmPanelBf16Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                         int k, const float* bias, float* y, int ldy, int cols,
                         const void* prefetch, int prefetch_lines);
void GemmPanelBf16Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
void GemmPanelPairBf16Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);
void GemmPanelBf16Portable(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);
// int8 panels: the chain runs over the integer values (exact in float32), and its sum is
// multiplied by the column's scale once, before the bias.
void GemmPanelInt8Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                         int k, const float* bias, float* y, int ldy, int cols,
                         const void* prefetch, int prefetch_lines);
void GemmPanelPairInt8Avx512(const float* x, int ldx, int m, const void* panel, const float* scales,
                             int k, const float* bias, float* y, int ldy, int cols,
                             const void* prefetch, int prefetch_lines);
void GemmPanelInt8Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
void GemmPanelPairInt8Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);
void GemmPanelInt8Portable(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);

// Widens a bf16 panel of k steps (k even: k / 2 rows of 32 pair dwords) into k × 32
// float32 in the chain's order (step i holds the weights of k = i ^ 1), exactly. The
// float32 kernels on that, with chain-order activations and under WithDenormalsFlushed,
// run the bf16 FMA kernels' chains: the same bits. GemmPackedAs uses it at the AVX2 level
// (GemmKernels::widen_bf16 says why only there).
void WidenBf16PanelAvx2(const void* panel, int k, float* out);

// bfloat16 bits of `f`, rounded to nearest even; a denormal becomes a zero of its sign
// and a NaN a quiet NaN (what vcvtne2ps2bf16 does).
uint16_t ToBf16(float f);
float FromBf16(uint16_t b);
// out[i * stride] = ToBf16(in[i]) for i < n: ToBf16 inlined, for callers that narrow
// many values (the KV cache's writes). Out of line here, in the file built for every CPU:
// an inline ToBf16 in this header would also be compiled into the AVX files, and the
// linker may keep any one copy.
void ToBf16Strided(const float* in, int n, uint16_t* out, ptrdiff_t stride);

inline int Bf16PaddedK(int k) { return k + (k & 1); }

enum class Bf16Activations {
  kPairs,       // Row r, dword j: ToBf16(x[2j]) | ToBf16(x[2j+1]) << 16. Stride k/2.
  kChainOrder,  // Row r: the bf16 values as float32 in the chain's order: x[1], x[0],
                // x[3], x[2], … Stride k.
};

// Rounds rows [0, m) of x (K columns, row stride ldx) for the bf16 kernels into `out`
// (m × Bf16PaddedK(K) 16-bit or 32-bit elements as `layout` says; the pad is zero).
void RoundBf16Activations(const float* x, int ldx, int m, int k, Bf16Activations layout, void* out);

// RoundBf16Activations(..., kPairs, out) with vcvtne2ps2bf16 (the same bits), 32 values
// per instruction: for the AVX512-BF16 level only.
void RoundBf16PairsAvx512Bf16(const float* x, int ldx, int m, int k, void* out);
// RoundBf16Activations(..., kChainOrder, out) in AVX2 integer operations (the same bits),
// 8 values per step: for the AVX2 and AVX-512F levels.
void RoundBf16ChainOrderAvx2(const float* x, int ldx, int m, int k, void* out);

// One level's kernels for GemmPackedAs, a part of its CpuKernels (cpu_kernels.h).
struct GemmKernels {
  GemmPanelKernel f32 = nullptr, bf16 = nullptr, int8 = nullptr;
  // For one row against two panels (the *Pair* kernels); null where the level has none.
  GemmPanelKernel f32_pair = nullptr, bf16_pair = nullptr, int8_pair = nullptr;
  // The activations bf16 takes: pairs for vdpbf16ps, else float32 in chain order; and
  // what rounds them into that layout (a vector version of RoundBf16Activations; null:
  // RoundBf16Activations itself).
  Bf16Activations bf16_activations = Bf16Activations::kChainOrder;
  void (*round_bf16)(const float* x, int ldx, int m, int k, void* out) = nullptr;
  // Where set (a level whose bf16 activations are in chain order), bf16 GEMMs of several
  // row tiles widen each panel once for the float32 kernel (GemmPackedAs). The AVX2 level
  // only: there each 6-row pass widens the weights it loads again, and once per chunk ran
  // the `small` model's 48 layer GEMMs (2 threads, a Zen 4 at the AVX2 level, one
  // process) at m = 512 in 421 instead of 603 ms, m = 64 54 vs 72, m = 16 17 vs 19. The
  // AVX-512 FMA kernel widens two registers per 24 FMAs, on pipes the FMAs do not use on
  // that Zen 4: there once per chunk was no faster (m = 512 386 vs 392 ms) or slower
  // (m = 16 15.6 vs 13.1 ms, the extra pass over the panels unamortized). Not measured on
  // an Intel core, whose vector logic shares the FMAs' ports.
  void (*widen_bf16)(const void* panel, int k, float* out) = nullptr;
};

// Calls body() out of line: the compiler does not treat MXCSR as a dependency of
// arithmetic, so an inlined body's FMAs could be moved across the MXCSR writes around it.
template <typename Body>
[[gnu::noinline]] void CallOutOfLine(Body& body) {
  body();
}

// Runs body() with MXCSR's flush-to-zero and denormals-are-zero bits set (this thread
// only), so that float32 FMAs round and flush as vdpbf16ps does; restores MXCSR after.
template <typename Body>
void WithDenormalsFlushed(Body body) {
  const unsigned saved = _mm_getcsr();
  _mm_setcsr(saved | 0x8040u);
  CallOutOfLine(body);
  _mm_setcsr(saved);
}

}  // namespace conveyor::kernels::internal
