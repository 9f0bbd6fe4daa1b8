// Block-wise FP8 checkpoints (transformers' FineGrainedFP8Config; checkpoint/quantized_linear.h)
// against an independent numpy reference: tests/quant_ref/make_fp8.py writes the llama3_gqa
// test checkpoint's layers as e4m3 with a scale per block, and, from e4m3's definition
// alone, the dequantized weights as a plain safetensors checkpoint.
//  - Every weight, whole and sliced along either dimension, reads bit for bit as the
//    reference, with float32 and bf16 scales and blocks that do not divide the matrices.
//  - The served model equals the model built from the reference weights: logits bit for
//    bit and the same greedy tokens at f32, bf16 and int8 storage.
//  - FP8 layers have no ggml blocks: asking for them is UNIMPLEMENTED, saying why.
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_device.h"
#include "tests/support/quant_ref.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using ::testing::HasSubstr;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;
constexpr int kGreedyTokens = 24;
constexpr const char* kVariant = kQuantRefVariant;

// dir/q (FP8) and dir/ref (numpy-dequantized) for make_fp8.py's `args`; false after a
// failure saying why.
bool Write(const TestTempDir& dir, const std::string& args) {
  return RunQuantRefScript(dir, "make_fp8.py", args);
}

class Fp8Test : public ::testing::TestWithParam<const char*> {};

// Blocks of 24 × 48 leave partial blocks at the end of every matrix (64, 32 and 160 rows
// and columns); 128 × 128 (transformers' default) makes each matrix one partial block.
INSTANTIATE_TEST_SUITE_P(Layouts, Fp8Test,
                         ::testing::Values("--block 24 48", "--block 24 48 --scale-dtype BF16",
                                           "--block 128 128"));

TEST_P(Fp8Test, EveryWeightReadsAsTheNumpyReference) {
  TestTempDir dir;
  ASSERT_TRUE(Write(dir, GetParam()));
  absl::StatusOr<ModelConfig> config = LoadModelConfig(dir.path() + "/q");
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->quantization.method, WeightQuantization::Method::kFp8);
  auto ckpt = Checkpoint::Open(dir.path() + "/q", config->quantization);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto ref = Checkpoint::Open(dir.path() + "/ref");
  ASSERT_TRUE(ref.ok()) << ref.status();
  auto ref_file = SafetensorsFile::Open(dir.path() + "/ref/model.safetensors");
  ASSERT_TRUE(ref_file.ok()) << ref_file.status();

  int fp8 = 0;
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
    const absl::StatusOr<GgmlType> blocks = (*ckpt)->QuantizedTypeOf(name);
    if (blocks.status().code() == absl::StatusCode::kNotFound) continue;  // Not FP8.
    ++fp8;
    EXPECT_EQ(blocks.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(blocks.status().message(), HasSubstr("FP8"));
    std::vector<std::byte> none;
    EXPECT_FALSE((*ckpt)->ReadBlocks(name, shape, 0, shape[0], 0, shape[1], &none).ok());
    // Slices, as tensor parallelism reads them, across block edges.
    for (int dim : {0, 1}) {
      const int64_t begin = 5, end = shape[dim] - 3;
      const int64_t n = (end - begin) * shape[1 - dim];
      std::vector<float> slice(n), want_slice(n);
      ASSERT_TRUE((*ckpt)->ReadF32Slice(name, shape, dim, begin, end, slice.data()).ok());
      ASSERT_TRUE((*ref)->ReadF32Slice(name, shape, dim, begin, end, want_slice.data()).ok());
      ASSERT_EQ(std::memcmp(slice.data(), want_slice.data(), n * sizeof(float)), 0) << dim;
    }
  }
  EXPECT_EQ(fp8, 2 * 7);  // q, k, v, o, gate, up, down of 2 layers.
  // The e4m3 weights count (they are no float tensor), at a byte each.
  EXPECT_LT((*ckpt)->TotalTensorBytes(), (*ref)->TotalTensorBytes());
  EXPECT_GT((*ckpt)->TotalTensorBytes(), (*ref)->TotalTensorBytes() / 2);
}

TEST_P(Fp8Test, ServesWhatTheDequantizedModelServes) {
  TestTempDir dir;
  ASSERT_TRUE(Write(dir, GetParam()));
  const std::string q = dir.path() + "/q", ref = dir.path() + "/ref";
  const Reference reference = LoadReference(kVariant);
  ASSERT_FALSE(reference.prompts.empty());
  for (const kernels::CpuWeightDtype dtype :
       {kernels::CpuWeightDtype::kF32, kernels::CpuWeightDtype::kBf16,
        kernels::CpuWeightDtype::kInt8}) {
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
}

}  // namespace
}  // namespace conveyor::testing
