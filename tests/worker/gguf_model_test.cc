// LlamaModel::Load of a GGUF file against the same weights from safetensors: test
// checkpoints written as GGUF by tests/gguf_ref/hf_to_gguf.py (the `gguf` package, with
// convert_hf_to_gguf's names, metadata and Llama Q/K row permutation), F32 and Q8_0.
// F32 must give the safetensors model's logits bit for bit; Q8_0 within a stated
// tolerance, its greedy tokens measured against the float model's. Also the errors: a
// tensor of an unsupported type, a shape the model does not expect.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/gguf_weights.h"
#include "checkpoint/safetensors.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_device.h"
#include "nlohmann/json.hpp"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;
constexpr int kGreedyTokens = 32;
// Q8_0 logits against the float model's, relative (‖a − b‖ / ‖b‖), worst position.
constexpr double kQ8MaxRelativeError = 0.05;
// A Q4_1 file's logits, kept or stored as int8, against the same file at f32, the same way.
constexpr double kQ4_1MaxRelativeError = 0.04;

std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

// Writes test checkpoint `variant` as GGUF of `type` into `dir`; the file's path, or ""
// after a failure saying why.
std::string WriteGguf(const TestTempDir& dir, const std::string& variant, const std::string& type) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python with the gguf package at " << python
                  << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
    return "";
  }
  std::string out = absl::StrCat(dir.path(), "/", variant, ".", type, ".gguf");
  const std::string command =
      absl::StrCat("'", python, "' '", SourceRoot(), "/tests/gguf_ref/hf_to_gguf.py' --model '",
                   TestModelDir(variant), "' --out '", out, "' --type ", type);
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << command << " failed";
    return "";
  }
  return out;
}

class GgufModelTest : public ::testing::TestWithParam<std::string> {};

// Llama with MHA, tied embeddings, linear RoPE scaling, bf16 shards; Mixtral (GQA: K
// permuted with 2 heads; merged experts); Qwen2 (q/k/v biases, not permuted).
INSTANTIATE_TEST_SUITE_P(Variants, GgufModelTest,
                         ::testing::Values("tied_mha_bf16_sharded", "mixtral_moe_tied",
                                           "qwen2_bias_f16"));

TEST_P(GgufModelTest, F32GivesTheSafetensorsLogitsAndQ8_0ComesClose) {
  const std::string variant = GetParam();
  TestTempDir dir;
  const std::string f32 = WriteGguf(dir, variant, "f32");
  const std::string q8 = WriteGguf(dir, variant, "q8_0");
  ASSERT_FALSE(f32.empty() || q8.empty());
  auto hf = LocalWorker::Create(TestModelDir(variant), 2, kNumBlocks, kBlockSize);
  auto gguf_f32 = LocalWorker::Create(f32, 2, kNumBlocks, kBlockSize);
  auto gguf_q8 = LocalWorker::Create(q8, 2, kNumBlocks, kBlockSize);
  ASSERT_TRUE(hf && gguf_f32 && gguf_q8);
  EXPECT_EQ(gguf_f32->model->config().vocab_size, hf->model->config().vocab_size);
  EXPECT_EQ(gguf_f32->model->config().tie_word_embeddings, hf->model->config().tie_word_embeddings);
  // What the worker reads before loading (model/rank.cc).
  absl::StatusOr<ModelConfig> config = model::LoadCheckpointConfig(f32);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->num_layers, hf->model->config().num_layers);
  EXPECT_EQ(config->num_kv_heads, hf->model->config().num_kv_heads);
  EXPECT_EQ(config->rope_scaling.type, hf->model->config().rope_scaling.type);

  const Reference ref = LoadReference(variant);
  ASSERT_FALSE(ref.prompts.empty());
  double q8_max_error = 0.0;
  int greedy_same = 0, greedy_total = 0, argmax_same = 0, argmax_total = 0;
  const int vocab = hf->model->config().vocab_size;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    const std::vector<float> want = PrefillLogits(*hf, prompt);
    const std::vector<float> got = PrefillLogits(*gguf_f32, prompt);
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_EQ(got[i], want[i]) << variant << " F32 logit " << i;
    }
    const std::vector<float> q8_logits = PrefillLogits(*gguf_q8, prompt);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const float* a = q8_logits.data() + t * vocab;
      const float* b = want.data() + t * vocab;
      q8_max_error = std::max(q8_max_error, RelativeError(a, b, vocab));
      argmax_same += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
      ++argmax_total;
    }
    const std::vector<int32_t> greedy = GreedyByPrefill(*hf, prompt, kGreedyTokens);
    EXPECT_EQ(GreedyByPrefill(*gguf_f32, prompt, kGreedyTokens), greedy) << variant;
    const std::vector<int32_t> q8_greedy = GreedyByPrefill(*gguf_q8, prompt, kGreedyTokens);
    // Tokens agreeing before the first difference (after it the contexts differ).
    const auto first_diff = std::mismatch(greedy.begin(), greedy.end(), q8_greedy.begin());
    greedy_same += static_cast<int>(first_diff.first - greedy.begin());
    greedy_total += kGreedyTokens;
  }
  std::printf(
      "%s Q8_0: max relative logit error %.3g; argmax agrees at %d/%d positions; "
      "greedy prefix agrees for %d/%d tokens\n",
      variant.c_str(), q8_max_error, argmax_same, argmax_total, greedy_same, greedy_total);
  // Q8_0 keeps ~8 bits per weight: a few per cent of relative logit error on these
  // random tiny models.
  EXPECT_LT(q8_max_error, kQ8MaxRelativeError) << variant;
  // The next token at a prompt position rarely changes; greedy continuations of these
  // random models (small logit margins) part after some tokens and are only reported.
  EXPECT_GE(argmax_same, argmax_total * 9 / 10) << variant;
}

