// GPTQ and AWQ checkpoints (checkpoint/quantized_linear.h) on hand-made files: the
// quantization_config refusals, each named; per-tensor refusals at Checkpoint::Open; values
// worked out by hand for each packing (the bit order, AWQ's interleaving, the v1 zero
// offset), and FloatToHalf's rounding. tests/worker/gptq_awq_model_test.cc checks whole
// models against the independent numpy reference (tests/quant_ref/make_gptq_awq.py).
#include <bit>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "checkpoint/file_util.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors_test_util.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A minimal config.json with `quantization` as its quantization_config.
std::string ConfigWith(const nlohmann::json& quantization) {
  nlohmann::json config = {
      {"model_type", "llama"},          {"vocab_size", 32},        {"hidden_size", 64},
      {"intermediate_size", 64},        {"num_hidden_layers", 1},  {"num_attention_heads", 2},
      {"max_position_embeddings", 128}, {"torch_dtype", "float16"}};
  config["quantization_config"] = quantization;
  return config.dump();
}

TEST(QuantizationConfigTest, MapsGptqAndAwq) {
  struct Case {
    nlohmann::json quantization;
    std::string torch_dtype;
    int zero_offset;
  };
  const Case cases[] = {
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 128}, {"sym", true}}, "Q4_0", 1},
      {{{"quant_method", "gptq"},
        {"bits", 4},
        {"group_size", -1},
        {"sym", false},
        {"checkpoint_format", "gptq_v2"}},
       "Q4_1",
       0},
      {{{"quant_method", "gptq"}, {"bits", 8}, {"group_size", 32}, {"desc_act", true}}, "Q8_0", 1},
      // AutoAWQ's own spellings.
      {{{"quant_method", "awq"}, {"w_bit", 4}, {"q_group_size", 64}, {"version", "GEMM"}},
       "Q4_1",
       0},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.quantization.dump());
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig(ConfigWith(c.quantization), "config.json");
    ASSERT_TRUE(config.ok()) << config.status();
    EXPECT_EQ(config->torch_dtype, c.torch_dtype);
    EXPECT_NE(config->quantization.method, WeightQuantization::Method::kNone);
    EXPECT_EQ(config->quantization.zero_offset, c.zero_offset);
  }
  absl::StatusOr<ModelConfig> plain = ParseModelConfig(
      R"({"model_type": "llama", "vocab_size": 32, "hidden_size": 64, "intermediate_size": 64,
          "num_hidden_layers": 1, "num_attention_heads": 2, "max_position_embeddings": 128})",
      "config.json");
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(plain->quantization.method, WeightQuantization::Method::kNone);
}

TEST(QuantizationConfigTest, ReadsBlockWiseFp8) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(
      ConfigWith({{"quant_method", "fp8"}, {"activation_scheme", "dynamic"}}), "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quantization.method, WeightQuantization::Method::kFp8);
  EXPECT_EQ(config->quantization.fp8_block_rows, 128);  // transformers' default.
  EXPECT_EQ(config->quantization.fp8_block_cols, 128);
  EXPECT_NE(config->torch_dtype.rfind('Q', 0), 0u);  // Not a block type: read as floats.
  config = ParseModelConfig(ConfigWith({{"quant_method", "fp8"},
                                        {"fmt", "e4m3"},
                                        {"activation_scheme", "static"},
                                        {"weight_block_size", {64, 32}}}),
                            "config.json");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quantization.fp8_block_rows, 64);
  EXPECT_EQ(config->quantization.fp8_block_cols, 32);
}

