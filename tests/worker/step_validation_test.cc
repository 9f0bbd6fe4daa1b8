// Every malformed step is INVALID_ARGUMENT with a message naming the problem, changes
// nothing, and leaves the engine serving.
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using worker::v1::StepRequest;
using worker::v1::StepResponse;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 160;

class StepValidationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = LocalWorker::Create(TestModelDir("llama3_gqa"), 1, kNumBlocks, kBlockSize);
    ASSERT_NE(w_, nullptr);
    vocab_ = w_->model->config().vocab_size;
  }

  // A well-formed new sequence of `len` prompt tokens with enough blocks for them.
  worker::v1::NewSequence* AddNew(StepRequest* step, uint64_t id, int len, int first_block) {
    auto* seq = step->add_new_sequences();
    seq->set_seq_id(id);
    for (int i = 0; i < len; ++i) seq->add_token_ids(3 + i % (vocab_ - 3));
    seq->set_num_tokens(len);
    for (int b = 0; b * kBlockSize < len + 1; ++b) seq->add_block_ids(first_block + b);
    return seq;
  }

  void ExpectInvalid(const StepRequest& step, const std::string& words) {
    StepResponse response;
    const absl::Status status = w_->engine->Step(step, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(words), std::string::npos)
        << "message \"" << status.message() << "\" should mention \"" << words << "\"";
    EXPECT_EQ(response.tokens_size(), 0);
  }

  absl::Status Run(const StepRequest& step) {
    StepResponse response;
    return w_->engine->Step(step, &response);
  }

  std::unique_ptr<LocalWorker> w_;
  int vocab_ = 0;
};

TEST_F(StepValidationTest, UnknownRunningSequence) {
  StepRequest step;
  step.add_running()->set_seq_id(99);
  step.mutable_running(0)->set_num_tokens(1);
  ExpectInvalid(step, "unknown sequence");
}

TEST_F(StepValidationTest, UnknownDroppedSequence) {
  StepRequest step;
  step.add_dropped_seq_ids(5);
  ExpectInvalid(step, "dropped_seq_ids names an unknown sequence");
}

TEST_F(StepValidationTest, NewSequenceAlreadyHeld) {
  StepRequest step;
  AddNew(&step, 1, 4, 0);
  ASSERT_TRUE(Run(step).ok());
  ExpectInvalid(step, "already holds");
}

TEST_F(StepValidationTest, SequenceScheduledTwice) {
  StepRequest step;
  AddNew(&step, 1, 4, 0);
  AddNew(&step, 1, 4, 2);
  ExpectInvalid(step, "scheduled twice");
}

TEST_F(StepValidationTest, TokenOutsideVocabulary) {
  StepRequest step;
  AddNew(&step, 1, 4, 0)->set_token_ids(2, vocab_);
  ExpectInvalid(step, "outside the vocabulary");
  step.mutable_new_sequences(0)->set_token_ids(2, -1);
  ExpectInvalid(step, "outside the vocabulary");
}

TEST_F(StepValidationTest, EmptyPrompt) {
  StepRequest step;
  AddNew(&step, 1, 4, 0)->clear_token_ids();
  ExpectInvalid(step, "token_ids is empty");
}

TEST_F(StepValidationTest, BlockIdOutOfRange) {
  StepRequest step;
  AddNew(&step, 1, 4, 0)->set_block_ids(0, kNumBlocks);
  ExpectInvalid(step, "block_ids holds block 160");

  step.mutable_new_sequences(0)->set_block_ids(0, 0);
  ASSERT_TRUE(Run(step).ok());
  StepRequest next;
  auto* running = next.add_running();
  running->set_seq_id(1);
  running->set_num_tokens(1);
  running->add_new_block_ids(-1);
  ExpectInvalid(next, "new_block_ids holds block -1");
}

