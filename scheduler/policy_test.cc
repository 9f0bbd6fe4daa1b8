// The batching policies as pure logic: requests, a block manager, and a simulated worker
// that "computes" whatever a plan schedules and samples a dummy token at the end.
#include "scheduler/policy.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/continuous_policy.h"
#include "scheduler/run_to_completion_policy.h"

namespace conveyor::scheduler {
namespace {

using namespace std::chrono_literals;

class PolicyTest : public ::testing::Test {
 protected:
  void SetUpPool(int num_blocks, int block_size = 4) {
    requests_.clear();  // Their block tables return blocks to the old manager first.
    pool_.reset();
    blocks_ = std::make_unique<BlockManager>(num_blocks, block_size, true);
    pool_ = std::make_unique<RequestPool>(blocks_.get());
  }

  Request* Add(int prompt_len, int max_new, int priority = 0, int first_token = 100) {
    auto r = std::make_unique<Request>();
    r->id = requests_.size() + 1;
    for (int i = 0; i < prompt_len; ++i) r->tokens.push_back(first_token + i);
    r->num_prompt_tokens = prompt_len;
    r->max_new_tokens = max_new;
    r->priority = priority;
    r->arrival = now_;
    now_ += 1ms;
    pool_->AddWaiting(r.get());
    requests_.push_back(std::move(r));
    return requests_.back().get();
  }

  // Applies a plan as the workers and the engine would: tokens computed, a token
  // sampled when a sequence reaches its end, requests done at max_new_tokens.
  void Run(const StepPlan& plan, BatchPolicy& policy) {
    for (Request* r : plan.released) pool_->Remove(r);
    for (const ScheduledSequence& s : plan.sequences) {
      Request* r = s.request;
      ASSERT_LE(r->num_computed + s.num_tokens, r->num_tokens());
      ASSERT_LE(r->num_computed + s.num_tokens, r->blocks.num_blocks() * blocks_->block_size())
          << "scheduled beyond the request's blocks";
      r->num_computed += s.num_tokens;
      blocks_->CommitComputed(r->blocks, r->tokens, r->num_computed);
      if (r->num_computed == r->num_tokens()) {
        r->tokens.push_back(7);
        if (!r->done && r->num_output_tokens() >= r->max_new_tokens) {
          r->done = true;
          if (!policy.KeepAfterDone(r)) pool_->Remove(r);
        }
      }
    }
  }

  // Plans and runs steps until nothing is left, checking the budget on each.
  int RunToEnd(BatchPolicy& policy, const PolicyLimits& limits) {
    int steps = 0;
    while (pool_->size() > 0) {
      const StepPlan plan = policy.Plan(*pool_, now_);
      EXPECT_LE(plan.num_tokens(), limits.max_step_tokens);
      EXPECT_LE(static_cast<int>(plan.sequences.size()), limits.max_num_seqs);
      Run(plan, policy);
      now_ += 1s;  // Time passes, so batch timeouts fire.
      if (++steps > 10000) {
        ADD_FAILURE() << "did not finish";
        break;
      }
    }
    return steps;
  }

  std::unique_ptr<BlockManager> blocks_;
  std::unique_ptr<RequestPool> pool_;
  std::vector<std::unique_ptr<Request>> requests_;
  Clock::time_point now_ = Clock::now();
};

TEST_F(PolicyTest, ContinuousAdmitsByPriorityThenArrival) {
  SetUpPool(100);
  ContinuousPolicy policy({/*max_num_seqs=*/2, /*max_step_tokens=*/100});
  Request* a = Add(4, 2);
  Request* b = Add(4, 2, /*priority=*/5);
  Request* c = Add(4, 2);
  const StepPlan plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].request, b);
  EXPECT_EQ(plan.sequences[1].request, a);
  EXPECT_EQ(pool_->waiting().front(), c);
}

