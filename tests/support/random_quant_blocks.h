// Random ggml blocks for the quantized-kernel tests (CPU and GPU) and their reference
// dequantization (checkpoint/ggml_types.h, bit-exact with ggml). Header-only: the GPU-only
// test build (tests/gpu) uses it too.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "checkpoint/ggml_types.h"
#include "kernels/quant_blocks.h"

namespace conveyor::testing {

inline GgmlType GgmlOf(kernels::QuantBlockType type) {
  using kernels::QuantBlockType;
  switch (type) {
    case QuantBlockType::kQ8_0:
      return GgmlType::kQ8_0;
    case QuantBlockType::kQ4_0:
      return GgmlType::kQ4_0;
    case QuantBlockType::kQ4_1:
      return GgmlType::kQ4_1;
    case QuantBlockType::kQ4_K:
      return GgmlType::kQ4_K;
    case QuantBlockType::kQ5_K:
      return GgmlType::kQ5_K;
    case QuantBlockType::kQ6_K:
    default:
      return GgmlType::kQ6_K;
  }
}

// A random fp16 of magnitude in [2^-9, 2^-5), either sign.
inline uint16_t RandomHalf(std::mt19937& rng) {
  const uint32_t exponent = 6 + rng() % 4;
  return static_cast<uint16_t>((rng() & 1) << 15 | exponent << 10 | (rng() & 0x3ff));
}

// `rows` rows of `k` weights of `type`: random bytes (so every code, Q8_0's -128 included,
// and every packing of the 6-bit scales and mins occur) with random finite fp16 scales.
inline std::vector<uint8_t> RandomBlocks(kernels::QuantBlockType type, int rows, int k,
                                         std::mt19937& rng) {
  using kernels::QuantBlockType;
  std::vector<uint8_t> bytes(kernels::QuantRowBytes(type, k) * rows);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  auto put_half = [](uint8_t* p, uint16_t h) { std::memcpy(p, &h, sizeof(h)); };
  const int block_bytes = kernels::QuantBlockBytes(type);
  for (size_t at = 0; at < bytes.size(); at += block_bytes) {
    uint8_t* block = bytes.data() + at;
    switch (type) {
      case QuantBlockType::kQ8_0:
      case QuantBlockType::kQ4_0:
        put_half(block, RandomHalf(rng));
        break;
      case QuantBlockType::kQ4_1:
        put_half(block, RandomHalf(rng));
        put_half(block + 2, RandomHalf(rng));  // m: either sign.
        break;
      case QuantBlockType::kQ4_K:
      case QuantBlockType::kQ5_K:
        put_half(block, RandomHalf(rng));
        put_half(block + 2, RandomHalf(rng) & 0x7fff);  // dmin >= 0, as ggml writes it.
        break;
      case QuantBlockType::kQ6_K:
        put_half(block + 208, RandomHalf(rng));
        break;
    }
  }
  return bytes;
}

// ggml's float32 weights [rows, k] of `blocks`.
inline std::vector<float> GgmlWeights(kernels::QuantBlockType type,
                                      const std::vector<uint8_t>& blocks, int rows, int k) {
  std::vector<float> w(static_cast<size_t>(rows) * k);
  const absl::Status s = DequantizeToF32(
      GgmlOf(type), reinterpret_cast<const std::byte*>(blocks.data()), w.size(), w.data());
  EXPECT_TRUE(s.ok()) << s;
  return w;
}

}  // namespace conveyor::testing