TEST_F(StepValidationTest, MoreTokensThanBlocksHold) {
  StepRequest step;
  auto* seq = AddNew(&step, 1, 20, 0);
  seq->clear_block_ids();
  seq->add_block_ids(0);
  ExpectInvalid(step, "block(s) hold 16");
}

TEST_F(StepValidationTest, MoreTokensThanKnown) {
  StepRequest step;
  AddNew(&step, 1, 4, 0)->set_num_tokens(5);
  ExpectInvalid(step, "goes past");

  step.mutable_new_sequences(0)->set_num_tokens(4);
  ASSERT_TRUE(Run(step).ok());
  StepRequest decode;
  decode.add_running()->set_seq_id(1);
  decode.mutable_running(0)->set_num_tokens(2);  // Only the one sampled token is known.
  ExpectInvalid(decode, "goes past");
  decode.mutable_running(0)->set_num_tokens(0);
  ExpectInvalid(decode, "num_tokens must be >= 1");
}

TEST_F(StepValidationTest, BeyondModelContext) {
  const int context = w_->model->config().max_context_tokens;
  ASSERT_LE(context + 1, kNumBlocks * kBlockSize) << "test needs a larger cache";
  StepRequest step;
  AddNew(&step, 1, context + 1, 0);
  ExpectInvalid(step, "beyond the model's context");
}

TEST_F(StepValidationTest, StepLimits) {
  worker::StepRunner::Options options;
  options.max_step_tokens = 8;
  options.max_num_seqs = 2;
  worker::StepRunner engine(w_->model.get(), w_->cache.get(), options);
  StepResponse response;
  StepRequest step;
  AddNew(&step, 1, 9, 0);
  absl::Status status = engine.Step(step, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("above the worker's limit of 8"), std::string::npos) << status;
  step.Clear();
  AddNew(&step, 1, 1, 0);
  AddNew(&step, 2, 1, 1);
  AddNew(&step, 3, 1, 2);
  status = engine.Step(step, &response);
  EXPECT_NE(status.message().find("sequences, above the worker's limit of 2"), std::string::npos)
      << status;
}

TEST_F(StepValidationTest, BadSamplingParameters) {
  StepRequest step;
  auto* seq = AddNew(&step, 1, 4, 0);
  seq->mutable_sampling()->set_top_p(1.5f);
  ExpectInvalid(step, "top_p");
  seq->mutable_sampling()->set_top_p(0.5f);
  seq->mutable_sampling()->set_temperature(-1.0f);
  ExpectInvalid(step, "temperature");
  seq->mutable_sampling()->set_temperature(1.0f);
  seq->mutable_sampling()->set_min_p(2.0f);
  ExpectInvalid(step, "min_p");
  seq->mutable_sampling()->set_min_p(0.0f);
  seq->mutable_sampling()->set_top_k(-3);
  ExpectInvalid(step, "top_k");
  seq->mutable_sampling()->set_top_k(0);
  seq->mutable_sampling()->set_num_logprobs(1000);
  ExpectInvalid(step, "num_logprobs");
  seq->mutable_sampling()->set_num_logprobs(0);
  seq->set_num_output_tokens(4);
  ExpectInvalid(step, "num_output_tokens");
}

