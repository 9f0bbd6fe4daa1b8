#include "checkpoint/quantized_linear.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"

namespace conveyor {
namespace {

// Tensors are read with memcpy as host values (safetensors is little-endian).
static_assert(std::endian::native == std::endian::little, "little-endian host required");

constexpr int64_t kBlock = 32;     // Weights per Q4_0 / Q4_1 / Q8_0 block.
constexpr int64_t kRowChunk = 64;  // Rows unpacked at a time.
// AWQ's interleaving: output 8w + c of a word sits at nibble kAwqNibble[c] (AutoAWQ packs
// nibble k from output order[k], order = 0, 2, 4, 6, 1, 3, 5, 7; this is its inverse).
constexpr int kAwqNibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

uint32_t Load32(const std::byte* p) {
  uint32_t value;
  std::memcpy(&value, p, sizeof(value));
  return value;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

}  // namespace

absl::StatusOr<QuantizedLinear> QuantizedLinear::Make(const WeightQuantization& quantization,
                                                      const std::string& layer,
                                                      const std::string& path,
                                                      const Tensors& tensors) {
  const bool awq = quantization.method == WeightQuantization::Method::kAwq;
  const std::string what = absl::StrCat(path, ": ", awq ? "AWQ" : "GPTQ", " layer '", layer,
                                        "' (quant_method '", quantization.method_name, "')");
  auto malformed = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", problem));
  };
  auto unmapped = [&](const std::string& problem) {
    return absl::UnimplementedError(
        absl::StrCat(what, ": ", problem, ", which does not map to ggml blocks"));
  };
  auto check_dtype = [&](const RawTensorView& t, const char* dtype) -> absl::Status {
    if (t.dtype == dtype) return absl::OkStatus();
    return malformed(
        absl::StrCat("tensor '", t.name, "' has dtype ", t.dtype, ", expected ", dtype));
  };
  auto check_shape = [&](const RawTensorView& t, const std::vector<int64_t>& want) -> absl::Status {
    if (t.shape == want) return absl::OkStatus();
    return malformed(absl::StrCat("tensor '", t.name, "' has shape ", ShapeString(t.shape),
                                  ", expected ", ShapeString(want)));
  };
  for (const RawTensorView* t : {&tensors.qweight, &tensors.qzeros}) {
    if (absl::Status s = check_dtype(*t, "I32"); !s.ok()) return s;
  }
  if (absl::Status s = check_dtype(tensors.scales, "F16"); !s.ok()) return s;
  if (tensors.qweight.shape.size() != 2 || tensors.qweight.shape[0] == 0 ||
      tensors.qweight.shape[1] == 0) {
    return malformed(absl::StrCat("tensor '", tensors.qweight.name, "' has shape ",
                                  ShapeString(tensors.qweight.shape), ", not a matrix"));
  }

  QuantizedLinear q;
  q.awq_ = awq;
  q.bits_ = quantization.bits;
  const int64_t pack = 32 / q.bits_;
  if (awq) {
    q.in_ = tensors.qweight.shape[0];
    q.out_ = tensors.qweight.shape[1] * pack;
  } else {
    q.in_ = tensors.qweight.shape[0] * pack;
    q.out_ = tensors.qweight.shape[1];
    if (q.out_ % pack != 0) {
      return malformed(absl::StrCat(q.out_, " outputs do not pack into qzeros' words of ", pack));
    }
  }
  q.group_size_ = quantization.group_size == -1 ? q.in_ : quantization.group_size;
  q.groups_ = (q.in_ + q.group_size_ - 1) / q.group_size_;
  if (absl::Status s = check_shape(tensors.scales, {q.groups_, q.out_}); !s.ok()) return s;
  if (absl::Status s = check_shape(tensors.qzeros, {q.groups_, q.out_ / pack}); !s.ok()) return s;
  q.qweight_ = tensors.qweight.data;
  q.scales_ = tensors.scales.data;

