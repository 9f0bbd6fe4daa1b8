// GPTQ and AWQ checkpoints (checkpoint/quantized_linear.h) against an independent numpy
// reference: tests/quant_ref/make_gptq_awq.py packs the llama3_gqa test checkpoint's layers
// into each format and writes, from the format descriptions alone, the dequantized weights
// as a plain safetensors checkpoint and the ggml blocks each layer must map to.
//  - Every weight, whole and sliced, reads (dequantized) bit for bit as the reference.
//  - The blocks handed out are the expected bytes, and dequantize to the reference: exactly
//    for Q4_0 (symmetric 4-bit) and Q8_0 (symmetric 8-bit); for Q4_1 off by m's fp16
//    rounding only, the same for a block's 32 weights, at most 2^-11·|m|.
//  - The served model equals the model built from the reference weights: logits bit for bit
//    and the same greedy tokens at f32 (ReadF32Slice) and at int8, which
//    --cpu_weight_dtype=auto picks for these checkpoints (the same floats quantized the same
//    way); with the blocks kept (as --cpu_weight_dtype=gguf does) Q4_0, Q4_1 and Q8_0
//    computed on within a stated tolerance.
//  - A layer whose g_idx is a real act-order permutation is refused at load, named.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_device.h"
#include "nlohmann/json.hpp"
#include "tests/support/quant_ref.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;
constexpr int kGreedyTokens = 24;
constexpr const char* kVariant = kQuantRefVariant;

struct Case {
  const char* name;
  const char* args;        // make_gptq_awq.py's.
  const char* block_type;  // What every layer maps to.
  // Logits with the blocks kept against the reference model, relative, worst position.
  double kept_max_relative_error;
};

// The checkpoint written for `c` in `dir`: dir/q (GPTQ/AWQ), dir/ref (numpy-dequantized,
// plain), dir/exp (expected blocks); false after a failure saying why.
bool Write(const TestTempDir& dir, const Case& c, const std::string& extra = "") {
  return RunQuantRefScript(dir, "make_gptq_awq.py",
                           absl::StrCat("--expected '", dir.path(), "/exp' ", c.args, " ", extra));
}

class GptqAwqTest : public ::testing::TestWithParam<Case> {};

// Symmetric GPTQ in groups of 32 (Q4_0); asymmetric act-order GPTQ (identity g_idx) in
// groups of 64, so down_proj's 160 inputs end in half a group (Q4_1); asymmetric
// gptq_v2 with one group per row (Q4_1); 8-bit GPTQ (Q8_0); AWQ in groups of 32 (Q4_1).
// Measured kept-block errors: Q4_0 1.6%, Q8_0 1.3% (int8 activations, as for GGUF), on
// every CONVEYOR_CPU_ISA level.
INSTANTIATE_TEST_SUITE_P(
    Formats, GptqAwqTest,
    ::testing::Values(Case{"gptq4_sym_g32", "--method gptq --group-size 32", "Q4_0", 0.04},
                      Case{"gptq4_asym_g64_act_order",
                           "--method gptq --asym --group-size 64 --desc-act", "Q4_1", 0.04},
                      Case{"gptq4_asym_v2_row",
                           "--method gptq --asym --group-size -1 --checkpoint-format gptq_v2",
                           "Q4_1", 0.04},
                      Case{"gptq8_sym_g32", "--method gptq --bits 8 --group-size 32", "Q8_0", 0.03},
                      Case{"awq4_g32", "--method awq --group-size 32", "Q4_1", 0.04}),
    [](const auto& info) { return std::string(info.param.name); });

