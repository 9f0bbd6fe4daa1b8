// Batch-invariant single-precision GEMM for linear layers: Y[m, n] = X[m, k] · Wᵀ + b.
//
// Every output element is one fused-multiply-add chain over k = 0, 1, …, K-1 starting
// from zero, whatever m is, wherever the row sits in X and however many threads run.
// That makes a token's result independent of the batch it is computed in, which
// OpenBLAS does not guarantee (its result for a row changes with the row's position in
// the call and with the thread count; see docs/batch-invariance.md). FMA is exactly
// rounded, so the AVX-512 and the portable paths give the same bits.
#pragma once

#include <cstddef>
#include <cstdint>

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

// Name of the kernel GemmPacked dispatches to on this CPU ("avx512" or "portable").
const char* GemmKernelName();

}  // namespace conveyor::kernels