TEST_F(PolicyTest, ContinuousChunksPrefillUnderTheTokenBudgetAfterDecodes) {
  SetUpPool(100);
  const PolicyLimits limits{8, 10};
  ContinuousPolicy policy(limits);
  Request* a = Add(3, 5);
  StepPlan plan = policy.Plan(*pool_, now_);
  Run(plan, policy);  // a prefilled, sampled its first token.
  Request* b = Add(25, 1);
  plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].request, a);  // The running decode goes first...
  EXPECT_EQ(plan.sequences[0].num_tokens, 1);
  EXPECT_EQ(plan.sequences[1].request, b);  // ...then a prefill chunk fills the budget.
  EXPECT_EQ(plan.sequences[1].num_tokens, 9);
  Run(plan, policy);
  plan = policy.Plan(*pool_, now_);
  EXPECT_EQ(plan.num_tokens(), 10);
  RunToEnd(policy, limits);
  EXPECT_EQ(b->num_output_tokens(), 1);
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
}

TEST_F(PolicyTest, ContinuousSkipsARequestWhoseLastTokenIsInFlight) {
  // The engine plans a step before the last one's answer: a request whose final token
  // (by max_new_tokens) is pending has nothing to compute, and one preempted with a
  // token pending waits until it is known (no worker may see a placeholder).
  SetUpPool(100);
  ContinuousPolicy policy({8, 100});
  Request* done_soon = Add(4, 1);
  Request* going_on = Add(4, 3);
  StepPlan plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 2u);
  for (Request* r : {done_soon, going_on}) {  // As Engine::Launch: the step samples.
    r->num_computed = r->num_tokens();
    r->tokens.push_back(kPendingToken);
    r->num_pending_tokens = 1;
  }
  EXPECT_TRUE(done_soon->last_token_in_flight());
  EXPECT_FALSE(going_on->last_token_in_flight());
  plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].request, going_on);

  pool_->Preempt(going_on);
  EXPECT_EQ(pool_->NextToAdmit(), nullptr);
  EXPECT_TRUE(policy.Plan(*pool_, now_).empty());
  going_on->tokens.back() = 7;  // The answer arrives.
  going_on->num_pending_tokens = 0;
  EXPECT_EQ(pool_->NextToAdmit(), going_on);
  plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].request, going_on);
  EXPECT_EQ(plan.sequences[0].num_tokens, 5);  // Recomputed: prompt and its token.
}

TEST_F(PolicyTest, ContinuousPreemptsTheNewestWhenBlocksRunOut) {
  // 6 blocks of 4 tokens: three 8-token prompts fill them; decoding needs more.
  SetUpPool(6);
  const PolicyLimits limits{8, 100};
  ContinuousPolicy policy(limits);
  Request* a = Add(8, 6, 0, 100);
  Request* b = Add(8, 6, 0, 200);
  Request* c = Add(8, 6, 0, 300);
  StepPlan plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 3u);
  Run(plan, policy);  // 8 computed tokens each fill 2 blocks: none free.
  plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.preempted.size(), 1u);
  EXPECT_EQ(plan.preempted[0], c);  // The newest goes.
  EXPECT_EQ(pool_->waiting().front(), c);
  EXPECT_EQ(c->num_computed, 0);
  EXPECT_EQ(c->preemptions, 1);
  ASSERT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(plan.sequences[0].request, a);
  EXPECT_EQ(plan.sequences[1].request, b);
  RunToEnd(policy, limits);
  for (Request* r : {a, b, c}) EXPECT_EQ(r->num_output_tokens(), 6);
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
}

TEST_F(PolicyTest, ContinuousServesARepeatedPrefixFromTheCache) {
  SetUpPool(100);
  const PolicyLimits limits{8, 100};
  ContinuousPolicy policy(limits);
  Add(13, 1);
  RunToEnd(policy, limits);
  Request* again = Add(13, 1);
  const StepPlan plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(again->num_cached_prompt_tokens, 12);  // Three full blocks of four.
  EXPECT_EQ(plan.sequences[0].num_tokens, 1);
  RunToEnd(policy, limits);
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
}

