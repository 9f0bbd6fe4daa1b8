// The CUDA backend's layout for GGUF block-quantized weights (Backend::PackLinearQuantized),
// made on the host at load time, and its host mirror of the kernels' dequantization.
//
// Every ggml block type is repacked into one form the kernels read the same way: per row,
// a code of `bits` (4 or 8) per weight, and per `group` (16 or 32) consecutive weights a
// float32 scale and, for the types with mins, a float32 min:
//
//   w = scale · float(code − zero) − min        (each operation rounded to float32)
//
// Why repack rather than keep ggml's bytes: the awkward parts of ggml's layouts (6-bit
// scales and mins packed into 12 bytes, Q5_K's and Q6_K's high bits stored apart from
// the low ones, nibble orders that differ per type, 18- and 34-byte blocks that break
// every load's alignment) are decoded here, in plain C++ that a CPU test checks bit for bit
// against ggml's dequantization (tests/gpu/quant_linear_test.cc), so the device code that
// has to be right without a GPU to try it on is one short formula over aligned loads.
// The scales are the products ggml's dequantization forms first (d·sc, dmin·m), kept in
// float32, so the formula gives ggml's values bit for bit.
//
// The cost is bytes: 5-bit and 6-bit codes take a byte, and a float scale (and min) per
// group replaces ggml's packed ones. Bits per weight, ggml → here: Q8_0 8.5 → 9, Q4_0
// 4.5 → 5, Q4_1 5 → 6, Q4_K 4.5 → 6, Q5_K 5.5 → 10, Q6_K 6.56 → 10 (bf16: 16). Q4_1's
// w = d·q + m is bits 4, group 32, zero 0 and min −m: d·q − (−m) is d·q + m exactly.
//
// Adding a block type: a case in GpuQuantFormatOf and one in the block decoder
// (quant_layout.cc); the kernels need nothing new if its codes fit 4 or 8 bits and its
// groups are a multiple of 8 weights.
//
// No CUDA headers: the worker-side code and the CPU tests use this.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/quant_blocks.h"

namespace conveyor::kernels::cuda {

// How one block type's weights are stored in the layout above.
struct GpuQuantFormat {
  int bits = 8;    // Code width: 4 or 8.
  int group = 32;  // Weights per scale (and min): 16 or 32.
  int zero = 0;    // Subtracted from each code.
  bool has_min = false;
};

// The format `type` is repacked into.
GpuQuantFormat GpuQuantFormatOf(QuantBlockType type);

// One part's rows (QuantizedRows) in the layout above, on the host.
struct GpuQuantRows {
  int rows = 0;
  int in_features = 0;
  GpuQuantFormat format;
  // [rows, in_features · bits / 8]. With 4 bits, weight 2i of a row is the low nibble of
  // the row's byte i and weight 2i+1 its high nibble.
  std::vector<uint8_t> codes;
  std::vector<float> scales;  // [rows, in_features / group].
  std::vector<float> mins;    // As scales when format.has_min, else empty.
};

// Bytes of codes per row: in_features · bits / 8.
inline size_t GpuQuantCodeBytesPerRow(const GpuQuantFormat& format, int in_features) {
  return static_cast<size_t>(in_features) * format.bits / 8;
}

// Repacks `part` (rows of `in_features` weights in ggml blocks). INVALID_ARGUMENT for no
// rows, a null pointer, an unknown type, or a width that is not a positive whole number
// of the type's blocks.
absl::StatusOr<GpuQuantRows> RepackQuantizedRows(const QuantizedRows& part, int in_features);

// Weight (row, col) of `rows`, computed as the kernels compute it (for tests).
float GpuQuantWeight(const GpuQuantRows& rows, int row, int col);

}  // namespace conveyor::kernels::cuda