  if (tensors.g_idx) {
    const RawTensorView& g_idx = *tensors.g_idx;
    if (absl::Status s = check_dtype(g_idx, "I32"); !s.ok()) return s;
    if (absl::Status s = check_shape(g_idx, {q.in_}); !s.ok()) return s;
    for (int64_t i = 0; i < q.in_; ++i) {
      const auto group = static_cast<int32_t>(Load32(g_idx.data + 4 * i));
      if (group != i / q.group_size_) {
        return unmapped(absl::StrCat("g_idx[", i, "] is ", group, ", not ", i / q.group_size_,
                                     ": the groups are permuted (desc_act)"));
      }
    }
  }

  // Zero points, decoded: [groups, out].
  const uint32_t mask = (1u << q.bits_) - 1;
  q.zeros_.resize(static_cast<size_t>(q.groups_ * q.out_));
  bool all_mid = true;  // Every zero point 2^(bits-1).
  for (int64_t g = 0; g < q.groups_; ++g) {
    for (int64_t o = 0; o < q.out_; ++o) {
      const int64_t word = g * (q.out_ / pack) + o / pack;
      const int slot = awq ? kAwqNibble[o % 8] : static_cast<int>(o % pack);
      const uint32_t stored = (Load32(tensors.qzeros.data + 4 * word) >> (q.bits_ * slot)) & mask;
      if (quantization.zero_offset != 0 && stored == mask) {
        return unmapped(absl::StrCat(
            "the zero point of group ", g, ", output ", o, " is stored as ", stored,
            " in the v1 format (zero point minus one): a zero point of 0 that AutoGPTQ's and "
            "GPTQModel's readers decode differently"));
      }
      const uint32_t zero = stored + quantization.zero_offset;
      q.zeros_[g * q.out_ + o] = static_cast<uint8_t>(zero);
      all_mid &= zero == (mask + 1) / 2;
      const float scale = HalfToFloat(q.ScaleBits(g, o));
      if (!std::isfinite(scale) || !std::isfinite(scale * static_cast<float>(zero)) ||
          std::fabs(scale * static_cast<float>(zero)) > 65504.0f) {
        return unmapped(absl::StrCat("the scale of group ", g, ", output ", o, " is ", scale,
                                     " (zero point ", zero, ")"));
      }
    }
  }
  if (q.bits_ == 8) {
    if (!all_mid) {
      return unmapped("8-bit zero points other than 128 (Q8_0 has none)");
    }
    q.block_type_ = GgmlType::kQ8_0;
  } else {
    q.block_type_ = all_mid ? GgmlType::kQ4_0 : GgmlType::kQ4_1;
  }
  return q;
}

uint16_t QuantizedLinear::ScaleBits(int64_t group, int64_t row) const {
  uint16_t bits;
  std::memcpy(&bits, scales_ + 2 * (group * out_ + row), sizeof(bits));
  return bits;
}

void QuantizedLinear::Unpack(int64_t row_begin, int64_t row_end, std::vector<uint8_t>* q) const {
  const int64_t rows = row_end - row_begin;
  q->resize(static_cast<size_t>(rows * in_));
  uint8_t* dst = q->data();
  const uint32_t mask = (1u << bits_) - 1;
  if (awq_) {  // [in, out / 8]: one input's outputs along a row of words.
    const int64_t words = out_ / 8;
    for (int64_t i = 0; i < in_; ++i) {
      const std::byte* src = qweight_ + 4 * i * words;
      for (int64_t r = row_begin; r < row_end; ++r) {
        const uint32_t word = Load32(src + 4 * (r / 8));
        dst[(r - row_begin) * in_ + i] =
            static_cast<uint8_t>((word >> (4 * kAwqNibble[r % 8])) & mask);
      }
    }
    return;
  }
  // GPTQ: [in / pack, out]: `pack` consecutive inputs of one output per word.
  const int64_t pack = 32 / bits_;
  for (int64_t p = 0; p < in_ / pack; ++p) {
    const std::byte* src = qweight_ + 4 * (p * out_ + row_begin);
    for (int64_t r = 0; r < rows; ++r) {
      const uint32_t word = Load32(src + 4 * r);
      uint8_t* values = dst + r * in_ + p * pack;
      for (int64_t j = 0; j < pack; ++j) {
        values[j] = static_cast<uint8_t>((word >> (bits_ * j)) & mask);
      }
    }
  }
}

namespace {

// float8_e4m3fn: 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinities, S.1111.111
// is NaN. Every value is exact in float32.
float E4m3ToFloat(uint8_t bits) {
  const int exponent = (bits >> 3) & 0xf, mantissa = bits & 7;
  const float magnitude = exponent == 0
                              ? std::ldexp(static_cast<float>(mantissa), -9)
                              : std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  return (bits & 0x80) != 0 ? -magnitude : magnitude;
}

bool IsE4m3Nan(uint8_t bits) { return (bits & 0x7f) == 0x7f; }

const std::array<float, 256>& E4m3Table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int b = 0; b < 256; ++b) t[b] = E4m3ToFloat(static_cast<uint8_t>(b));
    return t;
  }();
  return table;
}

}  // namespace