TEST_F(PolicyTest, StaticWaitsForAFullBatchOrTheTimeout) {
  SetUpPool(100);
  StaticPolicy policy({8, 100}, /*batch_size=*/3, /*timeout_ms=*/500);
  Add(4, 2);
  Add(4, 2);
  EXPECT_TRUE(policy.Plan(*pool_, now_).empty());
  ASSERT_TRUE(policy.NextWakeup(*pool_).has_value());
  Add(4, 2);
  EXPECT_EQ(policy.Plan(*pool_, now_).sequences.size(), 3u);

  SetUpPool(100);
  StaticPolicy timed({8, 100}, 3, 500);
  Add(4, 2);
  EXPECT_TRUE(timed.Plan(*pool_, now_).empty());
  EXPECT_EQ(timed.Plan(*pool_, now_ + 600ms).sequences.size(), 1u);
}

TEST_F(PolicyTest, StaticNeverAdmitsMidBatchAndKeepsFinishedMembersAsPadding) {
  SetUpPool(100);
  const PolicyLimits limits{8, 100};
  StaticPolicy policy(limits, 2, 0);
  Request* short_one = Add(4, 1);
  Request* long_one = Add(4, 5);
  StepPlan plan = policy.Plan(*pool_, now_);
  ASSERT_EQ(plan.sequences.size(), 2u);
  Run(plan, policy);
  EXPECT_TRUE(short_one->done);
  EXPECT_TRUE(policy.KeepAfterDone(short_one));
  Request* late = Add(4, 1);
  int wasted = 0;
  while (!long_one->done) {
    plan = policy.Plan(*pool_, now_);
    for (const ScheduledSequence& s : plan.sequences) EXPECT_NE(s.request, late);
    EXPECT_EQ(plan.batch_slots, 2);
    wasted += plan.wasted_slots;
    Run(plan, policy);
  }
  EXPECT_EQ(wasted, 4);  // The short member held its slot for 4 more steps.
  plan = policy.Plan(*pool_, now_);
  EXPECT_EQ(plan.released.size(), 2u);  // The batch ends; the late request starts.
  ASSERT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(plan.sequences[0].request, late);
  Run(plan, policy);
  RunToEnd(policy, limits);
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
}

TEST_F(PolicyTest, DynamicFormsABatchAfterTheWindowUpToTheCap) {
  SetUpPool(100);
  const PolicyLimits limits{2, 100};
  DynamicPolicy policy(limits, /*window_ms=*/10);
  const Clock::time_point first = now_;
  Add(4, 1);
  EXPECT_TRUE(policy.Plan(*pool_, now_).empty());
  EXPECT_EQ(*policy.NextWakeup(*pool_), first + 10ms);
  Add(4, 1);  // Reaches the cap: no need to wait out the window.
  Add(4, 1);
  const StepPlan plan = policy.Plan(*pool_, now_);
  EXPECT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(pool_->waiting().size(), 1u);
  RunToEnd(policy, limits);
  EXPECT_EQ(blocks_->num_used_blocks(), 0);
}

TEST_F(PolicyTest, RunToCompletionPadsEveryMemberToTheLongestGeneration) {
  SetUpPool(20, 4);
  StaticPolicy policy({8, 100}, 2, 0);
  Add(4, 4);   // Alone it would need 2 blocks...
  Add(4, 24);  // ...but the batch runs 24 steps, so each member reserves 7.
  const StepPlan plan = policy.Plan(*pool_, now_);
  EXPECT_EQ(plan.sequences.size(), 2u);
  EXPECT_EQ(blocks_->num_used_blocks(), 14);
}

