// The CPU worker against an independent numpy implementation of the Hugging Face Llama
// formulas (tests/reference/llama_ref.py): logits at every prompt position within 1e-4
// relative error, and 32 identical greedy tokens, for every test checkpoint variant
// (GQA + Llama-3 RoPE scaling; tied embeddings + MHA + bf16 shards + linear scaling;
// Qwen2 qkv bias + f16).
#include <algorithm>
#include <cstdio>
#include <numeric>
#include <string>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;

class ReferenceTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ReferenceTest, LogitsAtEveryPromptPositionMatch) {
  auto w = LocalWorker::Create(TestModelDir(GetParam()), 2, kNumBlocks, kBlockSize);
  ASSERT_NE(w, nullptr);
  const Reference ref = LoadReference(GetParam());
  ASSERT_FALSE(ref.prompts.empty());
  const int vocab = w->model->config().vocab_size;
  double max_err = 0.0;
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = ref.prompts[p];
    const int n = static_cast<int>(prompt.size());
    model::ForwardBatch batch;
    batch.token_ids = prompt;
    batch.token_seq.assign(n, 0);
    batch.token_pos.resize(n);
    std::iota(batch.token_pos.begin(), batch.token_pos.end(), 0);
    batch.slot_mapping = batch.token_pos;  // Blocks 0, 1, 2, … in order.
    batch.num_seqs = 1;
    batch.max_blocks_per_seq = (n + kBlockSize - 1) / kBlockSize;
    batch.block_tables.resize(batch.max_blocks_per_seq);
    std::iota(batch.block_tables.begin(), batch.block_tables.end(), 0);
    batch.logit_rows = batch.token_pos;
    std::vector<float> logits(static_cast<size_t>(n) * vocab);
    ASSERT_TRUE(w->model->Forward(batch, *w->cache, logits.data()).ok());
    ASSERT_EQ(ref.logits[p].size(), static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) {
      ASSERT_EQ(ref.logits[p][t].size(), static_cast<size_t>(vocab));
      const double err = RelativeError(logits.data() + static_cast<size_t>(t) * vocab,
                                       ref.logits[p][t].data(), vocab);
      EXPECT_LT(err, 1e-4) << "prompt " << p << " position " << t;
      max_err = std::max(max_err, err);
    }
  }
  RecordProperty("max_relative_error", std::to_string(max_err));
  std::printf("%s: max relative logit error vs reference %.3g\n", GetParam().c_str(), max_err);
}

TEST_P(ReferenceTest, GreedyTokensMatch) {
  auto w = LocalWorker::Create(TestModelDir(GetParam()), 2, kNumBlocks, kBlockSize);
  ASSERT_NE(w, nullptr);
  const Reference ref = LoadReference(GetParam());
  for (size_t p = 0; p < ref.prompts.size(); ++p) {
    const std::vector<int32_t>& prompt = ref.prompts[p];
    const int total = static_cast<int>(prompt.size() + ref.greedy[p].size());
    worker::v1::StepRequest step;
    worker::v1::NewSequence* seq = step.add_new_sequences();
    seq->set_seq_id(p);
    seq->mutable_token_ids()->Add(prompt.begin(), prompt.end());
    seq->set_num_tokens(static_cast<int>(prompt.size()));
    for (int b = 0; b * kBlockSize < total; ++b) seq->add_block_ids(b);
    std::vector<int32_t> generated;
    while (generated.size() < ref.greedy[p].size()) {
      worker::v1::StepResponse response;
      ASSERT_TRUE(w->engine->Step(step, &response).ok());
      ASSERT_EQ(response.tokens_size(), 1);
      generated.push_back(response.tokens(0).token_id());
      step.Clear();
      worker::v1::RunningSequence* running = step.add_running();
      running->set_seq_id(p);
      running->set_num_tokens(1);
    }
    EXPECT_EQ(generated, ref.greedy[p]) << "prompt " << p;
    step.Clear();
    step.add_dropped_seq_ids(p);
    worker::v1::StepResponse response;
    ASSERT_TRUE(w->engine->Step(step, &response).ok());
  }
}

INSTANTIATE_TEST_SUITE_P(Variants, ReferenceTest, ::testing::ValuesIn(TestModelVariants()));

}  // namespace
}  // namespace conveyor::testing