TEST_P(GptqAwqTest, EveryWeightAndItsBlocksMatchTheNumpyReference) {
  const Case c = GetParam();
  TestTempDir dir;
  ASSERT_TRUE(Write(dir, c));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir.path() + "/q");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->torch_dtype, c.block_type);
  auto ckpt = Checkpoint::Open(dir.path() + "/q", config->quantization);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto ref = Checkpoint::Open(dir.path() + "/ref");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ref_file = SafetensorsFile::Open(dir.path() + "/ref/model.safetensors");
  ASSERT_TRUE(ref_file.ok()) << ref_file.status();
  const nlohmann::json expected =
      nlohmann::json::parse(ReadBytes(dir.path() + "/exp/expected.json"));

  int quantized = 0;
  double worst_m_steps = 0;
  for (const std::string& name : (*ref_file)->TensorNames()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE((*ckpt)->Contains(name));
    const std::vector<int64_t> shape = (*ref_file)->Find(name)->shape;
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    std::vector<float> want(size), got(size);
    ASSERT_TRUE((*ref)->ReadF32(name, shape, want.data()).ok());
    ASSERT_TRUE((*ckpt)->ReadF32(name, shape, got.data()).ok());
    ASSERT_EQ(std::memcmp(got.data(), want.data(), size * sizeof(float)), 0);
    const bool is_quantized = expected["tensors"].contains(name);
    EXPECT_EQ((*ckpt)->QuantizedTypeOf(name).ok(), is_quantized);
    if (!is_quantized) continue;
    ++quantized;
    const int64_t rows = shape[0], cols = shape[1];
    // Slices, as tensor parallelism reads them: rows, and columns on block boundaries.
    for (int dim : {0, 1}) {
      const int64_t begin = dim == 0 ? rows / 4 : 32, end = dim == 0 ? rows / 2 + 1 : cols - 32;
      const int64_t n = (end - begin) * (dim == 0 ? cols : rows);
      std::vector<float> slice(n), want_slice(n);
      ASSERT_TRUE((*ckpt)->ReadF32Slice(name, shape, dim, begin, end, slice.data()).ok());
      ASSERT_TRUE((*ref)->ReadF32Slice(name, shape, dim, begin, end, want_slice.data()).ok());
      ASSERT_EQ(std::memcmp(slice.data(), want_slice.data(), n * sizeof(float)), 0) << dim;
    }

    const std::string type = expected["tensors"][name]["type"];
    ASSERT_EQ(type, c.block_type);
    const GgmlType ggml = *(*ckpt)->QuantizedTypeOf(name);
    ASSERT_EQ(TraitsOf(ggml).name, type);
    std::vector<std::byte> blocks;
    ASSERT_TRUE((*ckpt)->ReadBlocks(name, shape, 0, rows, 0, cols, &blocks).ok());
    const std::string want_blocks = ReadBytes(dir.path() + "/exp/" + name + ".blocks");
    ASSERT_EQ(blocks.size(), want_blocks.size());
    ASSERT_EQ(std::memcmp(blocks.data(), want_blocks.data(), blocks.size()), 0);
    // A part of the rows and columns is that part of the whole.
    const int64_t block_bytes = TraitsOf(ggml).block_bytes, row_bytes = cols / 32 * block_bytes;
    std::vector<std::byte> part;
    ASSERT_TRUE((*ckpt)->ReadBlocks(name, shape, 1, rows - 1, 32, cols, &part).ok());
    for (int64_t r = 1; r < rows - 1; ++r) {
      ASSERT_EQ(std::memcmp(part.data() + (r - 1) * (row_bytes - block_bytes),
                            blocks.data() + r * row_bytes + block_bytes, row_bytes - block_bytes),
                0)
          << r;
    }

    std::vector<float> from_blocks(size);
    ASSERT_TRUE(DequantizeToF32(ggml, blocks.data(), size, from_blocks.data()).ok());
    if (ggml != GgmlType::kQ4_1) {
      ASSERT_EQ(std::memcmp(from_blocks.data(), want.data(), size * sizeof(float)), 0);
      continue;
    }
    for (int64_t b = 0; b < size / 32; ++b) {
      uint16_t d_bits, m_bits;
      std::memcpy(&d_bits, blocks.data() + b * 20, 2);
      std::memcpy(&m_bits, blocks.data() + b * 20 + 2, 2);
      const double d = HalfToFloat(d_bits), m = HalfToFloat(m_bits);
      const double delta = static_cast<double>(from_blocks[b * 32]) - want[b * 32];
      ASSERT_LE(std::fabs(delta), 0x1p-11 * std::fabs(m) * (1 + 0x1p-10)) << "block " << b;
      for (int j = 1; j < 32; ++j) {
        ASSERT_EQ(static_cast<double>(from_blocks[b * 32 + j]) - want[b * 32 + j], delta)
            << "block " << b << " weight " << j;
      }
      worst_m_steps = std::max(worst_m_steps, std::fabs(delta) / d);
    }
  }
  EXPECT_EQ(quantized, 2 * 7);  // q, k, v, o, gate, up, down of 2 layers.
  if (std::string(c.block_type) == "Q4_1") {
    std::printf(
        "%s: Q4_1 blocks off the exact weights by at most %.3g%% of a step (m's "
        "rounding; the bound is 15 * 2^-11 = 0.73%%)\n",
        c.name, 100 * worst_m_steps);
  }
  // What the files take: counted, int32 tensors of the layers included.
  EXPECT_GT((*ckpt)->TotalTensorBytes(), 0u);
}

