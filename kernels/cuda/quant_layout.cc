// Repacking of ggml blocks into the CUDA backend's quantized layout (quant_layout.h). The
// block layouts are ggml's (ggml-common.h), read as its dequantize_row_* reads them; every
// product is rounded to float32 on its own (this file is compiled without FP contraction).
#include "kernels/cuda/quant_layout.h"

#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace conveyor::kernels::cuda {
namespace {

// The float32 value of IEEE binary16 bits (exact).
float HalfToFloat(uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float magnitude = 0.0f;
  if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 0x1f) {
    magnitude = mantissa == 0 ? INFINITY : NAN;
  } else {
    magnitude = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}

float LoadHalf(const uint8_t* p) {
  uint16_t h = 0;
  std::memcpy(&h, p, sizeof(h));
  return HalfToFloat(h);
}

// Decodes one block of `type`: its weights' codes (one per byte, in weight order), and the
// scale (and min) of each of its groups, in the format GpuQuantFormatOf(type) names.
void DecodeBlock(QuantBlockType type, const uint8_t* block, uint8_t* codes, float* scales,
                 float* mins) {
  switch (type) {
    case QuantBlockType::kQ8_0: {  // half d, int8 qs[32]; w = qs·d.
      scales[0] = LoadHalf(block);
      for (int j = 0; j < 32; ++j) codes[j] = static_cast<uint8_t>(block[2 + j] ^ 0x80);
      return;
    }
    case QuantBlockType::kQ4_0: {  // half d, qs[16]; w = (q − 8)·d, low nibbles first.
      scales[0] = LoadHalf(block);
      for (int j = 0; j < 16; ++j) {
        codes[j] = block[2 + j] & 0x0f;
        codes[j + 16] = block[2 + j] >> 4;
      }
      return;
    }
    case QuantBlockType::kQ4_1: {  // half d, half m, qs[16]; w = q·d + m: min −m.
      scales[0] = LoadHalf(block);
      mins[0] = -LoadHalf(block + 2);
      for (int j = 0; j < 16; ++j) {
        codes[j] = block[4 + j] & 0x0f;
        codes[j + 16] = block[4 + j] >> 4;
      }
      return;
    }
    case QuantBlockType::kQ4_K:    // half d, half dmin, scales[12], qs[128].
    case QuantBlockType::kQ5_K: {  // The same, with qh[32] before qs.
      const float d = LoadHalf(block);
      const float dmin = LoadHalf(block + 2);
      const uint8_t* packed = block + 4;
      const bool five = type == QuantBlockType::kQ5_K;
      const uint8_t* qh = block + 16;
      const uint8_t* ql = block + (five ? 48 : 16);
      for (int j = 0; j < 8; ++j) {
        int sc = 0, m = 0;
        UnpackScaleMinK4(j, packed, &sc, &m);
        scales[j] = d * static_cast<float>(sc);
        mins[j] = dmin * static_cast<float>(m);
      }
      // Each 64 weights: the low nibbles of 32 bytes, then their high nibbles; Q5_K's
      // fifth bit of weight 64·p + 32·h + l is bit 2p + h of qh[l].
      for (int p = 0; p < 4; ++p) {
        for (int l = 0; l < 32; ++l) {
          const uint8_t byte = ql[32 * p + l];
          int low = byte & 0x0f, high = byte >> 4;
          if (five) {
            low += ((qh[l] >> (2 * p)) & 1) << 4;
            high += ((qh[l] >> (2 * p + 1)) & 1) << 4;
          }
          codes[64 * p + l] = static_cast<uint8_t>(low);
          codes[64 * p + 32 + l] = static_cast<uint8_t>(high);
        }
      }
      return;
    }
    case QuantBlockType::kQ6_K: {  // ql[128], qh[64], int8 scales[16], half d.
      const uint8_t* ql = block;
      const uint8_t* qh = block + 128;
      const float d = LoadHalf(block + 208);
      for (int g = 0; g < 16; ++g) {
        scales[g] = d * static_cast<float>(static_cast<int8_t>(block[192 + g]));
      }
      // Each 128 weights take 64 bytes of ql and 32 of qh: weight 128·h + 32·i + l (i in
      // 0..3) has the low or high nibble of ql[64·h + l + 32·(i % 2)] and bits 2i, 2i+1 of
      // qh[32·h + l].
      for (int h = 0; h < 2; ++h) {
        for (int l = 0; l < 32; ++l) {
          for (int i = 0; i < 4; ++i) {
            const uint8_t low_byte = ql[64 * h + l + 32 * (i % 2)];
            const int low = i < 2 ? low_byte & 0x0f : low_byte >> 4;
            const int high = (qh[32 * h + l] >> (2 * i)) & 3;
            codes[128 * h + 32 * i + l] = static_cast<uint8_t>(low | high << 4);
          }
        }
      }
      return;
    }
  }
}

}  // namespace

