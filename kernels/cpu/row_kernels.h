// Per-token kernels behind the CPU backend's elementwise operations (RMSNorm, RoPE,
// SiLU·up): each call works on one token's row, so the backend can split a batch over
// threads by rows. AVX-512, AVX2 and portable sets; the process runs its level's
// (CpuKernels::rows, cpu_kernels.h).
//
// Batch invariance: a row's result depends only on that row. RMSNorm's sum of squares
// goes into 16 float64 lanes (element i into lane i % 16, in index order), which are
// then summed by one fixed tree (InverseRmsFromLanes); x² of a float is exact in float64,
// so every step is one rounding in a fixed order. All sets follow that order and round
// RoPE's products the same way, so RMSNorm and RoPE give the same bits on every set.
// SiLU's exp is the vector sets' own polynomial (the same in AVX-512 and AVX2) or the C
// library's, so its bits differ between portable and the vector sets (but never between
// rows, batches or threads).
#pragma once

namespace conveyor::kernels::internal {

// Lanes of RMSNorm's sum of squares.
inline constexpr int kRmsLanes = 16;

// Returns 1/sqrt(sum / hidden + eps) for sum = the lanes added in a fixed tree
// (lane i + lane i+8, then +4, +2, +1), in float64.
float InverseRmsFromLanes(const double lanes[kRmsLanes], int hidden, float eps);

struct RowKernels {
  const char* name;
  // out[i] = x[i] · inv_rms(x) · weight[i] for i < hidden.
  void (*rms_norm)(const float* x, const float* weight, int hidden, float eps, float* out);
  // residual[i] += x[i]; then rms_norm of residual into out, in one pass for the sum.
  void (*add_rms_norm)(float* residual, const float* x, const float* weight, int hidden, float eps,
                       float* out);
  // Rotates `num_heads` consecutive heads of `head_dim` floats in place (rotate-half:
  // element i pairs with i + head_dim/2) by cos[i], sin[i] for i < head_dim/2.
  void (*rope)(float* heads, int num_heads, int head_dim, const float* cos, const float* sin);
  // out[i] = silu(gate[i]) · up[i] for i < n.
  void (*silu_mul)(const float* gate, const float* up, int n, float* out);
};

// Plain C++: any CPU.
extern const RowKernels kPortableRowKernels;
// AVX2+FMA; call only where the CPU reports them. SiLU gives the AVX-512 set's bits.
extern const RowKernels kAvx2RowKernels;
// AVX-512F; call only where the CPU reports it.
extern const RowKernels kAvx512RowKernels;

}  // namespace conveyor::kernels::internal