absl::StatusOr<QuantizedLinear> QuantizedLinear::MakeFp8(const WeightQuantization& quantization,
                                                         const std::string& layer,
                                                         const std::string& path,
                                                         const RawTensorView& weight,
                                                         const RawTensorView& scale) {
  const std::string what = absl::StrCat(path, ": FP8 layer '", layer, "' (quant_method '",
                                        quantization.method_name, "')");
  auto malformed = [&](const std::string& problem) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", problem));
  };
  if (weight.dtype != "F8_E4M3") {
    return malformed(
        absl::StrCat("tensor '", weight.name, "' has dtype ", weight.dtype, ", expected F8_E4M3"));
  }
  if (weight.shape.size() != 2 || weight.shape[0] <= 0 || weight.shape[1] <= 0) {
    return malformed(absl::StrCat("tensor '", weight.name, "' has shape ",
                                  ShapeString(weight.shape), ", expected [out, in]"));
  }
  QuantizedLinear q;
  q.fp8_ = true;
  q.out_ = weight.shape[0];
  q.in_ = weight.shape[1];
  q.fp8_block_rows_ = quantization.fp8_block_rows;
  q.fp8_block_cols_ = quantization.fp8_block_cols;
  const std::vector<int64_t> scale_shape = {(q.out_ + q.fp8_block_rows_ - 1) / q.fp8_block_rows_,
                                            (q.in_ + q.fp8_block_cols_ - 1) / q.fp8_block_cols_};
  if (scale.shape != scale_shape) {
    return malformed(absl::StrCat("tensor '", scale.name, "' has shape ", ShapeString(scale.shape),
                                  ", expected ", ShapeString(scale_shape), " (one scale per ",
                                  q.fp8_block_rows_, " x ", q.fp8_block_cols_, " block)"));
  }
  std::optional<DType> scale_dtype;
  if (scale.dtype == "F32") scale_dtype = DType::kF32;
  if (scale.dtype == "BF16") scale_dtype = DType::kBF16;
  if (scale.dtype == "F16") scale_dtype = DType::kF16;
  if (!scale_dtype.has_value()) {
    return malformed(absl::StrCat("tensor '", scale.name, "' has dtype ", scale.dtype,
                                  ", expected F32, BF16 or F16"));
  }
  const size_t scales = static_cast<size_t>(scale_shape[0] * scale_shape[1]);
  q.fp8_scales_.resize(scales);
  ConvertToF32(*scale_dtype, scale.data, scales, q.fp8_scales_.data());
  for (size_t i = 0; i < scales; ++i) {
    if (!std::isfinite(q.fp8_scales_[i])) {
      return malformed(
          absl::StrCat("tensor '", scale.name, "' holds ", q.fp8_scales_[i], " at index ", i));
    }
  }
  q.fp8_weight_ = weight.data;
  const auto* bytes = reinterpret_cast<const uint8_t*>(weight.data);
  const size_t count = static_cast<size_t>(q.out_ * q.in_);
  for (size_t i = 0; i < count; ++i) {
    if (IsE4m3Nan(bytes[i])) {
      return malformed(absl::StrCat("tensor '", weight.name, "' holds NaN at row ", i / q.in_,
                                    ", column ", i % q.in_));
    }
  }
  return q;
}

