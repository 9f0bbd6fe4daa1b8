// DirectRunner, the driver of the step benchmark and the cross-backend tests: chunked
// prefill, batching and block handling must not change what the model computes (the CPU
// backend is batch invariant, so "the same" means the same bits), and running out of
// blocks is an error, not a crash.
#include "model/direct_runner.h"
#include "testing/random_weights.h"

#include <memory>
#include <vector>

#include "checkpoint/model_config.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace conveyor::model {
namespace {

class DirectRunnerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto config = ModelShapePreset("tiny");
    ASSERT_TRUE(config.ok());
    config_ = *config;
    backend_ = kernels::MakeCpuBackend(1);
    auto model = LlamaModel::Create(config_, *testing::MakeRandomWeightSource(3), backend_.get());
    ASSERT_TRUE(model.ok()) << model.status();
    model_ = std::move(*model);
    auto cache = KvCache::Create(backend_.get(), config_.num_layers, model_->local_num_kv_heads(),
                                 config_.head_dim, /*block_size=*/4, /*num_blocks=*/40);
    ASSERT_TRUE(cache.ok()) << cache.status();
    cache_ = std::move(*cache);
  }

  ModelConfig config_;
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
};

TEST_F(DirectRunnerTest, ChunkedPrefillAndBatchingGiveTheSameLogits) {
  const std::vector<int32_t> a = {5, 9, 200, 7, 7, 31, 400, 2, 88, 17, 3};
  const std::vector<int32_t> b = {100, 101, 102};
  std::vector<float> alone_a, alone_b, together;
  {
    DirectRunner runner(model_.get(), cache_.get());
    const int sa[] = {runner.Add(a)};
    ASSERT_EQ(*runner.Step(sa, 0, false, &alone_a), 1);
    runner.Clear();
    const int sb[] = {runner.Add(b)};
    ASSERT_EQ(*runner.Step(sb, 0, false, &alone_b), 1);
  }
  DirectRunner runner(model_.get(), cache_.get());
  const int seqs[] = {runner.Add(a), runner.Add(b)};
  // Chunks of 3: b finishes first (and gets no row again), a in four steps.
  std::vector<float> logits;
  ASSERT_EQ(*runner.Step(seqs, 3, false, &logits), 1);  // b's row.
  EXPECT_EQ(logits, alone_b);
  ASSERT_TRUE(runner.ComputeAll(std::span<const int>(seqs, 1), /*max_step_tokens=*/3).ok());
  EXPECT_EQ(runner.num_computed(seqs[0]), static_cast<int>(a.size()));
  // The next token of both, as one decode batch.
  runner.Append(seqs[0], 42);
  runner.Append(seqs[1], 42);
  ASSERT_EQ(*runner.Step(seqs, 0, false, &together), 2);
  DirectRunner reference(model_.get(), cache_.get());
  std::vector<int32_t> a_next = a, b_next = b;
  a_next.push_back(42);
  b_next.push_back(42);
  std::vector<float> want_a, want_b;
  const int ra[] = {reference.Add(a_next)};
  ASSERT_EQ(*reference.Step(ra, 0, false, &want_a), 1);
  reference.Clear();
  const int rb[] = {reference.Add(b_next)};
  ASSERT_EQ(*reference.Step(rb, 0, false, &want_b), 1);
  const size_t vocab = config_.vocab_size;
  EXPECT_EQ(std::vector<float>(together.begin(), together.begin() + vocab), want_a);
  EXPECT_EQ(std::vector<float>(together.begin() + vocab, together.end()), want_b);
}

TEST_F(DirectRunnerTest, AllPositionsGivesARowPerToken) {
  DirectRunner runner(model_.get(), cache_.get());
  const int seqs[] = {runner.Add({1, 2, 3, 4, 5})};
  std::vector<float> logits;
  ASSERT_EQ(*runner.Step(seqs, 0, true, &logits), 5);
  EXPECT_EQ(logits.size(), 5u * config_.vocab_size);
}

TEST_F(DirectRunnerTest, RunningOutOfBlocksIsResourceExhausted) {
  DirectRunner runner(model_.get(), cache_.get());
  // 40 blocks of 4 tokens: 161 tokens do not fit.
  const int seqs[] = {runner.Add(std::vector<int32_t>(161, 7))};
  std::vector<float> logits;
  const absl::StatusOr<int> rows = runner.Step(seqs, 0, false, &logits);
  EXPECT_EQ(rows.status().code(), absl::StatusCode::kResourceExhausted) << rows.status();
  runner.Clear();
  const int fits[] = {runner.Add(std::vector<int32_t>(160, 7))};
  EXPECT_TRUE(runner.Step(fits, 0, false, &logits).ok());
}

}  // namespace
}  // namespace conveyor::model
