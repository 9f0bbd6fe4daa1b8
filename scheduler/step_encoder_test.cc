// The step encoding as pure logic: requests with real block tables, plans written by hand,
// and the scripted executor's worker ledger to confirm that a worker would accept each
// step the encoder makes.
#include "scheduler/step_encoder.h"

#include <memory>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/block_manager.h"
#include "tests/support/scripted_executor.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

constexpr int kBlockSize = 4;

class StepEncoderTest : public ::testing::Test {
 protected:
  Request* Add(std::vector<int32_t> prompt) {
    auto r = std::make_unique<Request>();
    r->id = 10 + requests_.size();
    r->tokens = std::move(prompt);
    r->num_prompt_tokens = r->num_tokens();
    r->sampling.set_temperature(0.5f);
    r->sampling.set_seed(1000 + r->id);
    requests_.push_back(std::move(r));
    return requests_.back().get();
  }

  // Schedules `num_tokens` of r, with the blocks they need.
  ScheduledSequence Schedule(Request* r, int num_tokens) {
    EXPECT_TRUE(blocks_.EnsureCapacity(r->blocks, r->num_computed + num_tokens));
    return {r, num_tokens};
  }

  // Encodes `plan`, runs it on the scripted worker and, if it succeeds, commits it and
  // applies it as the engine does (tokens computed; sampled tokens appended).
  worker::v1::StepRequest Run(const StepPlan& plan) {
    worker::v1::StepRequest step = encoder_.Encode(plan);
    absl::StatusOr<worker::v1::StepResponse> response = worker_.Step(step);
    EXPECT_TRUE(response.ok()) << response.status();
    if (!response.ok()) return step;
    encoder_.Committed(plan);
    for (const ScheduledSequence& s : plan.sequences) s.request->num_computed += s.num_tokens;
    for (const worker::v1::SampledToken& t : response->tokens()) {
      for (auto& r : requests_) {
        if (r->id == t.seq_id()) r->tokens.push_back(t.token_id());
      }
    }
    return step;
  }

  // Preempts r as RequestPool::Preempt does, and tells the encoder.
  void Preempt(Request* r) {
    r->blocks.Release();
    r->num_computed = 0;
    encoder_.Drop(r->id);
  }

  static StepPlan Plan(std::vector<ScheduledSequence> sequences) {
    StepPlan plan;
    plan.sequences = std::move(sequences);
    return plan;
  }

  BlockManager blocks_{64, kBlockSize, /*enable_prefix_caching=*/true};
  std::vector<std::unique_ptr<Request>> requests_;  // Before blocks_ goes.
  StepEncoder encoder_;
  testing::ScriptedExecutor worker_{kBlockSize};
};

TEST_F(StepEncoderTest, NewSequenceCarriesPromptBlocksAndSampling) {
  Request* r = Add({1, 20, 21, 22, 23, 24, 25, 26, 27, 28});
  const worker::v1::StepRequest step = Run(Plan({Schedule(r, 10)}));
  EXPECT_EQ(step.step_id(), 1u);
  EXPECT_FALSE(step.reset());
  EXPECT_THAT(step.dropped_seq_ids(), IsEmpty());
  EXPECT_THAT(step.running(), IsEmpty());
  ASSERT_EQ(step.new_sequences_size(), 1);
  const worker::v1::NewSequence& seq = step.new_sequences(0);
  EXPECT_EQ(seq.seq_id(), r->id);
  EXPECT_THAT(seq.token_ids(), ElementsAre(1, 20, 21, 22, 23, 24, 25, 26, 27, 28));
  EXPECT_EQ(seq.num_output_tokens(), 0);
  EXPECT_EQ(seq.num_cached_tokens(), 0);
  EXPECT_EQ(seq.num_tokens(), 10);
  ASSERT_EQ(seq.block_ids_size(), 3);  // 10 tokens in blocks of 4.
  EXPECT_THAT(seq.block_ids(), ElementsAreArray(r->blocks.blocks()));
  EXPECT_EQ(seq.sampling().temperature(), 0.5f);
  EXPECT_EQ(seq.sampling().seed(), 1000 + r->id);
  EXPECT_TRUE(encoder_.OnWorkers(r->id));
}

