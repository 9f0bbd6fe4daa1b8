// Micro-kernels behind GemmQuantized (internal to kernels/cpu): quant_gemm.h states the
// arithmetic every one of them computes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/quant_blocks.h"

namespace conveyor::kernels::internal {

// Rows of X quantized for the kernels: row r's int8 values at q + r * k, its block
// scales at d + r * (k / block) (block: 32 or 256), and the sums of each 16 of its int8
// values at bsum16 + r * (k / 16).
struct QuantizedActivations {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int16_t* bsum16 = nullptr;
  int k = 0;
  int block = 32;
};

// Quantizes rows [0, m) of x (k columns, row stride ldx) in blocks of `block` values:
// d = max|x| / 127, q = nearbyint(x / d) (0 where d is 0). Scalar, for every level, so
// every level sees the same q and d. `q`, `d`, `bsum16` hold m·k, m·k/block, m·k/16.
void QuantizeActivations(const float* x, int ldx, int m, int k, int block, int8_t* q, float* d,
                         int16_t* bsum16);

// Outputs per kernel call (rows of W), and rows of X per call at most.
inline constexpr int kQuantTileOutputs = 8;
inline constexpr int kQuantMaxRows = 16;

// y[r][o] for r < rows (<= kQuantMaxRows) and o < outputs (<= kQuantTileOutputs): rows
// [r0, r0 + rows) of `a` times W rows w + o * row_bytes (of `type`, a.k weights each),
// plus bias[o] if bias is not null. y has row stride ldy.
using QuantTileKernel = void (*)(QuantBlockType type, const QuantizedActivations& a, int r0,
                                 int rows, const uint8_t* w, size_t row_bytes, int outputs,
                                 const float* bias, float* y, int ldy);

void QuantTilePortable(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                       const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                       int ldy);
// AVX2 (vpmaddubsw + vpmaddwd, 256-bit).
void QuantTileAvx2(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                   const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                   int ldy);
// AVX-512 VNNI on 256-bit vectors (AVX512VL): vpdpbusd where no per-sub-block integer
// scale follows (Q8_0, Q4_0); otherwise the AVX2 instructions.
void QuantTileAvx512Vnni(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                         const uint8_t* w, size_t row_bytes, int outputs, const float* bias,
                         float* y, int ldy);

// float32 of an IEEE half (exact).
float HalfBitsToFloat(uint16_t h);

}  // namespace conveyor::kernels::internal