void QuantizedLinear::DequantizeFp8(int64_t row_begin, int64_t row_end, int64_t col_begin,
                                    int64_t col_end, float* out) const {
  const std::array<float, 256>& table = E4m3Table();
  const auto* bytes = reinterpret_cast<const uint8_t*>(fp8_weight_);
  const int64_t scale_cols = (in_ + fp8_block_cols_ - 1) / fp8_block_cols_;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const float* scales = fp8_scales_.data() + (r / fp8_block_rows_) * scale_cols;
    const uint8_t* row = bytes + r * in_;
    for (int64_t c = col_begin; c < col_end; ++c) {
      *out++ = table[row[c]] * scales[c / fp8_block_cols_];
    }
  }
}

void QuantizedLinear::Dequantize(int64_t row_begin, int64_t row_end, int64_t col_begin,
                                 int64_t col_end, float* out) const {
  if (fp8_) {
    DequantizeFp8(row_begin, row_end, col_begin, col_end, out);
    return;
  }
  const int64_t width = col_end - col_begin;
  std::vector<uint8_t> q;
  for (int64_t chunk = row_begin; chunk < row_end; chunk += kRowChunk) {
    const int64_t chunk_end = std::min(row_end, chunk + kRowChunk);
    Unpack(chunk, chunk_end, &q);
    for (int64_t r = chunk; r < chunk_end; ++r) {
      const uint8_t* values = q.data() + (r - chunk) * in_;
      float* dst = out + (r - row_begin) * width;
      for (int64_t i = col_begin; i < col_end;) {
        const int64_t g = i / group_size_;
        const int64_t group_end = std::min(col_end, (g + 1) * group_size_);
        const float scale = HalfToFloat(ScaleBits(g, r));
        const int zero = zeros_[g * out_ + r];
        // Exact: an 11-bit significand times an integer of at most 9 bits.
        for (; i < group_end; ++i) {
          dst[i - col_begin] = scale * static_cast<float>(values[i] - zero);
        }
      }
    }
  }
}

void QuantizedLinear::AppendBlocks(int64_t row_begin, int64_t row_end, int64_t col_begin,
                                   int64_t col_end, std::vector<std::byte>* out) const {
  const GgmlTypeTraits traits = TraitsOf(block_type_);
  const int64_t blocks = (col_end - col_begin) / kBlock;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>((row_end - row_begin) * blocks * traits.block_bytes));
  std::byte* dst = out->data() + at;
  std::vector<uint8_t> q;
  for (int64_t chunk = row_begin; chunk < row_end; chunk += kRowChunk) {
    const int64_t chunk_end = std::min(row_end, chunk + kRowChunk);
    Unpack(chunk, chunk_end, &q);
    for (int64_t r = chunk; r < chunk_end; ++r) {
      const uint8_t* values = q.data() + (r - chunk) * in_;
      for (int64_t b = col_begin / kBlock; b < col_end / kBlock; ++b, dst += traits.block_bytes) {
        // group_size is a multiple of 32 (or the whole row): the block is in one group.
        const int64_t g = b * kBlock / group_size_;
        const uint16_t d = ScaleBits(g, r);
        const uint8_t* qs = values + b * kBlock;
        std::memcpy(dst, &d, 2);
        if (block_type_ == GgmlType::kQ8_0) {  // int8 q − 128.
          for (int j = 0; j < kBlock; ++j) {
            dst[2 + j] = static_cast<std::byte>(static_cast<int8_t>(qs[j] - 128));
          }
          continue;
        }
        std::byte* nibbles = dst + 2;
        if (block_type_ == GgmlType::kQ4_1) {  // m = −scale·zero, rounded to fp16.
          const uint16_t m =
              FloatToHalf(-(HalfToFloat(d) * static_cast<float>(zeros_[g * out_ + r])));
          std::memcpy(dst + 2, &m, 2);
          nibbles = dst + 4;
        }
        // ggml's order: byte j holds weight j (low nibble) and weight j + 16 (high).
        for (int j = 0; j < kBlock / 2; ++j) {
          nibbles[j] = static_cast<std::byte>(qs[j] | (qs[j + 16] << 4));
        }
      }
    }
  }
}

}  // namespace conveyor
