// GGUF's block-quantized weight layouts that the backends can compute with directly
// (issue K): the block types, their sizes, and what a loader hands a backend
// (Backend::PackLinearQuantized). The layouts are ggml's (ggml-common.h); the model
// runtime only passes the bytes through, it never reads them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace conveyor::kernels {

enum class QuantBlockType {
  kQ8_0,  // 32 weights: fp16 d, int8 q[32]. w = d·q.
  kQ4_0,  // 32 weights: fp16 d, 4-bit q[32]. w = d·(q − 8).
  kQ4_1,  // 32 weights: fp16 d, fp16 m, 4-bit q[32]. w = d·q + m.
  kQ4_K,  // 256 weights: fp16 d, dmin, 6-bit scale and min per 32, 4-bit q.
  kQ5_K,  // 256 weights: as Q4_K with 5-bit q.
  kQ6_K,  // 256 weights: 6-bit q, int8 scale per 16, fp16 d. w = d·sc·(q − 32).
};

// ggml's name: "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K".
constexpr const char* QuantBlockTypeName(QuantBlockType type) {
  switch (type) {
    case QuantBlockType::kQ8_0:
      return "Q8_0";
    case QuantBlockType::kQ4_0:
      return "Q4_0";
    case QuantBlockType::kQ4_1:
      return "Q4_1";
    case QuantBlockType::kQ4_K:
      return "Q4_K";
    case QuantBlockType::kQ5_K:
      return "Q5_K";
    case QuantBlockType::kQ6_K:
    default:
      return "Q6_K";
  }
}

// Weights per block: 32 or 256.
constexpr int QuantBlockElements(QuantBlockType type) {
  return type == QuantBlockType::kQ8_0 || type == QuantBlockType::kQ4_0 ||
                 type == QuantBlockType::kQ4_1
             ? 32
             : 256;
}

// Bytes per block.
constexpr int QuantBlockBytes(QuantBlockType type) {
  switch (type) {
    case QuantBlockType::kQ8_0:
      return 34;
    case QuantBlockType::kQ4_0:
      return 18;
    case QuantBlockType::kQ4_1:
      return 20;
    case QuantBlockType::kQ4_K:
      return 144;
    case QuantBlockType::kQ5_K:
      return 176;
    case QuantBlockType::kQ6_K:
    default:
      return 210;
  }
}

// Bytes of one row of `k` weights (k a whole number of blocks).
constexpr size_t QuantRowBytes(QuantBlockType type, int k) {
  return static_cast<size_t>(k / QuantBlockElements(type)) * QuantBlockBytes(type);
}

// The 6-bit scale and min of sub-block `j` (0..7) of a Q4_K / Q5_K block, packed in its
// 12 scale bytes (ggml's get_scale_min_k4). Integer-only, so the same code whatever
// instruction set a kernel file is compiled for.
constexpr void UnpackScaleMinK4(int j, const uint8_t* packed, int* scale, int* min) {
  if (j < 4) {
    *scale = packed[j] & 63;
    *min = packed[j + 4] & 63;
  } else {
    *scale = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
    *min = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
  }
}

// Consecutive output rows of a linear weight, in one block type: `rows` rows of
// QuantRowBytes(type, in_features) bytes each, row r of the part at blocks + r * that.
struct QuantizedRows {
  QuantBlockType type = QuantBlockType::kQ8_0;
  int rows = 0;
  const void* blocks = nullptr;
};

}  // namespace conveyor::kernels