// Every tensor of the checkpoint, whole and sliced along each dimension (as tensor
// parallelism reads it), equals the safetensors tensor: names, merged experts, the Q/K
// permutation undone, F32 dequantization.
TEST_P(GgufModelTest, EveryTensorAndSliceEqualsTheSafetensorsOne) {
  const std::string variant = GetParam();
  TestTempDir dir;
  const std::string path = WriteGguf(dir, variant, "f32");
  ASSERT_FALSE(path.empty());
  auto gguf = GgufWeights::Open(path);
  ASSERT_TRUE(gguf.ok()) << gguf.status();
  auto ckpt = Checkpoint::Open(TestModelDir(variant));
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  const nlohmann::json index = [&] {
    std::ifstream in(TestModelDir(variant) + "/model.safetensors.index.json");
    return in.good() ? nlohmann::json::parse(in) : nlohmann::json();
  }();
  std::vector<std::string> names;
  if (!index.is_null()) {
    for (const auto& [name, file] : index["weight_map"].items()) names.push_back(name);
  } else {
    auto file = SafetensorsFile::Open(TestModelDir(variant) + "/model.safetensors");
    ASSERT_TRUE(file.ok()) << file.status();
    names = (*file)->TensorNames();
  }
  ASSERT_FALSE(names.empty());
  for (const std::string& name : names) {
    ASSERT_TRUE((*gguf)->Contains(name)) << name;
    absl::StatusOr<TensorView> view = (*ckpt)->Find(name);
    ASSERT_TRUE(view.ok()) << view.status();
    const std::vector<int64_t> shape = view->shape;
    int64_t size = 1;
    for (int64_t d : shape) size *= d;
    std::vector<float> want(size), got(size);
    ASSERT_TRUE((*ckpt)->ReadF32(name, shape, want.data()).ok());
    ASSERT_TRUE((*gguf)->ReadF32(name, shape, got.data()).ok()) << name;
    ASSERT_EQ(got, want) << name;
    for (int dim = 0; dim < static_cast<int>(shape.size()); ++dim) {
      const int64_t begin = 1, end = shape[dim] - 1;
      const int64_t slice = size / shape[dim] * (end - begin);
      std::vector<float> want_slice(slice), got_slice(slice);
      ASSERT_TRUE((*ckpt)->ReadF32Slice(name, shape, dim, begin, end, want_slice.data()).ok());
      ASSERT_TRUE((*gguf)->ReadF32Slice(name, shape, dim, begin, end, got_slice.data()).ok())
          << name;
      ASSERT_EQ(got_slice, want_slice) << name << " dim " << dim;
    }
  }
}

// Llama 3's rope_scaling as llama.cpp's converter writes it: no scaling type, a
// `rope_freqs.weight` tensor of per-frequency divisors (hf_to_gguf.py computes them from
// transformers' definition). The test model's small original context puts its
// frequencies in all three bands (kept, blended, divided by 8), so a loader that ignored
// the tensor would be far off; float32 factors against the float64 formula leave only
// rounding (measured 1e-6 relative).
TEST(GgufLlama3Test, RopeFrequencyFactorsGiveTheSafetensorsLogits) {
  const std::string variant = "llama3_gqa";
  TestTempDir dir;
  const std::string path = WriteGguf(dir, variant, "f32");
  ASSERT_FALSE(path.empty());
  absl::StatusOr<ModelConfig> config = model::LoadCheckpointConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  ASSERT_EQ(config->rope_scaling.frequency_factors.size(), config->head_dim / 2);
  auto hf = LocalWorker::Create(TestModelDir(variant), 2, kNumBlocks, kBlockSize);
  auto gguf = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize);
  ASSERT_TRUE(hf && gguf);
  const Reference ref = LoadReference(variant);
  ASSERT_FALSE(ref.prompts.empty());
  const int vocab = hf->model->config().vocab_size;
  double max_error = 0;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    const std::vector<float> want = PrefillLogits(*hf, prompt);
    const std::vector<float> got = PrefillLogits(*gguf, prompt);
    for (size_t t = 0; t < prompt.size(); ++t) {
      max_error = std::max(max_error,
                           RelativeError(got.data() + t * vocab, want.data() + t * vocab, vocab));
    }
  }
  std::printf("llama3 rope_freqs: max relative logit error %.3g\n", max_error);
  EXPECT_LT(max_error, 1e-4);
}