TEST(QuantizedLinearTest, Fp8LayersAreCheckedAtLoad) {
  WeightQuantization q;
  q.method = WeightQuantization::Method::kFp8;
  q.method_name = "fp8";
  q.fp8_block_rows = q.fp8_block_cols = 2;
  std::vector<uint8_t> codes = {0x38, 0xb8, 0x00, 0x01, 0x7e, 0x40};  // 1, -1, 0, 2^-9, 448, 2.
  std::vector<float> scales = {0.5f, 2.0f};                           // [1, 2] for [2, 3].
  auto view = [](const char* name, const char* dtype, std::vector<int64_t> shape, const void* data,
                 size_t bytes) {
    return RawTensorView{name, dtype, std::move(shape), static_cast<const std::byte*>(data), bytes};
  };
  const RawTensorView weight = view("l.weight", "F8_E4M3", {2, 3}, codes.data(), codes.size());
  const RawTensorView scale = view("l.weight_scale_inv", "F32", {1, 2}, scales.data(), 8);
  absl::StatusOr<QuantizedLinear> linear = QuantizedLinear::MakeFp8(q, "l", "f", weight, scale);
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_FALSE(linear->has_blocks());
  std::vector<float> w(6);
  linear->Dequantize(0, 2, 0, 3, w.data());
  // Columns 0-1 scale 0.5, column 2 scale 2.
  EXPECT_THAT(w, ::testing::ElementsAre(0.5f, -0.5f, 0.0f, 0x1p-10f, 224.0f, 4.0f));

  auto error = [&](const RawTensorView& wt, const RawTensorView& sc) {
    absl::StatusOr<QuantizedLinear> made = QuantizedLinear::MakeFp8(q, "l", "f", wt, sc);
    EXPECT_EQ(made.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(made.status().message());
  };
  EXPECT_THAT(error(view("l.weight", "BF16", {2, 3}, codes.data(), 12), scale),
              AllOf(HasSubstr("f: FP8 layer 'l' (quant_method 'fp8')"),
                    HasSubstr("dtype BF16, expected F8_E4M3")));
  EXPECT_THAT(error(weight, view("l.weight_scale_inv", "F32", {2, 2}, scales.data(), 16)),
              HasSubstr("expected [1, 2] (one scale per 2 x 2 block)"));
  EXPECT_THAT(error(weight, view("l.weight_scale_inv", "I32", {1, 2}, scales.data(), 8)),
              HasSubstr("expected F32, BF16 or F16"));
  std::vector<float> infinite = {0.5f, INFINITY};
  EXPECT_THAT(error(weight, view("l.weight_scale_inv", "F32", {1, 2}, infinite.data(), 8)),
              HasSubstr("holds inf at index 1"));
  std::vector<uint8_t> nan = codes;
  nan[4] = 0xff;
  EXPECT_THAT(error(view("l.weight", "F8_E4M3", {2, 3}, nan.data(), 6), scale),
              HasSubstr("'l.weight' holds NaN at row 1, column 1"));
}

TEST(QuantizationConfigTest, RefusesWhatDoesNotMapNamingQuantMethodAndKey) {
  struct Case {
    nlohmann::json quantization;
    std::vector<std::string> message;
  };
  const Case cases[] = {
      {{{"quant_method", "hqq"}, {"nbits", 4}},
       {"'quantization_config.quant_method' is not supported", "quant_method 'hqq'"}},
      {{{"quant_method", "fp8"}, {"fmt", "e5m2"}}, {"'quantization_config.fmt'", "e5m2"}},
      {{{"quant_method", "fp8"}, {"weight_block_size", {128}}},
       {"'quantization_config.weight_block_size' must be two positive sizes"}},
      {{{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}}, {"quant_method 'bitsandbytes'"}},
      {{{"quant_method", "compressed-tensors"}}, {"quant_method 'compressed-tensors'"}},
      {{{"quant_method", "gptq"}, {"bits", 3}, {"group_size", 128}},
       {"'quantization_config.bits' 3 bits are not supported (supported: 4, 8)",
        "quant_method 'gptq'"}},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"group_size", 16}},
       {"'quantization_config.group_size' groups of 16"}},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"checkpoint_format", "marlin"}},
       {"'quantization_config.checkpoint_format' 'marlin' is not supported"}},
      {{{"quant_method", "gptq"}, {"bits", 4}, {"pack_dtype", "int16"}},
       {"'quantization_config.pack_dtype' 'int16'"}},
      {{{"quant_method", "gptq"}, {"bits", 8}, {"sym", false}},
       {"'quantization_config.sym'", "do not map to Q8_0"}},
      {{{"quant_method", "awq"}, {"bits", 8}, {"group_size", 128}},
       {"'quantization_config.bits' 8 bits", "(supported: 4)", "quant_method 'awq'"}},
      {{{"quant_method", "awq"}, {"bits", 4}, {"version", "gemv"}},
       {"'quantization_config.version' 'gemv' is not supported (supported: gemm)"}},
      {{{"quant_method", "awq"}, {"bits", 4}, {"zero_point", false}},
       {"'quantization_config.zero_point'"}},
      {{{"bits", 4}}, {"'quantization_config.quant_method' is required"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.quantization.dump());
    absl::StatusOr<ModelConfig> config =
        ParseModelConfig(ConfigWith(c.quantization), "config.json");
    ASSERT_FALSE(config.ok());
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(config.status().message(), HasSubstr("config.json"));
    for (const std::string& part : c.message) {
      EXPECT_THAT(config.status().message(), HasSubstr(part));
    }
  }
}