GpuQuantFormat GpuQuantFormatOf(QuantBlockType type) {
  switch (type) {
    case QuantBlockType::kQ8_0:
      return {.bits = 8, .group = 32, .zero = 128, .has_min = false};  // Codes are q + 128.
    case QuantBlockType::kQ4_0:
      return {.bits = 4, .group = 32, .zero = 8, .has_min = false};
    case QuantBlockType::kQ4_1:  // The min is −m.
    case QuantBlockType::kQ4_K:
      return {.bits = 4, .group = 32, .zero = 0, .has_min = true};
    case QuantBlockType::kQ5_K:
      return {.bits = 8, .group = 32, .zero = 0, .has_min = true};
    case QuantBlockType::kQ6_K:
    default:
      return {.bits = 8, .group = 16, .zero = 32, .has_min = false};
  }
}

absl::StatusOr<GpuQuantRows> RepackQuantizedRows(const QuantizedRows& part, int in_features) {
  switch (part.type) {
    case QuantBlockType::kQ8_0:
    case QuantBlockType::kQ4_0:
    case QuantBlockType::kQ4_1:
    case QuantBlockType::kQ4_K:
    case QuantBlockType::kQ5_K:
    case QuantBlockType::kQ6_K:
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "the CUDA backend has no layout for block type ", static_cast<int>(part.type)));
  }
  const int block_elements = QuantBlockElements(part.type);
  if (in_features <= 0 || in_features % block_elements != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("rows of ", QuantBlockTypeName(part.type), " blocks must be a positive ",
                     "multiple of ", block_elements, " weights wide, got ", in_features));
  }
  if (part.rows <= 0 || part.blocks == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("a part of ", part.rows, " rows of ",
                                                   QuantBlockTypeName(part.type), " blocks",
                                                   part.blocks == nullptr ? " and no bytes" : ""));
  }
  GpuQuantRows out;
  out.rows = part.rows;
  out.in_features = in_features;
  out.format = GpuQuantFormatOf(part.type);
  const GpuQuantFormat& f = out.format;
  const size_t code_bytes = GpuQuantCodeBytesPerRow(f, in_features);
  const size_t groups = static_cast<size_t>(in_features / f.group);
  out.codes.assign(code_bytes * part.rows, 0);
  out.scales.assign(groups * part.rows, 0.0f);
  if (f.has_min) out.mins.assign(groups * part.rows, 0.0f);

  const int blocks_per_row = in_features / block_elements;
  const int groups_per_block = block_elements / f.group;
  const size_t row_bytes = QuantRowBytes(part.type, in_features);
  std::vector<uint8_t> codes(block_elements);
  std::vector<float> unused_mins(groups_per_block);
  for (int r = 0; r < part.rows; ++r) {
    const auto* row = static_cast<const uint8_t*>(part.blocks) + r * row_bytes;
    uint8_t* row_codes = out.codes.data() + r * code_bytes;
    for (int b = 0; b < blocks_per_row; ++b) {
      const size_t group = r * groups + static_cast<size_t>(b) * groups_per_block;
      DecodeBlock(part.type, row + static_cast<size_t>(b) * QuantBlockBytes(part.type),
                  codes.data(), out.scales.data() + group,
                  f.has_min ? out.mins.data() + group : unused_mins.data());
      const size_t first = static_cast<size_t>(b) * block_elements;  // Of the row's weights.
      if (f.bits == 8) {
        std::memcpy(row_codes + first, codes.data(), block_elements);
      } else {
        for (int j = 0; j < block_elements; j += 2) {
          row_codes[(first + j) / 2] = static_cast<uint8_t>(codes[j] | codes[j + 1] << 4);
        }
      }
    }
  }
  return out;
}

float GpuQuantWeight(const GpuQuantRows& rows, int row, int col) {
  const GpuQuantFormat& f = rows.format;
  const uint8_t* row_codes =
      rows.codes.data() + static_cast<size_t>(row) * GpuQuantCodeBytesPerRow(f, rows.in_features);
  const int code = f.bits == 8 ? row_codes[col] : (row_codes[col / 2] >> (4 * (col % 2))) & 0x0f;
  const size_t group =
      static_cast<size_t>(row) * (rows.in_features / f.group) + static_cast<size_t>(col / f.group);
  const float scaled = rows.scales[group] * static_cast<float>(code - f.zero);
  return f.has_min ? scaled - rows.mins[group] : scaled;
}

}  // namespace conveyor::kernels::cuda
