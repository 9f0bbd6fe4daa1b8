// Micro-kernels behind GemmQuantized (internal to kernels/cpu): quant_gemm.h states the
// arithmetic every one of them computes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/quant_blocks.h"

namespace conveyor::kernels {
class ThreadPool;
}  // namespace conveyor::kernels

namespace conveyor::kernels::internal {

// Rows of X quantized for the kernels: row r's int8 values at q + r * k, its block
// scales at d + r * (k / block) (block: 32 or 256), and the sums of each 16 and each 32
// of its int8 values at bsum16 + r * (k / 16) and bsum32 + r * (k / 32).
struct QuantizedActivations {
  const int8_t* q = nullptr;
  const float* d = nullptr;
  const int16_t* bsum16 = nullptr;
  const int16_t* bsum32 = nullptr;
  int k = 0;
  int block = 32;
};

// Quantizes rows [0, m) of x (k columns, row stride ldx) in blocks of `block` values:
// d = max|x| / 127, q = nearbyint(x / d) (0 where d is 0). Scalar, for every level, so
// every level sees the same q and d. `q`, `d`, `bsum16`, `bsum32` hold m·k, m·k/block,
// m·k/16 and m·k/32.
void QuantizeActivations(const float* x, int ldx, int m, int k, int block, int8_t* q, float* d,
                         int16_t* bsum16, int16_t* bsum32);

// The same, vectorised with AVX-512 (the same operations lane by lane: the same q, d and
// sums); the AVX-512 VNNI level's.
void QuantizeActivationsAvx512(const float* x, int ldx, int m, int k, int block, int8_t* q,
                               float* d, int16_t* bsum16, int16_t* bsum32);

// The kernel levels, each with its own weight layout (PackQuantizedAt).
enum class QuantLevel {
  kPortable,    // ggml's blocks as they are.
  kAvx2,        // 16-row panels (below), read in 8-row halves.
  kAvx512Vnni,  // 16-row panels.
};

// The level this process runs: AVX-512 VNNI where the CPU has it and CONVEYOR_CPU_ISA
// allows AVX-512, else AVX2, else portable.
QuantLevel ActiveQuantLevel();

// The panel layout of the AVX2 and AVX-512 VNNI levels. Rows of W are grouped by 16 (the last group
// padded with zero rows); a panel holds its 16 rows' weights for all of k, so that one
// 64-byte load holds 4 (8-bit) or 8 (4-bit) consecutive weights of each of the 16 rows,
// and one vpdpbusd against 4 activation bytes broadcast makes 16 outputs' partial sums,
// one per 32-bit lane: no horizontal sums. A panel is, for each of ggml's blocks in k
// order, the quant values ("q part"), then for each block its scales ("meta part"):
//
//   chunk c of a block's q part (64 bytes): byte 4·r + i is row r's weight
//     8-bit (Q8_0 as int8; Q5_K, Q6_K as their unsigned values): 4c + i of the block;
//     4-bit (Q4_0, Q4_1, Q4_K): low nibble 8c + i, high nibble 8c + 4 + i.
//   meta, 16 entries per field, entry r for row r:
//     Q8_0, Q4_0:  fp16 d                                           (32 bytes)
//     Q4_1:        fp16 d; fp16 m                                   (64 bytes)
//     Q4_K, Q5_K:  u8 scale[8 sub-blocks][16]; u8 min[4 pairs][16][2] (sub-blocks 2p,
//                  2p + 1); fp16 d; fp16 dmin                       (320 bytes)
//     Q6_K:        int8 scale[16 sixteens][16]; fp16 d              (288 bytes)
//
// Every value is ggml's, unchanged, so the panel kernel computes quant_gemm.h's
// arithmetic exactly as the block kernels do.
inline constexpr int kQuantPanelRows = 16;

// Bytes of one block's q part, and of its meta part, in a panel.
constexpr int PanelQBytes(QuantBlockType type) {
  switch (type) {
    case QuantBlockType::kQ8_0:
      return 512;
    case QuantBlockType::kQ4_0:
    case QuantBlockType::kQ4_1:
      return 256;
    case QuantBlockType::kQ4_K:
      return 2048;
    case QuantBlockType::kQ5_K:
    case QuantBlockType::kQ6_K:
    default:
      return 4096;
  }
}
constexpr int PanelMetaBytes(QuantBlockType type) {
  switch (type) {
    case QuantBlockType::kQ8_0:
    case QuantBlockType::kQ4_0:
      return 32;
    case QuantBlockType::kQ4_1:
      return 64;
    case QuantBlockType::kQ4_K:
    case QuantBlockType::kQ5_K:
      return 320;
    case QuantBlockType::kQ6_K:
    default:
      return 288;
  }
}
// Bytes of one panel of k weights per row (rounded up to 64, so panels stay aligned).
constexpr size_t PanelBytes(QuantBlockType type, int k) {
  const size_t blocks = static_cast<size_t>(k / QuantBlockElements(type));
  return (blocks * (PanelQBytes(type) + PanelMetaBytes(type)) + 63) / 64 * 64;
}

// Writes `part` (rows of k weights) as ceil(rows / 16) panels at dst (zeroed first).
void PackPanels(const QuantizedRows& part, int k, uint8_t* dst);

// The panel kernel: y[r][o] for r < rows (<= kQuantMaxRows) and o < outputs (<= 16):
// rows [r0, r0 + rows) of `a` times the panel's rows, plus bias[o] if bias is not null.
void QuantPanelAvx512Vnni(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                          const uint8_t* panel, int outputs, const float* bias, float* y, int ldy);
// The same on AVX2 (vpmaddubsw + vpmaddwd, one 8-row half of the panel at a time).
void QuantPanelAvx2(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                    const uint8_t* panel, int outputs, const float* bias, float* y, int ldy);

// Outputs per portable kernel call (rows of W), and rows of X per call at most.
inline constexpr int kQuantTileOutputs = 8;
inline constexpr int kQuantMaxRows = 16;

// The portable kernel, on the blocks as they are: y[r][o] for r < rows (<= kQuantMaxRows)
// and o < outputs (<= kQuantTileOutputs): rows [r0, r0 + rows) of `a` times W rows
// w + o * row_bytes (of `type`, a.k weights each), plus bias[o] if bias is not null. y has
// row stride ldy.
void QuantTilePortable(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                       const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                       int ldy);

// GemmQuantized and its packing at a given level (tests compare the levels).
size_t QuantizedPackBytesAt(QuantLevel level, std::span<const QuantizedRows> parts, int k);
std::vector<QuantizedRows> PackQuantizedAt(QuantLevel level, std::span<const QuantizedRows> parts,
                                           int k, void* dst);
void GemmQuantizedAt(QuantLevel level, const float* x, int ldx, int m, int k,
                     std::span<const QuantizedRows> packed, const float* bias, float* y, int ldy,
                     ThreadPool* pool);

// float32 of an IEEE half (exact).
float HalfBitsToFloat(uint16_t h);

}  // namespace conveyor::kernels::internal
