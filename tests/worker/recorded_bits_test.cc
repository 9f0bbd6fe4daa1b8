// The CPU backend's results are specified bit for bit (docs/cpu-isa.md): the vector
// levels (AVX2, AVX-512, AVX512-BF16) compute the same operations in the same order, so a
// model gives the same logits on an AMD or an Intel CPU, with or without AVX-512, and a
// fleet that mixes them agrees. This test pins that down across machines: it hashes every
// logit (its float32 bits) and token of a fixed prompt and greedy decode, per weight and
// KV storage, and compares the hash with the one recorded when the arithmetic last
// changed. The other tests compare levels on one machine; only a recorded value catches a
// CPU whose instructions compute something else, and CI runs this at every level the
// machine has (CONVEYOR_CPU_ISA). The portable level has hashes of its own: its exp and
// attention's softmax differ from the vector levels' in the last bits (the C library's
// exp), which bf16's rounding of every GEMM input usually hides.
//
// When the arithmetic changes on purpose (a new kernel order, a different rounding), the
// failure prints the new hash: record it below, and say in the commit why the bits moved.
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

constexpr int kBlockSize = 16;
constexpr int kNewTokens = 8;

struct Case {
  const char* variant;
  kernels::CpuWeightDtype weights;
  kernels::CpuKvDtype kv;
  // The hash of its tokens and logits, on the vector levels and on the portable one.
  uint64_t vector_levels, portable;
  const char* name;
};

// Prefill of 21 tokens in one step, then greedy decode on two threads: the hash covers
// the prompt's last logits and every decode step's.
uint64_t HashOfGreedyRun(const Case& c) {
  auto w = LocalWorker::Create(TestModelDir(c.variant), 2, 8, kBlockSize, c.weights, c.kv);
  if (w == nullptr) return 0;
  const int vocab = w->model->config().vocab_size;
  std::vector<int32_t> prompt = {1};
  for (int i = 1; i < 21; ++i) prompt.push_back(3 + (i * 37) % (vocab - 3));

  worker::v1::StepRequest step;
  auto* seq = step.add_new_sequences();
  seq->set_seq_id(1);
  seq->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  seq->set_num_tokens(static_cast<int>(prompt.size()));
  for (int b = 0; b * kBlockSize < static_cast<int>(prompt.size()) + kNewTokens; ++b) {
    seq->add_block_ids(b);
  }
  BitsHash hash;
  for (int i = 0; i < kNewTokens; ++i) {
    worker::v1::StepResponse response;
    EXPECT_TRUE(w->engine->Step(step, &response).ok());
    EXPECT_EQ(response.tokens_size(), 1);
    if (response.tokens_size() != 1) return 0;
    hash.Add(static_cast<uint32_t>(response.tokens(0).token_id()));
    for (float logit : w->logits.Last(1)) hash.Add(logit);
    step.Clear();
    auto* running = step.add_running();
    running->set_seq_id(1);
    running->set_num_tokens(1);
  }
  return hash.value();
}

class RecordedBitsTest : public ::testing::TestWithParam<Case> {};

TEST_P(RecordedBitsTest, LogitsHaveTheRecordedBits) {
  const Case& c = GetParam();
  const uint64_t hash = HashOfGreedyRun(c);
  const bool portable = kernels::ActiveCpuIsa() == kernels::CpuIsa::kPortable;
  EXPECT_EQ(hash, portable ? c.portable : c.vector_levels) << absl::StrFormat(
      "%s: the logits' bits differ from those recorded (new hash 0x%016x) on the "
      "%s instruction level of a CPU with: %s. If the arithmetic changed on purpose, "
      "record the new hash in tests/worker/recorded_bits_test.cc; if not, this CPU or "
      "level computes something other than the others (docs/cpu-isa.md).",
      c.name, hash, kernels::CpuIsaName(kernels::ActiveCpuIsa()), kernels::CpuFeatureSummary());
}

using kernels::CpuKvDtype;
using kernels::CpuWeightDtype;

// Recorded on an Intel Xeon (Emerald Rapids: AVX512-BF16, no AMX exposed) at every level.
// The MoE models' routers stay float32 (Backend::PackLinearFullPrecision), so with bf16
// weights their portable level differs from the vector ones as float32 GEMMs do.
INSTANTIATE_TEST_SUITE_P(
    Storage, RecordedBitsTest,
    ::testing::Values(Case{"llama3_gqa", CpuWeightDtype::kF32, CpuKvDtype::kF32, 0xd7ae87b4e8e17442,
                           0xc8c21089840008e5, "llama3_f32"},
                      Case{"llama3_gqa", CpuWeightDtype::kBf16, CpuKvDtype::kF32,
                           0x72f092a144da86fa, 0x72f092a144da86fa, "llama3_bf16"},
                      Case{"llama3_gqa", CpuWeightDtype::kInt8, CpuKvDtype::kF32,
                           0xd3d6739ca84a15fb, 0xffccbe7e960f68e6, "llama3_int8"},
                      Case{"llama3_gqa", CpuWeightDtype::kBf16, CpuKvDtype::kBf16,
                           0x1e63c33bae463a67, 0x1e63c33bae463a67, "llama3_bf16_kv_bf16"},
                      Case{"qwen2_bias_f16", CpuWeightDtype::kF32, CpuKvDtype::kF32,
                           0xd964f9928e6dc0fc, 0xf9cf1664bc75a444, "qwen2_f32"},
                      Case{"qwen2_bias_f16", CpuWeightDtype::kBf16, CpuKvDtype::kBf16,
                           0x1d598ed2703c7a99, 0x1d598ed2703c7a99, "qwen2_bf16_kv_bf16"},
                      Case{"qwen2_bias_f16", CpuWeightDtype::kInt8, CpuKvDtype::kF32,
                           0x46d7605a0298e868, 0x9871db62a349e70c, "qwen2_int8"},
                      Case{"qwen2_bias_f16", CpuWeightDtype::kInt8, CpuKvDtype::kBf16,
                           0x85f10fc283a738be, 0x47771eb26f14a595, "qwen2_int8_kv_bf16"},
                      Case{"qwen3_moe", CpuWeightDtype::kF32, CpuKvDtype::kF32, 0xce09d68b22aa846b,
                           0x5ca9e87fbf73aebe, "qwen3_moe_f32"},
                      Case{"qwen3_moe", CpuWeightDtype::kBf16, CpuKvDtype::kBf16,
                           0x2d0fd62e871f869f, 0xf265be6b4fbb2da0, "qwen3_moe_bf16_kv_bf16"},
                      Case{"mixtral_moe_tied", CpuWeightDtype::kInt8, CpuKvDtype::kF32,
                           0x92eaf4812e417129, 0xc8023bf67b990fe8, "mixtral_int8"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace conveyor::testing