TEST_F(StepValidationTest, BadPromptScoring) {
  StepRequest step;
  auto* seq = AddNew(&step, 1, 4, 0);
  seq->set_prompt_logprobs(1000);
  ExpectInvalid(step, "prompt_logprobs must be in [0, 20]");
  seq->set_prompt_logprobs(-1);
  ExpectInvalid(step, "prompt_logprobs must be in [0, 20]");
  // A scored prompt has no cached tokens: they would have no logits.
  seq->set_prompt_logprobs(2);
  seq->set_num_cached_tokens(2);
  ExpectInvalid(step, "has no cached tokens");
  seq->set_num_cached_tokens(0);
  StepResponse response;
  ASSERT_TRUE(w_->engine->Step(step, &response).ok());
  // Every prompt token but the first, in order, with two alternatives each.
  ASSERT_EQ(response.prompt_logprobs_size(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(response.prompt_logprobs(i).seq_id(), 1u);
    EXPECT_EQ(response.prompt_logprobs(i).position(), i + 1);
    EXPECT_EQ(response.prompt_logprobs(i).token_id(), seq->token_ids(i + 1));
    EXPECT_EQ(response.prompt_logprobs(i).top_logprobs_size(), 2);
    EXPECT_LE(response.prompt_logprobs(i).logprob(), 0.0f);
  }
  EXPECT_EQ(response.tokens_size(), 1);
}

// A rejected step applies none of its parts, and the engine keeps serving.
TEST_F(StepValidationTest, RejectedStepChangesNothing) {
  StepRequest first;
  AddNew(&first, 1, 4, 0);
  ASSERT_TRUE(Run(first).ok());

  StepRequest mixed;
  mixed.add_dropped_seq_ids(1);
  AddNew(&mixed, 2, 4, 1);
  AddNew(&mixed, 3, 4, 2)->set_token_ids(0, vocab_);  // Invalid.
  ExpectInvalid(mixed, "outside the vocabulary");
  EXPECT_EQ(w_->engine->num_sequences(), 1);

  // Sequence 1 was not dropped, sequence 2 was not added.
  StepRequest decode;
  decode.add_running()->set_seq_id(1);
  decode.mutable_running(0)->set_num_tokens(1);
  StepResponse response;
  ASSERT_TRUE(w_->engine->Step(decode, &response).ok());
  EXPECT_EQ(response.tokens_size(), 1);
  StepRequest again;
  AddNew(&again, 2, 4, 1);
  EXPECT_TRUE(Run(again).ok());
}

}  // namespace
}  // namespace conveyor::testing

namespace conveyor::testing {
namespace {

// The worker trusts no block id a step gives it: K/V go only into blocks the writing
// sequence alone holds, so a bad (or hostile) step cannot overwrite another's cache.
TEST_F(StepValidationTest, WritingIntoAnotherSequencesBlockIsRefused) {
  StepRequest first;
  AddNew(&first, 1, 4, 0);
  ASSERT_TRUE(Run(first).ok());
  StepRequest second;
  AddNew(&second, 2, 4, 0);  // The same blocks as sequence 1.
  ExpectInvalid(second, "which another sequence");
}

TEST_F(StepValidationTest, WritingABlockListedTwiceIsRefused) {
  StepRequest step;
  auto* seq = AddNew(&step, 1, kBlockSize + 1, 0);
  seq->set_block_ids(1, seq->block_ids(0));  // Positions of both blocks write block 0.
  ExpectInvalid(step, "or this one twice");
}

TEST_F(StepValidationTest, SharedPrefixBlocksAreReadNotWritten) {
  StepRequest first;
  AddNew(&first, 1, 2 * kBlockSize, 0);  // Blocks 0, 1, 2.
  ASSERT_TRUE(Run(first).ok());
  // Sequence 2 starts with sequence 1's full first block (a prefix-cache hit) and
  // computes the rest in blocks of its own.
  StepRequest second;
  auto* seq = AddNew(&second, 2, 2 * kBlockSize, 10);
  seq->set_block_ids(0, 0);
  seq->set_num_cached_tokens(kBlockSize);
  seq->set_num_tokens(kBlockSize);
  EXPECT_TRUE(Run(second).ok());
}

TEST_F(StepValidationTest, NewSequenceLongerThanTheContextIsRefused) {
  StepRequest step;
  auto* seq = AddNew(&step, 1, 4, 0);
  const int context = w_->model->config().max_context_tokens;
  for (int i = 4; i <= context; ++i) seq->add_token_ids(3);
  ExpectInvalid(step, "beyond the model's context");
}

}  // namespace
}  // namespace conveyor::testing
