// End to end across backends: the same model (deterministic random weights with
// tests/model_gen's scales) decodes the same prompts greedily on a backend under test
// and on the float32 CPU backend, the reference.
//
// Two measures, both printed as "[ METRIC   ]" lines for tests/gpu/run.sh:
//  - free-running: per prompt, the tokens generated before the first divergence (after
//    one, the sequences differ and comparing further says nothing);
//  - teacher-forced: both backends read the reference's whole sequences in one pass, and
//    at each generated position we compare their argmax. This counts every position,
//    so one early near-tie does not hide the other 127.
// The target (issue E) is >= 99 % teacher-forced agreement over 128 tokens. What the test
// asserts is what a correct 16-bit implementation must do whatever the model: logits
// within bf16-class error of the reference (‖Δ‖/‖ref‖ over every position), and every
// disagreement a near tie of the reference (its margin between the two tokens small
// against its logits' spread), since a random model has more near ties than a trained one.
//
// The CPU test (threads 2 vs 1) runs everywhere and must agree exactly: it checks the
// harness itself. The CUDA test reports SKIPPED without a usable device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "checkpoint/model_config.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/direct_runner.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "testing/random_weights.h"
#ifdef CONVEYOR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace conveyor {
namespace {

constexpr int kNewTokens = 128;
constexpr int kNumPrompts = 8;
constexpr int kBlockSize = 16;

ModelConfig Preset(const char* name) {
  absl::StatusOr<ModelConfig> config = ModelShapePreset(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

// A model on a backend with its KV cache and a runner.
struct Instance {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::KvCache> cache;
  std::unique_ptr<model::DirectRunner> runner;
};

Instance MakeInstance(std::unique_ptr<kernels::Backend> backend, const ModelConfig& config) {
  Instance in;
  in.backend = std::move(backend);
  const auto weights = testing::MakeRandomWeightSource(11);
  auto model = model::LlamaModel::Create(config, *weights, in.backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return in;
  in.model = std::move(*model);
  const int blocks_per_seq = (64 + kNewTokens + kBlockSize) / kBlockSize + 1;
  auto cache =
      model::KvCache::Create(in.backend.get(), config.num_layers, in.model->local_num_kv_heads(),
                             config.head_dim, kBlockSize, kNumPrompts * blocks_per_seq);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return in;
  in.cache = std::move(*cache);
  in.runner = std::make_unique<model::DirectRunner>(in.model.get(), in.cache.get());
  return in;
}

std::vector<std::vector<int32_t>> Prompts(int vocab) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < kNumPrompts; ++p) {
    std::vector<int32_t> prompt(8 + 7 * p);  // 8 .. 57 tokens.
    for (int32_t& t : prompt) t = token(rng);
    prompts.push_back(prompt);
  }
  return prompts;
}

// Greedy continuations of every prompt, decoded as one batch.
std::vector<std::vector<int32_t>> GreedyDecode(model::DirectRunner* runner,
                                               const std::vector<std::vector<int32_t>>& prompts,
                                               int vocab) {
  runner->Clear();
  std::vector<int> seqs;
  seqs.reserve(prompts.size());
  for (const auto& p : prompts) seqs.push_back(runner->Add(p));
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  std::vector<float> logits;
  for (int step = 0; step < kNewTokens; ++step) {
    auto rows = runner->Step(seqs, 0, false, &logits);
    EXPECT_TRUE(rows.ok()) << rows.status();
    if (!rows.ok() || *rows != static_cast<int>(seqs.size())) return {};
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int next = model::Argmax(std::span<const float>(logits).subspan(i * vocab, vocab));
      outputs[i].push_back(next);
      runner->Append(seqs[i], next);
    }
  }
  return outputs;
}

// Logits at every position of each full sequence, one pass each: [tokens, vocab] per seq.
std::vector<std::vector<float>> TeacherForcedLogits(
    model::DirectRunner* runner, const std::vector<std::vector<int32_t>>& sequences) {
  runner->Clear();
  std::vector<std::vector<float>> out;
  for (const auto& seq : sequences) {
    const int id = runner->Add(seq);
    const int ids[] = {id};
    std::vector<float> logits;
    auto rows = runner->Step(ids, 0, true, &logits);
    EXPECT_TRUE(rows.ok()) << rows.status();
    out.push_back(std::move(logits));
  }
  return out;
}

struct Agreement {
  int positions = 0;
  int agreeing = 0;
  double logit_rel_error = 0;     // ‖test − ref‖ / ‖ref‖ over every compared position.
  double worst_disagreement = 0;  // Largest reference margin / logit spread at a miss.
  std::vector<int> first_divergence;  // Per prompt; kNewTokens if none.
};

Agreement Compare(Instance& ref, Instance& test, const ModelConfig& config) {
  const int vocab = config.vocab_size;
  const auto prompts = Prompts(vocab);
  const auto ref_out = GreedyDecode(ref.runner.get(), prompts, vocab);
  const auto test_out = GreedyDecode(test.runner.get(), prompts, vocab);
  Agreement a;
  if (ref_out.size() != prompts.size() || test_out.size() != prompts.size()) return a;
  std::vector<std::vector<int32_t>> full;
  for (size_t p = 0; p < prompts.size(); ++p) {
    int same = 0;
    while (same < kNewTokens && ref_out[p][same] == test_out[p][same]) ++same;
    a.first_divergence.push_back(same);
    full.push_back(prompts[p]);
    // The last generated token predicts nothing we compare: leave it out.
    full.back().insert(full.back().end(), ref_out[p].begin(), ref_out[p].end() - 1);
  }
  const auto ref_logits = TeacherForcedLogits(ref.runner.get(), full);
  const auto test_logits = TeacherForcedLogits(test.runner.get(), full);
  double diff2 = 0, ref2 = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int prompt_len = static_cast<int>(prompts[p].size());
    for (int j = 0; j < kNewTokens; ++j) {
      // Row prompt_len - 1 + j predicts generated token j.
      const size_t row = static_cast<size_t>(prompt_len - 1 + j) * vocab;
      std::span<const float> r(ref_logits[p].data() + row, vocab);
      std::span<const float> t(test_logits[p].data() + row, vocab);
      for (int v = 0; v < vocab; ++v) {
        diff2 += (double(t[v]) - r[v]) * (double(t[v]) - r[v]);
        ref2 += double(r[v]) * r[v];
      }
      const int ref_choice = model::Argmax(r);
      const int test_choice = model::Argmax(t);
      ++a.positions;
      if (ref_choice == test_choice) {
        ++a.agreeing;
        continue;
      }
      const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      const double margin = (r[ref_choice] - r[test_choice]) / std::max(*hi - *lo, 1e-30f);
      a.worst_disagreement = std::max(a.worst_disagreement, margin);
      std::printf(
          "position %d of prompt %zu: reference %d (%.4f), test %d (%.4f in the "
          "reference), margin %.3g of the logit range\n",
          j, p, ref_choice, r[ref_choice], test_choice, r[test_choice], margin);
    }
  }
  a.logit_rel_error = std::sqrt(diff2 / std::max(ref2, 1e-30));
  return a;
}

