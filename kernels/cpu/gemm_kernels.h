// Micro-kernels behind GemmPacked (internal to kernels/cpu).
#pragma once

namespace conveyor::kernels::internal {

// Computes rows [0, m) (m <= kGemmMaxRows) of one panel: y[r][j] for j < cols (<= 32),
// from x rows (stride ldx) and a k-major packed panel. Adds bias[j] if bias is not null.
// Meanwhile prefetches `prefetch_lines` 64-byte lines from `prefetch` on into L2, spread
// over the k loop (a hint for the panels computed next; it never changes the result).
using GemmPanelKernel = void (*)(const float* x, int ldx, int m, const float* panel, int k,
                                 const float* bias, float* y, int ldy, int cols,
                                 const float* prefetch, int prefetch_lines);

inline constexpr int kGemmMaxRows = 12;

void GemmPanelAvx512(const float* x, int ldx, int m, const float* panel, int k, const float* bias,
                     float* y, int ldy, int cols, const float* prefetch, int prefetch_lines);
void GemmPanelPortable(const float* x, int ldx, int m, const float* panel, int k, const float* bias,
                       float* y, int ldy, int cols, const float* prefetch, int prefetch_lines);

}  // namespace conveyor::kernels::internal
