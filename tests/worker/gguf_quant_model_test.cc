// A model loaded from a GGUF file of block-quantized weights, computed on its blocks
// (kernels/cpu/quant_gemm.h), against the same file dequantized to float32 weights: the
// logits within a stated tolerance, the greedy tokens measured, the weights really kept
// in their blocks, and the quantized model's bits independent of the batch. Files from
// tests/gguf_ref/make_quant_gguf.py: a random 2-layer Llama (hidden 256, GQA) in Q8_0,
// and in Q4_K_M's mix of Q4_K and Q6_K (its own K quantizer, checked by gguf's
// dequantization as the file is written).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/test_temp_dir.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant_gemm.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;
constexpr int kPromptTokens = 40;
constexpr int kGreedyTokens = 24;

std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().parent_path().string();
}

std::string WriteQuantGguf(const TestTempDir& dir, const std::string& type) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python with the gguf package at " << python
                  << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
    return "";
  }
  std::string out = absl::StrCat(dir.path(), "/model.", type, ".gguf");
  const std::string command =
      absl::StrCat("'", python, "' '", SourceRoot(), "/tests/gguf_ref/make_quant_gguf.py' --out '",
                   out, "' --type ", type);
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << command << " failed";
    return "";
  }
  return out;
}

std::vector<int32_t> RandomPrompt(int vocab, int seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> prompt(kPromptTokens);
  for (int32_t& t : prompt) t = static_cast<int32_t>(rng() % vocab);
  return prompt;
}

struct Case {
  const char* type;
  // Relative logit error against the dequantized model, worst position: measured 1.4%
  // for Q8_0 and 2.2% for Q4_K_M (on every level), both from the int8 activations (32
  // and 256 values per scale). Argmax agreed at 118 and 116 of 120 positions, greedy
  // prefixes for 72 and 50 of 72 tokens.
  double max_relative_error;
  // The hash (BitsHash) of a prefill's logits on the blocks, on the vector levels and on
  // the portable one (recorded_bits_test.cc says why they differ).
  uint64_t vector_levels, portable;
};

class GgufQuantModelTest : public ::testing::TestWithParam<Case> {};

INSTANTIATE_TEST_SUITE_P(
    Types, GgufQuantModelTest,
    ::testing::Values(Case{"q8_0", 0.03, 0x96ee9ebef057bec8, 0x0f0c1ef9f51cef4a},
                      Case{"q4_k_m", 0.05, 0x0c043cacf51c6187, 0xf920a9ec9b9ba56a}),
    [](const auto& info) { return std::string(info.param.type); });

TEST_P(GgufQuantModelTest, ComesCloseToTheDequantizedModelAndKeepsItsBlocks) {
  const Case c = GetParam();
  TestTempDir dir;
  const std::string path = WriteQuantGguf(dir, c.type);
  ASSERT_FALSE(path.empty());
  auto quantized = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize,
                                       kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32,
                                       /*keep_quantized=*/true);
  auto dequantized = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize);
  ASSERT_TRUE(quantized && dequantized);
  // The embedding, norms and RoPE table are float32 in both; every matrix (1 277 952
  // weights) is 32 bits dequantized and 8.5 (Q8_0) or 4.5/6.6 (Q4_K/Q6_K) kept, so keeping
  // saves 23.5 or more bits per matrix weight.
  const ModelConfig& config = quantized->model->config();
  const double matrix_weights = 1277952;
  const double saved_bits = (static_cast<double>(dequantized->model->weight_bytes()) -
                             static_cast<double>(quantized->model->weight_bytes())) *
                            8 / matrix_weights;
  std::printf(
      "%s: %zu bytes of weights kept, %zu dequantized (%.2f bits per matrix weight saved)\n",
      c.type, quantized->model->weight_bytes(), dequantized->model->weight_bytes(), saved_bits);
  EXPECT_GT(saved_bits, 23.0) << c.type;

  const int vocab = config.vocab_size;
  double max_error = 0;
  int argmax_same = 0, argmax_total = 0, greedy_same = 0, greedy_total = 0;
  for (int seed : {1, 2, 3}) {
    const std::vector<int32_t> prompt = RandomPrompt(vocab, seed);
    const std::vector<float> q = PrefillLogits(*quantized, prompt);
    const std::vector<float> f = PrefillLogits(*dequantized, prompt);
    for (int t = 0; t < kPromptTokens; ++t) {
      const float* a = q.data() + static_cast<size_t>(t) * vocab;
      const float* b = f.data() + static_cast<size_t>(t) * vocab;
      max_error = std::max(max_error, RelativeError(a, b, vocab));
      argmax_same += std::max_element(a, a + vocab) - a == std::max_element(b, b + vocab) - b;
      ++argmax_total;
    }
    const std::vector<int32_t> want = GreedyByPrefill(*dequantized, prompt, kGreedyTokens);
    const std::vector<int32_t> got = GreedyByPrefill(*quantized, prompt, kGreedyTokens);
    greedy_same +=
        static_cast<int>(std::mismatch(want.begin(), want.end(), got.begin()).first - want.begin());
    greedy_total += kGreedyTokens;
  }
  std::printf(
      "%s kept against dequantized: max relative logit error %.3g; argmax agrees at %d/%d "
      "positions; greedy prefix agrees for %d/%d tokens\n",
      c.type, max_error, argmax_same, argmax_total, greedy_same, greedy_total);
  EXPECT_LT(max_error, c.max_relative_error) << c.type;
  EXPECT_GT(max_error, 0.0) << c.type << ": the blocks were not computed on";
  EXPECT_GE(argmax_same, argmax_total * 8 / 10) << c.type;
}