// A Q4_1 file (the block GPTQ/AWQ checkpoints with zero points map to) serves as the other
// block types do: its blocks computed on (kept), or dequantized to int8 or f32. Measured
// against f32 of the same file (whose dequantization gguf_test checks bit for bit): kept
// 1.6% and int8 1.7% relative logit error (worst position); f32 against the float model
// 28% (4-bit embeddings, tied: every logit is a dot product with a 4-bit row), only a
// sanity bound here.
TEST(GgufQ4_1Test, ServesKeptOrDequantized) {
  const std::string variant = "tied_mha_bf16_sharded";
  TestTempDir dir;
  const std::string path = WriteGguf(dir, variant, "q4_1");
  ASSERT_FALSE(path.empty());
  absl::StatusOr<ModelConfig> config = model::LoadCheckpointConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->torch_dtype, "Q4_1");
  EXPECT_TRUE(model::KeepsQuantizedWeights(model::CpuWeightChoice::kGguf, config->torch_dtype));
  auto hf = LocalWorker::Create(TestModelDir(variant), 2, kNumBlocks, kBlockSize);
  auto f32 = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize);
  auto kept = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32,
                                  kernels::CpuKvDtype::kF32, /*keep_quantized=*/true);
  auto int8 = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kInt8);
  ASSERT_TRUE(hf && f32 && kept && int8);
  EXPECT_LT(kept->model->weight_bytes(), f32->model->weight_bytes());
  const Reference ref = LoadReference(variant);
  ASSERT_FALSE(ref.prompts.empty());
  const int vocab = hf->model->config().vocab_size;
  double float_model_error = 0, int8_error = 0, kept_error = 0;
  for (const std::vector<int32_t>& prompt : ref.prompts) {
    const std::vector<float> want = PrefillLogits(*hf, prompt);
    const std::vector<float> got = PrefillLogits(*f32, prompt);
    const std::vector<float> got_kept = PrefillLogits(*kept, prompt);
    const std::vector<float> got_int8 = PrefillLogits(*int8, prompt);
    for (size_t t = 0; t < prompt.size(); ++t) {
      const size_t at = t * vocab;
      float_model_error =
          std::max(float_model_error, RelativeError(got.data() + at, want.data() + at, vocab));
      int8_error =
          std::max(int8_error, RelativeError(got_int8.data() + at, got.data() + at, vocab));
      kept_error =
          std::max(kept_error, RelativeError(got_kept.data() + at, got.data() + at, vocab));
    }
  }
  std::printf(
      "%s Q4_1: max relative logit error %.3g kept, %.3g as int8, against f32; %.3g at f32 "
      "against the float model\n",
      variant.c_str(), kept_error, int8_error, float_model_error);
  EXPECT_LT(kept_error, kQ4_1MaxRelativeError);
  EXPECT_GT(kept_error, 0.0) << "the blocks were not computed on";
  EXPECT_LT(int8_error, kQ4_1MaxRelativeError);
  EXPECT_LT(float_model_error, 0.5);
}

TEST(GgufModelErrorsTest, RefusesAnUnsupportedTypeAtLoadNamingTensorAndType) {
  TestTempDir dir;
  const std::string path = WriteGguf(dir, "tied_mha_bf16_sharded", "q5_0");
  ASSERT_FALSE(path.empty());
  auto weights = GgufWeights::Open(path);
  ASSERT_FALSE(weights.ok());
  EXPECT_EQ(weights.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(weights.status().message(), HasSubstr(path));
  EXPECT_THAT(weights.status().message(), HasSubstr("token_embd.weight"));
  EXPECT_THAT(weights.status().message(), HasSubstr("Q5_0"));
}

TEST(GgufModelErrorsTest, ShapesAreCheckedNamingTensorAndFile) {
  TestTempDir dir;
  const std::string path = WriteGguf(dir, "tied_mha_bf16_sharded", "f32");
  ASSERT_FALSE(path.empty());
  auto weights = GgufWeights::Open(path);
  ASSERT_TRUE(weights.ok()) << weights.status();
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  ASSERT_TRUE((*weights)->Contains(q));
  EXPECT_FALSE((*weights)->Contains("lm_head.weight"));  // Tied.
  std::vector<float> out(64 * 64);
  const absl::Status wrong = (*weights)->ReadF32(q, {32, 64}, out.data());
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.message(), HasSubstr(q));
  EXPECT_THAT(wrong.message(), HasSubstr("blk.0.attn_q.weight"));
  EXPECT_THAT(wrong.message(), HasSubstr(path));
  EXPECT_THAT(wrong.message(), HasSubstr("[64, 64]"));
  const absl::Status missing = (*weights)->ReadF32("model.nothing", {1}, out.data());
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.message(), HasSubstr(path));
}

}  // namespace
}  // namespace conveyor::testing