// One GPTQ layer [out, in] with its quantized values, zero points ([out, groups]) and fp16
// scales, packed as AutoGPTQ does (zero points minus `offset`).
struct GptqLayer {
  int bits = 4, out = 8, in = 64, group = 32, offset = 1;
  std::vector<uint32_t> q;      // [out, in]
  std::vector<uint32_t> zero;   // [out, groups]
  std::vector<uint16_t> scale;  // [groups, out]

  int groups() const { return (in + group - 1) / group; }
  std::vector<FakeTensor> Tensors(const std::string& layer) const {
    const int pack = 32 / bits;
    const uint32_t mask = (1u << bits) - 1;
    std::vector<uint32_t> qweight(in / pack * out, 0), qzeros(groups() * out / pack, 0);
    for (int o = 0; o < out; ++o) {
      for (int i = 0; i < in; ++i)
        qweight[(i / pack) * out + o] |= q[o * in + i] << (bits * (i % pack));
      for (int g = 0; g < groups(); ++g) {
        qzeros[g * (out / pack) + o / pack] |= ((zero[o * groups() + g] - offset) & mask)
                                               << (bits * (o % pack));
      }
    }
    return {{layer + ".qweight", "I32", {in / pack, out}, RawBytes(qweight)},
            {layer + ".qzeros", "I32", {groups(), out / pack}, RawBytes(qzeros)},
            {layer + ".scales", "F16", {groups(), out}, RawBytes(scale)}};
  }
};

GptqLayer SimpleLayer(int bits, uint32_t zero_value) {
  GptqLayer l;
  l.bits = bits;
  const uint32_t mask = (1u << bits) - 1;
  for (int o = 0; o < l.out; ++o) {
    for (int i = 0; i < l.in; ++i) l.q.push_back((o * 7 + i * 3) & mask);
  }
  l.zero.assign(l.out * l.groups(), zero_value);
  for (int g = 0; g < l.groups(); ++g) {
    for (int o = 0; o < l.out; ++o) l.scale.push_back(FloatToHalf(0.5f + 0.25f * o + g));
  }
  return l;
}

WeightQuantization Gptq(int bits, int group, int offset = 1) {
  WeightQuantization q;
  q.method = WeightQuantization::Method::kGptq;
  q.method_name = "gptq";
  q.bits = bits;
  q.group_size = group;
  q.zero_offset = offset;
  return q;
}

class QuantizedCheckpointTest : public ::testing::Test {
 protected:
  absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::vector<FakeTensor>& tensors,
                                                   const WeightQuantization& quantization) {
    dir_.WriteFile("model.safetensors", SafetensorsBytes(tensors));
    return Checkpoint::Open(dir_.path(), quantization);
  }
  TestTempDir dir_;
};

constexpr char kLayer[] = "model.layers.0.mlp.up_proj";
constexpr char kWeight[] = "model.layers.0.mlp.up_proj.weight";