TEST_F(PolicyTest, RunToCompletionStillFormsABatchThatCannotBePadded) {
  SetUpPool(8, 4);
  StaticPolicy policy({8, 100}, 2, 0);
  Add(4, 12);  // Padded to 4 + 30 tokens it would need 9 blocks; unpadded 4 fit.
  Add(4, 30);  // Needs 9 blocks whatever happens: waits for the next batch.
  const StepPlan plan = policy.Plan(*pool_, now_);
  EXPECT_EQ(plan.sequences.size(), 1u);
  EXPECT_EQ(blocks_->num_used_blocks(), 4);
}

// Prompt positions a plan has the workers score (requests with prompt_logprobs).
int ScoredPositions(const StepPlan& plan) {
  int scored = 0;
  for (const ScheduledSequence& s : plan.sequences) {
    const Request& r = *s.request;
    if (r.prompt_logprobs < 0) continue;
    scored += std::max(
        0, std::min(r.num_computed + s.num_tokens, r.num_prompt_tokens - 1) - r.num_computed);
  }
  return scored;
}

TEST_F(PolicyTest, ScoredPromptsShareTheStepsScoringBudget) {
  PolicyLimits limits{8, 100};
  limits.max_scored_tokens = 10;
  ContinuousPolicy continuous(limits);
  StaticPolicy batched(limits, 3, 0);
  for (BatchPolicy* policy :
       {static_cast<BatchPolicy*>(&continuous), static_cast<BatchPolicy*>(&batched)}) {
    SetUpPool(100);
    Request* a = Add(25, 2);
    a->prompt_logprobs = 0;
    Request* b = Add(20, 2);  // Scores nothing: only the token budget holds it.
    Request* c = Add(7, 2);
    c->prompt_logprobs = 1;
    StepPlan plan = policy->Plan(*pool_, now_);
    ASSERT_EQ(plan.sequences.size(), 2u) << policy->name();
    EXPECT_EQ(plan.sequences[0].num_tokens, 10);  // a: the whole budget...
    EXPECT_EQ(plan.sequences[1].request, b);      // ...c waits, b does not.
    EXPECT_EQ(plan.sequences[1].num_tokens, 20);
    int steps = 0;
    while (pool_->size() > 0 && ++steps < 100) {
      EXPECT_LE(ScoredPositions(plan), 10) << policy->name();
      EXPECT_LE(plan.num_tokens(), limits.max_step_tokens);
      Run(plan, *policy);
      now_ += 1s;
      plan = policy->Plan(*pool_, now_);
    }
    EXPECT_EQ(pool_->size(), 0u) << policy->name();
    // (A finished member of a static batch goes on as padding until the batch ends.)
    for (const Request* r : {a, b, c}) EXPECT_TRUE(r->done) << policy->name();
  }
}

TEST(ScoredTokensForTest, KeepsAStepsScoredLogitsUnder256MiB) {
  EXPECT_EQ(ScoredTokensFor(8192), 8192);    // 32 KiB a row.
  EXPECT_EQ(ScoredTokensFor(151936), 441);   // Qwen's vocabulary: 594 KiB a row.
  EXPECT_EQ(ScoredTokensFor(100000000), 1);  // Always at least one.
  EXPECT_GE(ScoredTokensFor(0), 1 << 30);    // Unknown: no limit.
}

TEST(MakePolicyTest, RejectsUnknownNamesAndBadLimits) {
  PolicyOptions options;
  options.name = "fifo";
  EXPECT_EQ(MakePolicy(options).status().code(), absl::StatusCode::kInvalidArgument);
  options.name = "static";
  options.batch_size = 0;
  EXPECT_EQ(MakePolicy(options).status().code(), absl::StatusCode::kInvalidArgument);
  for (const char* name : {"continuous", "static", "dynamic"}) {
    PolicyOptions ok;
    ok.name = name;
    auto policy = MakePolicy(ok);
    ASSERT_TRUE(policy.ok());
    EXPECT_STREQ((*policy)->name(), name);
  }
}

}  // namespace
}  // namespace conveyor::scheduler
