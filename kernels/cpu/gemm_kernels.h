// Micro-kernels behind GemmPacked (internal to kernels/cpu).
#pragma once

namespace conveyor::kernels::internal {

// Computes rows [0, m) (m <= kGemmMaxRows) of one panel: y[r][j] for j < cols (<= 32),
// from x rows (stride ldx) and a k-major packed panel. Adds bias[j] if bias is not null.
using GemmPanelKernel = void (*)(const float* x, int ldx, int m, const float* panel, int k,
                                 const float* bias, float* y, int ldy, int cols);

inline constexpr int kGemmMaxRows = 12;

void GemmPanelAvx512(const float* x, int ldx, int m, const float* panel, int k,
                     const float* bias, float* y, int ldy, int cols);
void GemmPanelPortable(const float* x, int ldx, int m, const float* panel, int k,
                       const float* bias, float* y, int ldy, int cols);

}  // namespace conveyor::kernels::internal