// w = scale·(q − zero) at every position, by hand; the v1 zero offset applied.
TEST_F(QuantizedCheckpointTest, GptqDequantizesByHand) {
  for (int bits : {4, 8}) {
    SCOPED_TRACE(bits);
    GptqLayer l = SimpleLayer(bits, bits == 4 ? 5 : 128);
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    tensors.push_back(F32Tensor("model.norm.weight", {2}, {1, 2}));
    auto ckpt = Open(tensors, Gptq(bits, 32));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    EXPECT_TRUE((*ckpt)->Contains(kWeight));
    EXPECT_FALSE((*ckpt)->Contains("model.layers.0.mlp.down_proj.weight"));
    EXPECT_EQ(*(*ckpt)->QuantizedTypeOf(kWeight), bits == 4 ? GgmlType::kQ4_1 : GgmlType::kQ8_0);
    EXPECT_FALSE((*ckpt)->QuantizedTypeOf("model.norm.weight").ok());
    std::vector<float> w(l.out * l.in);
    ASSERT_TRUE((*ckpt)->ReadF32(kWeight, {l.out, l.in}, w.data()).ok());
    for (int o = 0; o < l.out; ++o) {
      for (int i = 0; i < l.in; ++i) {
        const int g = i / l.group;
        const float want =
            HalfToFloat(l.scale[g * l.out + o]) * (static_cast<float>(l.q[o * l.in + i]) -
                                                   static_cast<float>(l.zero[o * l.groups() + g]));
        ASSERT_EQ(w[o * l.in + i], want) << o << ", " << i;
      }
    }
    // Slices along either dimension are those values.
    std::vector<float> rows(3 * l.in), cols(l.out * 32);
    ASSERT_TRUE((*ckpt)->ReadF32Slice(kWeight, {l.out, l.in}, 0, 2, 5, rows.data()).ok());
    ASSERT_TRUE((*ckpt)->ReadF32Slice(kWeight, {l.out, l.in}, 1, 16, 48, cols.data()).ok());
    for (int i = 0; i < 3 * l.in; ++i) ASSERT_EQ(rows[i], w[2 * l.in + i]);
    for (int o = 0; o < l.out; ++o) {
      for (int i = 0; i < 32; ++i) ASSERT_EQ(cols[o * 32 + i], w[o * l.in + 16 + i]);
    }
    // The blocks dequantize to the same (8-bit exactly; 4-bit within m's rounding).
    std::vector<std::byte> blocks;
    ASSERT_TRUE((*ckpt)->ReadBlocks(kWeight, {l.out, l.in}, 0, l.out, 0, l.in, &blocks).ok());
    std::vector<float> from_blocks(l.out * l.in);
    ASSERT_TRUE(DequantizeToF32((*ckpt)->QuantizedTypeOf(kWeight).value(), blocks.data(),
                                l.out * l.in, from_blocks.data())
                    .ok());
    for (int k = 0; k < l.out * l.in; ++k) {
      const float scale = HalfToFloat(l.scale[(k % l.in) / l.group * l.out + k / l.in]);
      ASSERT_LE(std::fabs(from_blocks[k] - w[k]), bits == 8 ? 0.0f : 0x1p-11f * scale * 5) << k;
    }
    EXPECT_EQ(blocks.size(), static_cast<size_t>(l.out * 2 * (bits == 4 ? 20 : 34)));
    EXPECT_EQ((*ckpt)->TotalTensorBytes(),
              static_cast<uint64_t>(l.in * l.out * bits / 8 + l.groups() * l.out * bits / 8 +
                                    l.groups() * l.out * 2 + 8));
    // Wrong shapes and ranges.
    EXPECT_EQ((*ckpt)->ReadF32(kWeight, {l.in, l.out}, w.data()).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*ckpt)->ReadBlocks(kWeight, {l.out, l.in}, 0, 1, 16, 48, &blocks).code(),
              absl::StatusCode::kInvalidArgument);
    EXPECT_EQ((*ckpt)->ReadBlocks(kWeight, {l.out, l.in}, 0, l.out + 1, 0, 32, &blocks).code(),
              absl::StatusCode::kOutOfRange);
  }
}