TEST_F(StepEncoderTest, RunningSequenceCarriesOnlyItsNewBlocks) {
  Request* r = Add({1, 20, 21, 22, 23, 24, 25, 26, 27, 28});
  Run(Plan({Schedule(r, 10)}));  // 11 tokens now; 3 blocks hold 12.

  worker::v1::StepRequest step = Run(Plan({Schedule(r, 1)}));
  EXPECT_EQ(step.step_id(), 2u);
  EXPECT_THAT(step.new_sequences(), IsEmpty());
  ASSERT_EQ(step.running_size(), 1);
  EXPECT_EQ(step.running(0).seq_id(), r->id);
  EXPECT_EQ(step.running(0).num_tokens(), 1);
  EXPECT_THAT(step.running(0).new_block_ids(), IsEmpty());

  Run(Plan({Schedule(r, 1)}));  // Fills the third block.
  step = Run(Plan({Schedule(r, 1)}));
  ASSERT_EQ(step.running_size(), 1);
  ASSERT_EQ(r->blocks.num_blocks(), 4);
  EXPECT_THAT(step.running(0).new_block_ids(), ElementsAre(r->blocks.blocks()[3]));
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, ChunkedPrefillSendsTheRestOfThePromptAsRunningChunks) {
  Request* r = Add({1, 20, 21, 22, 23, 24, 25, 26, 27, 28});
  worker::v1::StepRequest step = Run(Plan({Schedule(r, 4)}));
  ASSERT_EQ(step.new_sequences_size(), 1);
  EXPECT_EQ(step.new_sequences(0).token_ids_size(), 10);  // The whole prompt...
  EXPECT_EQ(step.new_sequences(0).num_tokens(), 4);       // ...of which one chunk runs.
  EXPECT_EQ(step.new_sequences(0).block_ids_size(), 1);
  step = Run(Plan({Schedule(r, 6)}));
  ASSERT_EQ(step.running_size(), 1);
  EXPECT_EQ(step.running(0).num_tokens(), 6);
  EXPECT_EQ(step.running(0).new_block_ids_size(), 2);
  EXPECT_EQ(r->num_output_tokens(), 1);  // The last chunk sampled.
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, DropsReachTheWorkersOnceAndOnlyForHeldSequences) {
  Request* a = Add({1, 20, 21});
  Request* b = Add({1, 30, 31});
  Request* never_sent = Add({1, 40, 41});
  Run(Plan({Schedule(a, 3), Schedule(b, 3)}));
  encoder_.Drop(b->id);
  encoder_.Drop(b->id);           // Twice: still one drop.
  encoder_.Drop(never_sent->id);  // The workers never held it: nothing to say.
  EXPECT_FALSE(encoder_.OnWorkers(b->id));
  worker::v1::StepRequest step = Run(Plan({Schedule(a, 1)}));
  EXPECT_THAT(step.dropped_seq_ids(), ElementsAre(b->id));
  step = Run(Plan({Schedule(a, 1)}));
  EXPECT_THAT(step.dropped_seq_ids(), IsEmpty());
  EXPECT_EQ(worker_.num_sequences(), 1);
  EXPECT_EQ(encoder_.num_sequences_on_workers(), 1u);
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, AfterAFailedStepTheNextStepResetsTheWorkers) {
  Request* a = Add({1, 20, 21});
  Request* b = Add({1, 30, 31});
  Run(Plan({Schedule(a, 3), Schedule(b, 3)}));
  // The step fails: the engine ends `a` and keeps nothing of what the workers hold.
  worker_.FailCall(2, absl::UnavailableError("rank 1 is gone"));
  EXPECT_FALSE(worker_.Step(encoder_.Encode(Plan({Schedule(a, 1), Schedule(b, 1)}))).ok());
  encoder_.ResetAll();
  EXPECT_FALSE(encoder_.OnWorkers(a->id));
  encoder_.Drop(a->id);  // Retiring `a` after the reset adds nothing to the reset.
  Preempt(b);            // `b` starts again from its prompt and output.

  worker::v1::StepRequest step = Run(Plan({Schedule(b, b->num_tokens())}));
  EXPECT_TRUE(step.reset());
  EXPECT_THAT(step.dropped_seq_ids(), IsEmpty());
  ASSERT_EQ(step.new_sequences_size(), 1);
  EXPECT_EQ(step.new_sequences(0).seq_id(), b->id);
  step = Run(Plan({Schedule(b, 1)}));
  EXPECT_FALSE(step.reset());  // Only the one step resets.
  EXPECT_EQ(step.running_size(), 1);
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, PreemptionResendsPromptAndGeneratedTokens) {
  Request* r = Add({1, 20, 21, 22, 23});
  Run(Plan({Schedule(r, 5)}));
  Run(Plan({Schedule(r, 1)}));
  Run(Plan({Schedule(r, 1)}));
  ASSERT_EQ(r->num_output_tokens(), 3);
  const std::vector<int32_t> tokens = r->tokens;
  Preempt(r);

  const worker::v1::StepRequest step = Run(Plan({Schedule(r, r->num_tokens())}));
  EXPECT_THAT(step.dropped_seq_ids(), ElementsAre(r->id));  // Forgotten, then sent anew.
  ASSERT_EQ(step.new_sequences_size(), 1);
  const worker::v1::NewSequence& seq = step.new_sequences(0);
  EXPECT_THAT(seq.token_ids(), ElementsAreArray(tokens));
  EXPECT_EQ(seq.num_output_tokens(), 3);  // Penalties and the random stream go on.
  EXPECT_EQ(seq.num_cached_tokens(), 0);
  EXPECT_EQ(seq.num_tokens(), 8);
  EXPECT_THAT(seq.block_ids(), ElementsAreArray(r->blocks.blocks()));
  EXPECT_EQ(r->num_output_tokens(), 4);
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

// What worker-failure recovery relies on: after ResetAll, every live sequence goes out as
// a NewSequence with its prompt and generated tokens in the first step.
TEST_F(StepEncoderTest, ResetAllResendsEveryLiveSequence) {
  Request* a = Add({1, 20, 21});
  Request* b = Add({1, 30, 31, 32, 33});
  Run(Plan({Schedule(a, 3), Schedule(b, 5)}));
  Run(Plan({Schedule(a, 1), Schedule(b, 1)}));
  encoder_.ResetAll();
  Preempt(a);
  Preempt(b);
  const worker::v1::StepRequest step =
      Run(Plan({Schedule(a, a->num_tokens()), Schedule(b, b->num_tokens())}));
  EXPECT_TRUE(step.reset());
  EXPECT_THAT(step.running(), IsEmpty());
  ASSERT_EQ(step.new_sequences_size(), 2);
  EXPECT_EQ(step.new_sequences(0).token_ids_size(), 5);
  EXPECT_EQ(step.new_sequences(0).num_output_tokens(), 2);
  EXPECT_EQ(step.new_sequences(1).token_ids_size(), 7);
  EXPECT_EQ(step.new_sequences(1).num_output_tokens(), 2);
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, PrefixCachedTokensAreSentAsCached) {
  const std::vector<int32_t> prompt = {1, 20, 21, 22, 23, 24, 25, 26, 27};
  Request* first = Add(prompt);
  Run(Plan({Schedule(first, 9)}));
  blocks_.CommitComputed(first->blocks, first->tokens, first->num_computed);

  Request* again = Add(prompt);
  BlockManager::PrefixMatch match = blocks_.AcquirePrefix(again->tokens);
  ASSERT_EQ(match.num_cached_tokens, 8);  // Two full blocks.
  again->blocks = std::move(match.table);
  again->num_computed = match.num_cached_tokens;
  const worker::v1::StepRequest step = Run(Plan({Schedule(again, 1)}));
  ASSERT_EQ(step.new_sequences_size(), 1);
  const worker::v1::NewSequence& seq = step.new_sequences(0);
  EXPECT_EQ(seq.num_cached_tokens(), 8);
  EXPECT_EQ(seq.num_tokens(), 1);
  EXPECT_THAT(seq.token_ids(), ElementsAreArray(prompt));
  ASSERT_EQ(seq.block_ids_size(), 3);
  EXPECT_EQ(seq.block_ids(0), first->blocks.blocks()[0]);  // Shared with `first`.
  EXPECT_EQ(seq.block_ids(1), first->blocks.blocks()[1]);
  EXPECT_THAT(worker_.violations(), IsEmpty());
}

TEST_F(StepEncoderTest, StepIdsCountEveryEncodedStep) {
  Request* r = Add({1, 20});
  const StepPlan plan = Plan({Schedule(r, 2)});
  EXPECT_EQ(encoder_.Encode(plan).step_id(), 1u);
  encoder_.ResetAll();  // A failed step still used its id.
  EXPECT_EQ(encoder_.Encode(plan).step_id(), 2u);
}

}  // namespace
}  // namespace conveyor::scheduler
