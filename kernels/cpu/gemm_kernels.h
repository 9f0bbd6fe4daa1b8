// Micro-kernels behind GemmPacked (internal to kernels/cpu).
#pragma once

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
// both): the same chains as two single-panel calls, twice as many at once. Where an ISA
// has them, GemmPackedAs uses them for m == 1.

// float32 panels. The AVX-512, AVX2 and portable kernels of a type give the same bits.
void GemmPanelAvx512(const float* x, int ldx, int m, const void* panel, const float* scales, int k,
                     const float* bias, float* y, int ldy, int cols, const void* prefetch,
                     int prefetch_lines);
void GemmPanelAvx2(const float* x, int ldx, int m, const void* panel, const float* scales, int k,
                   const float* bias, float* y, int ldy, int cols, const void* prefetch,
                   int prefetch_lines);
void GemmPanelPairAvx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
void GemmPanelPortable(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
// bfloat16 panels, widened to float32 per element (exact).
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
void GemmPanelInt8Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                       int k, const float* bias, float* y, int ldy, int cols, const void* prefetch,
                       int prefetch_lines);
void GemmPanelPairInt8Avx2(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);
void GemmPanelInt8Portable(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols,
                           const void* prefetch, int prefetch_lines);

// bfloat16 bits of `f`, rounded to nearest even (NaN stays NaN).
uint16_t ToBf16(float f);
float FromBf16(uint16_t b);

}  // namespace conveyor::kernels::internal