// Symmetric 4-bit (every zero point 8) maps to Q4_0, whose blocks are exact.
TEST_F(QuantizedCheckpointTest, SymmetricFourBitMapsToQ4_0Exactly) {
  GptqLayer l = SimpleLayer(4, 8);
  auto ckpt = Open(l.Tensors(kLayer), Gptq(4, 32));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(*(*ckpt)->QuantizedTypeOf(kWeight), GgmlType::kQ4_0);
  std::vector<float> w(l.out * l.in), from_blocks(l.out * l.in);
  ASSERT_TRUE((*ckpt)->ReadF32(kWeight, {l.out, l.in}, w.data()).ok());
  std::vector<std::byte> blocks;
  ASSERT_TRUE((*ckpt)->ReadBlocks(kWeight, {l.out, l.in}, 0, l.out, 0, l.in, &blocks).ok());
  ASSERT_TRUE(
      DequantizeToF32(GgmlType::kQ4_0, blocks.data(), l.out * l.in, from_blocks.data()).ok());
  EXPECT_EQ(from_blocks, w);
}

// AWQ's interleaving: the word 0x76543210 (nibble k = k) at [input, 0] gives outputs 0..7
// the values 0, 4, 1, 5, 2, 6, 3, 7; zero points packed the same way, as they are.
TEST_F(QuantizedCheckpointTest, AwqInterleavesOutputs) {
  const int in = 32, out = 8;
  std::vector<uint32_t> qweight(in, 0x76543210u);
  std::vector<uint32_t> qzeros = {0x00000010u};  // Nibble 1 = 1: output 2's zero point.
  std::vector<uint16_t> scales(out, FloatToHalf(2.0f));
  WeightQuantization awq;
  awq.method = WeightQuantization::Method::kAwq;
  awq.method_name = "awq";
  awq.bits = 4;
  awq.group_size = 32;
  auto ckpt = Open({{std::string(kLayer) + ".qweight", "I32", {in, out / 8}, RawBytes(qweight)},
                    {std::string(kLayer) + ".qzeros", "I32", {1, out / 8}, RawBytes(qzeros)},
                    {std::string(kLayer) + ".scales", "F16", {1, out}, RawBytes(scales)}},
                   awq);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ(*(*ckpt)->QuantizedTypeOf(kWeight), GgmlType::kQ4_1);
  std::vector<float> w(out * in);
  ASSERT_TRUE((*ckpt)->ReadF32(kWeight, {out, in}, w.data()).ok());
  const int want_q[out] = {0, 4, 1, 5, 2, 6, 3, 7};
  for (int o = 0; o < out; ++o) {
    const float want = 2.0f * static_cast<float>(want_q[o] - (o == 2 ? 1 : 0));
    for (int i = 0; i < in; ++i) ASSERT_EQ(w[o * in + i], want) << o << ", " << i;
  }
}