void Report(const std::string& name, const Agreement& a) {
  std::string divergence;
  for (int d : a.first_divergence) divergence += " " + std::to_string(d);
  std::printf("first divergence per prompt (of %d tokens):%s\n", kNewTokens, divergence.c_str());
  std::printf(
      "[ METRIC   ] %s teacher_forced_agreement=%.4f positions=%d logit_rel_err=%.3g "
      "worst_miss_margin=%.3g\n",
      name.c_str(), a.positions ? double(a.agreeing) / a.positions : 0.0, a.positions,
      a.logit_rel_error, a.worst_disagreement);
}

TEST(GreedyAgreementTest, CpuThreadCountsAgreeExactly) {
  const ModelConfig config = Preset("tiny");
  Instance ref = MakeInstance(kernels::MakeCpuBackend(2), config);
  Instance test = MakeInstance(kernels::MakeCpuBackend(1), config);
  ASSERT_TRUE(ref.runner && test.runner);
  const Agreement a = Compare(ref, test, config);
  Report("cpu_threads", a);
  ASSERT_EQ(a.positions, kNumPrompts * kNewTokens);
  EXPECT_EQ(a.agreeing, a.positions);
  EXPECT_EQ(a.logit_rel_error, 0.0);  // The CPU backend is batch and thread invariant.
  for (int d : a.first_divergence) EXPECT_EQ(d, kNewTokens);
}

TEST(GreedyAgreementTest, CudaBf16AgreesWithCpuFp32) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  auto cuda = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Instance test = MakeInstance(std::move(*cuda), config);
  Instance ref = MakeInstance(kernels::MakeCpuBackend(0), config);
  ASSERT_TRUE(ref.runner && test.runner);
  const Agreement a = Compare(ref, test, config);
  auto* backend = static_cast<kernels::CudaBackend*>(test.backend.get());
  ASSERT_TRUE(backend->last_error().ok()) << backend->last_error();
  Report("cuda_bf16_vs_cpu_fp32", a);
  ASSERT_EQ(a.positions, kNumPrompts * kNewTokens);
  // bf16 activations and weights: ‖Δ‖/‖ref‖ lands between 1e-3 and 1e-2.
  EXPECT_LT(a.logit_rel_error, 2e-2);
  // A miss is only acceptable where the reference itself nearly tied.
  EXPECT_LT(a.worst_disagreement, 0.02);
  std::printf("teacher-forced agreement %.2f %% (target >= 99 %%)\n",
              100.0 * a.agreeing / a.positions);
#endif
}

// Decode steps replayed as CUDA graphs compute what the same steps launched one kernel
// at a time do: 8 sequences pad to 8 (the same GEMM shapes), and attention's fixed
// partitions make the padded block-table width irrelevant, so the tokens are identical.
TEST(GreedyAgreementTest, CudaGraphsDecodeAsWithout) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  auto plain_backend = kernels::MakeCudaBackend(0);
  auto graph_backend = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(plain_backend.ok() && graph_backend.ok());
  Instance plain = MakeInstance(std::move(*plain_backend), config);
  Instance graphed = MakeInstance(std::move(*graph_backend), config);
  ASSERT_TRUE(plain.runner && graphed.runner);
  ASSERT_TRUE(graphed.model->EnableDecodeGraphs(kNumPrompts).ok());
  const auto prompts = Prompts(config.vocab_size);
  const auto want = GreedyDecode(plain.runner.get(), prompts, config.vocab_size);
  const auto got = GreedyDecode(graphed.runner.get(), prompts, config.vocab_size);
  for (Instance* in : {&plain, &graphed}) {
    auto* backend = static_cast<kernels::CudaBackend*>(in->backend.get());
    ASSERT_TRUE(backend->last_error().ok()) << backend->last_error();
  }
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) EXPECT_EQ(got[p], want[p]) << "prompt " << p;
#endif
}

}  // namespace
}  // namespace conveyor
