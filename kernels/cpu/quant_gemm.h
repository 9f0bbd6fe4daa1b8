// Batch-invariant GEMM on GGUF block-quantized weights (Q8_0, Q4_0, Q4_1, Q4_K, Q5_K,
// Q6_K):
// Y[m, n] = X[m, k] · Wᵀ + b with W kept in its blocks, never widened in memory.
//
// The arithmetic is llama.cpp's: each row of X is quantized to int8 in blocks (32
// values for Q8_0/Q4_0/Q4_1, 256 for the K types; one float scale per block, symmetric, round
// to nearest even), each weight block's dot product with its activation block is summed
// in integers (exact), and the integer sums are combined in float32 per block:
//
//   Q8_0, Q4_0:  acc = fma(float(Σ q_w·q_x [− 8·Σ q_x]), d_w·d_x, acc)
//   Q4_1:        acc = fma(float(Σ q_w·q_x), d_w·d_x, acc); acc = fma(float(Σ q_x), m_w·d_x, acc)
//   Q4_K, Q5_K:  acc = fma(float(Σ_j sc_j·Σ q_w·q_x), d·d_x, acc);
//                acc = fma(float(Σ_j m_j·Σ q_x), −(dmin·d_x), acc)       (j: sub-blocks)
//   Q6_K:        acc = fma(float(Σ_j sc_j·(Σ q_w·q_x − 32·Σ q_x)), d·d_x, acc)
//
// over the blocks in ascending k, from zero, then y = acc (+ bias). Every level (the
// AVX-512 VNNI, AVX2 and portable kernels) computes exactly that, so they give the same
// bits, and each output is one chain whatever m, the row's place in X or the thread
// count: batch invariant. (The AVX-512 VNNI kernel reads the same values repacked into
// 16-row panels, so that a vector's lanes are 16 outputs; the arithmetic is unchanged.)
// docs/cpu-weights.md has the measurements behind the choice of integer dot products over
// dequantizing into float32 FMAs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/quant_blocks.h"

namespace conveyor::kernels {

class ThreadPool;

// Bytes PackQuantized writes for `parts` (each rows of k weights).
size_t QuantizedPackBytes(std::span<const QuantizedRows> parts, int k);

// Copies `parts` (ggml's blocks) to `dst` (64-byte aligned, QuantizedPackBytes long) in
// the layout this process's kernels read: the blocks as they are (portable) or repacked
// into 16-row panels (AVX2, AVX-512 VNNI; quant_gemm_kernels.h). Returns the parts as
// GemmQuantized takes them: the same types and rows, pointing into dst.
std::vector<QuantizedRows> PackQuantized(std::span<const QuantizedRows> parts, int k, void* dst);

// Y[m, n] (row stride ldy) = X[m, k] (row stride ldx) · Wᵀ (+ bias[n] if not null), where
// W's rows are `packed` (PackQuantized's result) one after another (n = the sum of their
// rows). Runs on `pool` (null: the calling thread).
void GemmQuantized(const float* x, int ldx, int m, int k, std::span<const QuantizedRows> packed,
                   const float* bias, float* y, int ldy, ThreadPool* pool);

// Whether this process's quantized kernels run faster than the same weights dequantized
// to int8 (kernels/cpu/gemm.h): true where they are the panel kernels, AVX2 or AVX-512
// VNNI (the measurements are in docs/cpu-weights.md). What --cpu_weight_dtype=auto goes by.
bool QuantGemmBeatsInt8();

// The kernels GemmQuantized runs on this process's level: "avx512_vnni on 16-row panels
// repacked at load", "avx2 on 16-row panels repacked at load" or "portable".
const char* QuantGemmKernelName();

}  // namespace conveyor::kernels