TEST_F(QuantizedCheckpointTest, RefusesLayoutsThatDoNotMapNamingLayerAndQuantMethod) {
  {  // desc_act's permuted groups.
    GptqLayer l = SimpleLayer(4, 5);
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    std::vector<int32_t> g_idx(l.in);
    for (int i = 0; i < l.in; ++i) g_idx[i] = i / 32;
    std::swap(g_idx[0], g_idx[40]);
    tensors.push_back({std::string(kLayer) + ".g_idx", "I32", {l.in}, RawBytes(g_idx)});
    auto ckpt = Open(tensors, Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(ckpt.status().message(),
                AllOf(HasSubstr(dir_.path()), HasSubstr(kLayer), HasSubstr("quant_method 'gptq'"),
                      HasSubstr("g_idx[0] is 1, not 0"), HasSubstr("desc_act")));
  }
  {  // The identity g_idx is fine.
    GptqLayer l = SimpleLayer(4, 5);
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    std::vector<int32_t> g_idx(l.in);
    for (int i = 0; i < l.in; ++i) g_idx[i] = i / 32;
    tensors.push_back({std::string(kLayer) + ".g_idx", "I32", {l.in}, RawBytes(g_idx)});
    EXPECT_TRUE(Open(tensors, Gptq(4, 32)).ok());
  }
  {  // A v1 zero point of 0 (stored as 15).
    GptqLayer l = SimpleLayer(4, 5);
    l.zero[3] = 0;
    auto ckpt = Open(l.Tensors(kLayer), Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(ckpt.status().message(), AllOf(HasSubstr(kLayer), HasSubstr("stored as 15")));
    // In gptq_v2 it is just a zero point of 0.
    l.offset = 0;
    WeightQuantization v2 = Gptq(4, 32, 0);
    EXPECT_TRUE(Open(l.Tensors(kLayer), v2).ok());
  }
  {  // 8-bit with a zero point other than 128.
    GptqLayer l = SimpleLayer(8, 128);
    l.zero[5] = 100;
    auto ckpt = Open(l.Tensors(kLayer), Gptq(8, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(ckpt.status().message(),
                AllOf(HasSubstr(kLayer), HasSubstr("8-bit zero points other than 128")));
  }
  {  // A scale that is not finite.
    GptqLayer l = SimpleLayer(4, 5);
    l.scale[2] = 0x7c00;  // +Inf.
    auto ckpt = Open(l.Tensors(kLayer), Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(ckpt.status().message(), HasSubstr("the scale of group 0, output 2 is inf"));
  }
}

TEST_F(QuantizedCheckpointTest, MalformedTensorsAreNamed) {
  GptqLayer l = SimpleLayer(4, 5);
  {  // A qweight without a quantization_config.
    auto ckpt = Open(l.Tensors(kLayer), WeightQuantization{});
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), AllOf(HasSubstr(std::string(kLayer) + ".qweight"),
                                               HasSubstr("quantization_config")));
  }
  {  // No scales.
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    tensors.pop_back();
    auto ckpt = Open(tensors, Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(ckpt.status().message(), HasSubstr(std::string(kLayer) + ".scales"));
  }
  {  // Scales in float32.
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    tensors.back() = F32Tensor(std::string(kLayer) + ".scales", {2, 8}, std::vector<float>(16, 1));
    auto ckpt = Open(tensors, Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), HasSubstr("has dtype F32, expected F16"));
  }
  {  // Groups of 64 need one row of scales, not two.
    auto ckpt = Open(l.Tensors(kLayer), Gptq(4, 64));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), HasSubstr("has shape [2, 8], expected [1, 8]"));
  }
  {  // Both a weight and a qweight.
    std::vector<FakeTensor> tensors = l.Tensors(kLayer);
    tensors.push_back(F32Tensor(kWeight, {1}, {1}));
    auto ckpt = Open(tensors, Gptq(4, 32));
    EXPECT_EQ(ckpt.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(ckpt.status().message(), HasSubstr("both a weight and a qweight"));
  }
}

// FloatToHalf rounds to nearest, ties to even, like numpy's float16 cast: every half
// round-trips, midpoints go to the even neighbour and anything past them to the nearer.
TEST(FloatToHalfTest, RoundsToNearestEven) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto half = static_cast<uint16_t>(h);
    const float value = HalfToFloat(half);
    if (std::isnan(value)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(value)))) << h;
      continue;
    }
    ASSERT_EQ(FloatToHalf(value), half) << h;
    if ((h & 0x7fff) >= 0x7bff) continue;  // No finite half above.
    const float next = HalfToFloat(static_cast<uint16_t>(h + 1));
    const float mid = (value + next) / 2;  // Exact: halves have 11 significant bits.
    ASSERT_EQ(FloatToHalf(mid), (h & 1) == 0 ? half : h + 1) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 0.0f * value)), half) << h;
    ASSERT_EQ(FloatToHalf(std::nextafter(mid, 2 * next)), h + 1) << h;
  }
  EXPECT_EQ(FloatToHalf(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(-1e10f), 0xfc00);
  EXPECT_EQ(FloatToHalf(1e-10f), 0);
}

}  // namespace
}  // namespace conveyor