TEST_P(GptqAwqTest, ServesWhatTheDequantizedModelServes) {
  const Case c = GetParam();
  TestTempDir dir;
  ASSERT_TRUE(Write(dir, c));
  const std::string q = dir.path() + "/q", ref = dir.path() + "/ref";
  absl::StatusOr<ModelConfig> config = model::LoadCheckpointConfig(q);
  ASSERT_TRUE(config.ok()) << config.status();
  // --cpu_weight_dtype=auto stores these layers as int8; gguf keeps the blocks.
  EXPECT_EQ(model::ResolveCpuWeightDtype(model::CpuWeightChoice::kAuto, config->torch_dtype),
            kernels::CpuWeightDtype::kInt8);
  EXPECT_TRUE(model::KeepsQuantizedWeights(model::CpuWeightChoice::kGguf, config->torch_dtype));

  const Reference reference = LoadReference(kVariant);
  ASSERT_FALSE(reference.prompts.empty());
  for (const kernels::CpuWeightDtype dtype :
       {kernels::CpuWeightDtype::kF32, kernels::CpuWeightDtype::kInt8}) {
    SCOPED_TRACE(kernels::CpuWeightDtypeName(dtype));
    auto served = LocalWorker::Create(q, 2, kNumBlocks, kBlockSize, dtype);
    auto want = LocalWorker::Create(ref, 2, kNumBlocks, kBlockSize, dtype);
    ASSERT_TRUE(served && want);
    for (const std::vector<int32_t>& prompt : reference.prompts) {
      const std::vector<float> a = PrefillLogits(*served, prompt);
      const std::vector<float> b = PrefillLogits(*want, prompt);
      ASSERT_EQ(a.size(), b.size());
      ASSERT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
      EXPECT_EQ(GreedyByPrefill(*served, prompt, kGreedyTokens),
                GreedyByPrefill(*want, prompt, kGreedyTokens));
    }
  }

  // The blocks kept (the other tensors f32) and computed on, against the reference at f32.
  auto kept = LocalWorker::Create(q, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32,
                                  kernels::CpuKvDtype::kF32, /*keep_quantized=*/true);
  auto want = LocalWorker::Create(ref, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32);
  ASSERT_TRUE(kept && want);
  const int vocab = config->vocab_size;
  double max_error = 0;
  int argmax_same = 0, argmax_total = 0;
  for (const std::vector<int32_t>& prompt : reference.prompts) {
    const std::vector<float> a = PrefillLogits(*kept, prompt);
    const std::vector<float> b = PrefillLogits(*want, prompt);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const float* x = a.data() + t * vocab;
      const float* y = b.data() + t * vocab;
      max_error = std::max(max_error, RelativeError(x, y, vocab));
      argmax_same += std::max_element(x, x + vocab) - x == std::max_element(y, y + vocab) - y;
      ++argmax_total;
    }
  }
  std::printf(
      "%s blocks kept (%s): %zu bytes of weights against %zu; max relative logit "
      "error %.3g; argmax agrees at %d/%d positions\n",
      c.name, kept->backend->name().c_str(), kept->model->weight_bytes(),
      want->model->weight_bytes(), max_error, argmax_same, argmax_total);
  EXPECT_LT(max_error, c.kept_max_relative_error);
  EXPECT_GT(max_error, 0.0) << "the blocks were not computed on";
  EXPECT_GE(argmax_same, argmax_total * 8 / 10);
  EXPECT_LT(kept->model->weight_bytes(), want->model->weight_bytes());
}

TEST(GptqAwqErrorsTest, RefusesAPermutedGIdxAtLoadNamingLayerAndQuantMethod) {
  TestTempDir dir;
  const Case c{"permuted", "--method gptq --asym --group-size 32", "Q4_1", 0};
  ASSERT_TRUE(Write(dir, c, "--permute-g-idx"));
  auto backend =
      kernels::MakeCpuBackend(1, kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32, false);
  auto model = model::LlamaModel::Load(dir.path() + "/q", backend.get());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(model.status().message(), HasSubstr("model.layers.0.mlp.down_proj"));
  EXPECT_THAT(model.status().message(), HasSubstr("quant_method 'gptq'"));
  EXPECT_THAT(model.status().message(), HasSubstr("g_idx"));
  EXPECT_THAT(model.status().message(), HasSubstr("does not map to ggml blocks"));
}

TEST(GptqAwqErrorsTest, RefusesAnUnsupportedQuantMethodAtLoad) {
  TestTempDir dir;
  std::filesystem::copy(TestModelDir(kVariant), dir.path() + "/m");
  nlohmann::json config = nlohmann::json::parse(ReadBytes(dir.path() + "/m/config.json"));
  config["quantization_config"] = {{"quant_method", "bitsandbytes"}, {"load_in_4bit", true}};
  dir.WriteFile("m/config.json", config.dump());
  auto backend =
      kernels::MakeCpuBackend(1, kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32, false);
  auto model = model::LlamaModel::Load(dir.path() + "/m", backend.get());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(model.status().message(), HasSubstr("config.json"));
  EXPECT_THAT(model.status().message(), HasSubstr("quant_method 'bitsandbytes'"));
}

}  // namespace
}  // namespace conveyor::testing
