#include "checkpoint/ggml_types.h"

#include <bit>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"

namespace conveyor {
namespace {

// Blocks are read with memcpy as host values: GGUF is little-endian (gguf.h refuses the
// rest), and so must the host be.
static_assert(std::endian::native == std::endian::little, "little-endian host required");

constexpr int64_t kQK_K = 256;  // Elements of a K-quant super-block.

constexpr GgmlTypeTraits kTypes[] = {
    {GgmlType::kF32, "F32", 1, 4, true},
    {GgmlType::kF16, "F16", 1, 2, true},
    {GgmlType::kQ4_0, "Q4_0", 32, 2 + 16, true},
    {GgmlType::kQ4_1, "Q4_1", 32, 2 + 2 + 16, true},
    {GgmlType::kQ5_0, "Q5_0", 32, 2 + 4 + 16, false},
    {GgmlType::kQ5_1, "Q5_1", 32, 2 + 2 + 4 + 16, false},
    {GgmlType::kQ8_0, "Q8_0", 32, 2 + 32, true},
    {GgmlType::kQ8_1, "Q8_1", 32, 4 + 4 + 32, false},
    {GgmlType::kQ2_K, "Q2_K", kQK_K, 2 + 2 + kQK_K / 16 + kQK_K / 4, false},
    {GgmlType::kQ3_K, "Q3_K", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + 12, false},
    {GgmlType::kQ4_K, "Q4_K", kQK_K, 2 + 2 + kQK_K / 2 + 12, true},
    {GgmlType::kQ5_K, "Q5_K", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 8 + 12, true},
    {GgmlType::kQ6_K, "Q6_K", kQK_K, 2 + kQK_K / 2 + kQK_K / 4 + kQK_K / 16, true},
    {GgmlType::kQ8_K, "Q8_K", kQK_K, 4 + kQK_K + kQK_K / 8, false},
    {GgmlType::kIQ2_XXS, "IQ2_XXS", kQK_K, 2 + kQK_K / 4, false},
    {GgmlType::kIQ2_XS, "IQ2_XS", kQK_K, 2 + kQK_K / 4 + kQK_K / 32, false},
    {GgmlType::kIQ3_XXS, "IQ3_XXS", kQK_K, 2 + kQK_K / 4 + kQK_K / 8, false},
    {GgmlType::kIQ1_S, "IQ1_S", kQK_K, 2 + kQK_K / 8 + kQK_K / 16, false},
    {GgmlType::kIQ4_NL, "IQ4_NL", 32, 2 + 16, false},
    {GgmlType::kIQ3_S, "IQ3_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 8 + kQK_K / 32 + 4, false},
    {GgmlType::kIQ2_S, "IQ2_S", kQK_K, 2 + kQK_K / 4 + kQK_K / 16, false},
    {GgmlType::kIQ4_XS, "IQ4_XS", kQK_K, 2 + 2 + kQK_K / 2 + kQK_K / 64, false},
    {GgmlType::kI8, "I8", 1, 1, false},
    {GgmlType::kI16, "I16", 1, 2, false},
    {GgmlType::kI32, "I32", 1, 4, false},
    {GgmlType::kI64, "I64", 1, 8, false},
    {GgmlType::kF64, "F64", 1, 8, false},
    {GgmlType::kIQ1_M, "IQ1_M", kQK_K, kQK_K / 8 + kQK_K / 16 + kQK_K / 32, false},
    {GgmlType::kBF16, "BF16", 1, 2, true},
    {GgmlType::kTQ1_0, "TQ1_0", kQK_K, 2 + 4 * 13, false},
    {GgmlType::kTQ2_0, "TQ2_0", kQK_K, 2 + 64, false},
    {GgmlType::kMXFP4, "MXFP4", 32, 1 + 16, false},
};

float LoadHalf(const std::byte* p) {
  uint16_t half;
  std::memcpy(&half, p, sizeof(half));
  return HalfToFloat(half);
}

const uint8_t* Bytes(const std::byte* p) { return reinterpret_cast<const uint8_t*>(p); }

// Block layouts (ggml-common.h) and dequantize_row_* (ggml-quants.c). Every product is
// written in ggml's order and rounded to float at each step (the file is compiled with
// -ffp-contract=off), which is what makes the results bit-equal.

void DequantizeQ8_0(const std::byte* block, float* y) {
  const float d = LoadHalf(block);
  const auto* qs = reinterpret_cast<const int8_t*>(block + 2);
  for (int j = 0; j < 32; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void DequantizeQ4_0(const std::byte* block, float* y) {
  const float d = LoadHalf(block);
  const uint8_t* qs = Bytes(block + 2);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>((qs[j] & 0x0f) - 8) * d;
    y[j + 16] = static_cast<float>((qs[j] >> 4) - 8) * d;
  }
}

// block_q4_1: half d, half m, uint8 qs[16]. ggml rounds the product, then adds m.
void DequantizeQ4_1(const std::byte* block, float* y) {
  const float d = LoadHalf(block);
  const float m = LoadHalf(block + 2);
  const uint8_t* qs = Bytes(block + 4);
  for (int j = 0; j < 16; ++j) {
    y[j] = static_cast<float>(qs[j] & 0x0f) * d + m;
    y[j + 16] = static_cast<float>(qs[j] >> 4) * d + m;
  }
}

// The 6-bit scale and min of sub-block `j` (0..7) of a Q4_K / Q5_K super-block, packed in
// 12 bytes (ggml's get_scale_min_k4).
void ScaleMinK4(int j, const uint8_t* q, uint8_t* scale, uint8_t* min) {
  if (j < 4) {
    *scale = q[j] & 63;
    *min = q[j + 4] & 63;
  } else {
    *scale = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
    *min = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
  }
}

// block_q4_K: half d, half dmin, uint8 scales[12], uint8 qs[128].
void DequantizeQ4_K(const std::byte* block, float* y) {
  const float d = LoadHalf(block);
  const float min = LoadHalf(block + 2);
  const uint8_t* scales = Bytes(block + 4);
  const uint8_t* q = Bytes(block + 16);
  int is = 0;
  for (int j = 0; j < kQK_K; j += 64) {
    uint8_t sc, m;
    ScaleMinK4(is + 0, scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    ScaleMinK4(is + 1, scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0x0f) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    q += 32;
    is += 2;
  }
}

// block_q5_K: half d, half dmin, uint8 scales[12], uint8 qh[32], uint8 qs[128].
void DequantizeQ5_K(const std::byte* block, float* y) {
  const float d = LoadHalf(block);
  const float min = LoadHalf(block + 2);
  const uint8_t* scales = Bytes(block + 4);
  const uint8_t* qh = Bytes(block + 16);
  const uint8_t* ql = Bytes(block + 48);
  int is = 0;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0; j < kQK_K; j += 64) {
    uint8_t sc, m;
    ScaleMinK4(is + 0, scales, &sc, &m);
    const float d1 = d * sc;
    const float m1 = min * m;
    ScaleMinK4(is + 1, scales, &sc, &m);
    const float d2 = d * sc;
    const float m2 = min * m;
    for (int l = 0; l < 32; ++l) {
      *y++ = d1 * static_cast<float>((ql[l] & 0x0f) + ((qh[l] & u1) != 0 ? 16 : 0)) - m1;
    }
    for (int l = 0; l < 32; ++l) {
      *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) != 0 ? 16 : 0)) - m2;
    }
    ql += 32;
    is += 2;
    u1 <<= 2;
    u2 <<= 2;
  }
}

// block_q6_K: uint8 ql[128], uint8 qh[64], int8 scales[16], half d.
void DequantizeQ6_K(const std::byte* block, float* y) {
  const uint8_t* ql = Bytes(block);
  const uint8_t* qh = Bytes(block + 128);
  const auto* sc = reinterpret_cast<const int8_t*>(block + 192);
  const float d = LoadHalf(block + 208);
  for (int n = 0; n < kQK_K; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0x0f) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0x0f) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

}  // namespace