// A prompt run as one prefill (GEMMs of 40 rows, three row tiles) and then again one token
// per step (GEMMs of one row) gives the same logits, bit for bit, as does a 2-thread
// backend against a 1-thread one.
TEST_P(GgufQuantModelTest, LogitsAreTheSameBitsWhateverTheBatch) {
  const Case c = GetParam();
  TestTempDir dir;
  const std::string path = WriteQuantGguf(dir, c.type);
  ASSERT_FALSE(path.empty());
  auto two = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32,
                                 kernels::CpuKvDtype::kF32, true);
  auto one = LocalWorker::Create(path, 1, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32,
                                 kernels::CpuKvDtype::kF32, true);
  ASSERT_TRUE(two && one);
  const int vocab = two->model->config().vocab_size;
  const std::vector<int32_t> prompt = RandomPrompt(vocab, 5);
  const std::vector<float> batched = PrefillLogits(*two, prompt);
  for (int t = 0; t < kPromptTokens; ++t) {
    const std::vector<float> alone = PrefillLogits(*one, {prompt[t]}, t);
    ASSERT_EQ(std::memcmp(alone.data(), batched.data() + static_cast<size_t>(t) * vocab,
                          vocab * sizeof(float)),
              0)
        << c.type << " position " << t;
  }
}

// The logits computed on the blocks are specified bit for bit, as recorded_bits_test.cc
// pins down for the other weight storages: every vector level (AVX2 on the blocks,
// AVX-512 VNNI on its panels) gives the recorded hash, on any CPU. When the arithmetic
// changes on purpose, record the printed hash here and say why in the commit.
TEST_P(GgufQuantModelTest, LogitsHaveTheRecordedBits) {
  const Case c = GetParam();
  TestTempDir dir;
  const std::string path = WriteQuantGguf(dir, c.type);
  ASSERT_FALSE(path.empty());
  auto w = LocalWorker::Create(path, 2, kNumBlocks, kBlockSize, kernels::CpuWeightDtype::kF32,
                               kernels::CpuKvDtype::kF32, true);
  ASSERT_TRUE(w);
  BitsHash hash;
  for (float logit : PrefillLogits(*w, RandomPrompt(w->model->config().vocab_size, 9))) {
    hash.Add(logit);
  }
  const bool portable = kernels::ActiveCpuIsa() == kernels::CpuIsa::kPortable;
  EXPECT_EQ(hash.value(), portable ? c.portable : c.vector_levels) << absl::StrFormat(
      "%s: the logits' bits differ from those recorded (new hash 0x%016x) on the %s "
      "instruction level (quantized kernels: %s) of a CPU with: %s",
      c.type, hash.value(), kernels::CpuIsaName(kernels::ActiveCpuIsa()),
      kernels::QuantGemmKernelName(), kernels::CpuFeatureSummary());
}

}  // namespace
}  // namespace conveyor::testing