std::optional<GgmlTypeTraits> GgmlTypeFromId(uint32_t id) {
  for (const GgmlTypeTraits& traits : kTypes) {
    if (static_cast<uint32_t>(traits.type) == id) return traits;
  }
  return std::nullopt;
}

GgmlTypeTraits TraitsOf(GgmlType type) {
  // Every enumerator is in the table.
  return *GgmlTypeFromId(static_cast<uint32_t>(type));
}

std::string SupportedGgmlTypes() {
  std::vector<const char*> names;
  for (GgmlType type :
       {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0, GgmlType::kQ4_0,
        GgmlType::kQ4_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
    names.push_back(TraitsOf(type).name);
  }
  return absl::StrJoin(names, ", ");
}

absl::Status DequantizeToF32(GgmlType type, const std::byte* src, int64_t count, float* dst) {
  const GgmlTypeTraits traits = TraitsOf(type);
  if (!traits.supported) {
    return absl::UnimplementedError(absl::StrCat(
        "tensor type ", traits.name, " is not supported (supported: ", SupportedGgmlTypes(), ")"));
  }
  if (count < 0 || count % traits.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat(count, " elements are not whole ", traits.name,
                                                   " blocks of ", traits.block_elements));
  }
  const int64_t blocks = count / traits.block_elements;
  void (*dequantize_block)(const std::byte*, float*) = nullptr;
  switch (type) {
    case GgmlType::kF32:
      if (count > 0) std::memcpy(dst, src, static_cast<size_t>(count) * sizeof(float));
      return absl::OkStatus();
    case GgmlType::kF16:
      for (int64_t i = 0; i < count; ++i) dst[i] = LoadHalf(src + 2 * i);
      return absl::OkStatus();
    case GgmlType::kBF16:
      for (int64_t i = 0; i < count; ++i) {
        uint16_t bf16;
        std::memcpy(&bf16, src + 2 * i, sizeof(bf16));
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
      }
      return absl::OkStatus();
    case GgmlType::kQ8_0:
      dequantize_block = DequantizeQ8_0;
      break;
    case GgmlType::kQ4_0:
      dequantize_block = DequantizeQ4_0;
      break;
    case GgmlType::kQ4_1:
      dequantize_block = DequantizeQ4_1;
      break;
    case GgmlType::kQ4_K:
      dequantize_block = DequantizeQ4_K;
      break;
    case GgmlType::kQ5_K:
      dequantize_block = DequantizeQ5_K;
      break;
    case GgmlType::kQ6_K:
      dequantize_block = DequantizeQ6_K;
      break;
    default:
      return absl::InternalError(absl::StrCat("no dequantization for ", traits.name));
  }
  for (int64_t b = 0; b < blocks; ++b) {
    dequantize_block(src + b * traits.block_bytes, dst + b * traits.block_elements);
  }
  return absl::OkStatus();
}

}  // namespace conveyor
