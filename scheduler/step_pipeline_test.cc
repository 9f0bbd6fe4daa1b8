// StepPipeline alone: how launching a step advances its requests, the order answers come
// back in, and what a failure takes back. The executor here only records and answers as
// told (the engine's tests over the scripted worker are engine_loop_test.cc).
#include "scheduler/step_pipeline.h"

#include <memory>
#include <utility>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;

// A call the test answers when it wants to; remembers whether it was cancelled.
class HeldCall final : public StepCall {
 public:
  explicit HeldCall(uint64_t step_id, std::vector<uint64_t>* cancelled)
      : step_id_(step_id), cancelled_(cancelled) {}
  absl::StatusOr<worker::v1::StepResponse> Wait() override {
    if (cancelled_flag_) return absl::CancelledError("not wanted");
    worker::v1::StepResponse response;
    response.set_step_id(step_id_);
    return response;
  }
  void Cancel() override {
    cancelled_flag_ = true;
    cancelled_->push_back(step_id_);
  }

 private:
  const uint64_t step_id_;
  std::vector<uint64_t>* cancelled_;
  bool cancelled_flag_ = false;
};

class RecordingExecutor final : public StepExecutor {
 public:
  absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& request) override {
    blocking_calls.push_back(request.step_id());
    worker::v1::StepResponse response;
    response.set_step_id(request.step_id());
    return response;
  }
  std::unique_ptr<StepCall> StartStep(const worker::v1::StepRequest& request) override {
    started_calls.push_back(request.step_id());
    return std::make_unique<HeldCall>(request.step_id(), &cancelled);
  }
  std::vector<uint64_t> blocking_calls;
  std::vector<uint64_t> started_calls;
  std::vector<uint64_t> cancelled;
};

worker::v1::StepRequest StepNumber(uint64_t id) {
  worker::v1::StepRequest request;
  request.set_step_id(id);
  return request;
}

class StepPipelineTest : public ::testing::Test {
 protected:
  // A request of `prompt` tokens (none computed yet).
  Request* AddRequest(uint64_t id, int prompt) {
    auto r = std::make_unique<Request>();
    r->id = id;
    r->tokens.assign(prompt, 7);
    r->num_prompt_tokens = prompt;
    Request* raw = r.get();
    requests_[id] = std::move(r);
    return raw;
  }
  static StepPlan Plan(std::vector<ScheduledSequence> sequences) {
    StepPlan plan;
    plan.sequences = std::move(sequences);
    plan.batch_slots = static_cast<int>(plan.sequences.size());
    return plan;
  }

  RecordingExecutor executor_;
  RequestTable requests_;
};

TEST_F(StepPipelineTest, LaunchAdvancesRequestsAsIfTheStepHadRun) {
  StepPipeline pipeline(&executor_, 2);
  Request* chunked = AddRequest(1, 10);  // A prefill chunk: samples nothing yet.
  Request* whole = AddRequest(2, 3);     // Its whole prompt: samples one token.
  pipeline.Launch(Plan({{chunked, 4}, {whole, 3}}), StepNumber(1), Clock::now());

  EXPECT_EQ(chunked->num_computed, 4);
  EXPECT_EQ(chunked->num_pending_tokens, 0);
  EXPECT_EQ(chunked->num_tokens(), 10);
  EXPECT_EQ(whole->num_computed, 3);
  EXPECT_EQ(whole->num_pending_tokens, 1);
  EXPECT_THAT(whole->tokens, ElementsAre(7, 7, 7, kPendingToken));
  EXPECT_EQ(whole->num_known_tokens(), 3);

  // The next step decodes the pending token and finishes the chunked prompt.
  pipeline.Launch(Plan({{chunked, 6}, {whole, 1}}), StepNumber(2), Clock::now());
  EXPECT_TRUE(pipeline.full());
  EXPECT_EQ(chunked->num_pending_tokens, 1);
  EXPECT_EQ(whole->num_computed, 4);
  EXPECT_EQ(whole->num_pending_tokens, 2);
  EXPECT_THAT(executor_.started_calls, ElementsAre(1, 2));
  EXPECT_THAT(executor_.blocking_calls, ElementsAre());
}

TEST_F(StepPipelineTest, CountsPromptTokensOnlyUpToThePromptsEnd) {
  StepPipeline pipeline(&executor_, 2);
  Request* r = AddRequest(1, 5);
  r->num_computed = 3;  // Say, a cached prefix.
  pipeline.Launch(Plan({{r, 2}}), StepNumber(1), Clock::now());
  pipeline.Launch(Plan({{r, 1}}), StepNumber(2), Clock::now());  // A decode.
  StepPipeline::Answer first = pipeline.WaitOldest();
  StepPipeline::Answer second = pipeline.WaitOldest();
  EXPECT_EQ(first.step.prefill_tokens, 2);
  EXPECT_EQ(first.step.num_tokens, 2);
  EXPECT_EQ(second.step.prefill_tokens, 0);
  EXPECT_TRUE(pipeline.empty());
}

TEST_F(StepPipelineTest, OneInFlightUsesTheBlockingCall) {
  StepPipeline pipeline(&executor_, 1);
  Request* r = AddRequest(1, 2);
  pipeline.Launch(Plan({{r, 2}}), StepNumber(1), Clock::now());
  EXPECT_TRUE(pipeline.full());
  EXPECT_THAT(executor_.blocking_calls, ElementsAre(1));
  EXPECT_THAT(executor_.started_calls, ElementsAre());
  StepPipeline::Answer answer = pipeline.WaitOldest();
  ASSERT_TRUE(answer.response.ok());
  EXPECT_EQ(answer.response->step_id(), 1u);
}

TEST_F(StepPipelineTest, OtherDepthsCountAsTheNearerOfOneAndTwo) {
  EXPECT_EQ(StepPipeline(&executor_, 0).max_in_flight(), 1);
  EXPECT_EQ(StepPipeline(&executor_, 5).max_in_flight(), 2);
}

TEST_F(StepPipelineTest, AnswersComeOldestFirstWithTheirPlans) {
  StepPipeline pipeline(&executor_, 2);
  Request* a = AddRequest(1, 2);
  Request* b = AddRequest(2, 2);
  pipeline.Launch(Plan({{a, 2}}), StepNumber(1), Clock::now());
  pipeline.Launch(Plan({{b, 2}}), StepNumber(2), Clock::now());
  StepPipeline::Answer first = pipeline.WaitOldest();
  EXPECT_EQ(first.response->step_id(), 1u);
  ASSERT_EQ(first.step.sequences.size(), 1u);
  EXPECT_EQ(first.step.sequences[0].id, 1u);
  EXPECT_EQ(first.step.sequences[0].num_computed_after, 2);
  EXPECT_TRUE(first.step.Includes(1));
  EXPECT_FALSE(first.step.Includes(2));
  EXPECT_EQ(pipeline.WaitOldest().response->step_id(), 2u);
}

TEST_F(StepPipelineTest, AbandonTakesBackWhatTheFailedStepAndTheOnesAfterItAdvanced) {
  StepPipeline pipeline(&executor_, 2);
  Request* a = AddRequest(1, 4);
  Request* preempted = AddRequest(2, 4);
  pipeline.Launch(Plan({{a, 4}, {preempted, 4}}), StepNumber(1), Clock::now());
  pipeline.Launch(Plan({{a, 1}}), StepNumber(2), Clock::now());
  EXPECT_EQ(a->num_computed, 5);
  EXPECT_EQ(a->num_pending_tokens, 2);
  // Preempted while the steps ran: its blocks went, and with them what it had computed.
  ++preempted->residency;
  preempted->num_computed = 0;

  StepPipeline::Answer failed = pipeline.WaitOldest();
  pipeline.Abandon(failed.step, requests_);

  EXPECT_THAT(executor_.cancelled, ElementsAre(2));  // The step after the failed one.
  EXPECT_TRUE(pipeline.empty());
  EXPECT_EQ(a->num_computed, 0);
  EXPECT_EQ(a->num_pending_tokens, 0);
  EXPECT_THAT(a->tokens, ElementsAre(7, 7, 7, 7));
  EXPECT_EQ(preempted->num_computed, 0);  // Not taken back twice.
  EXPECT_EQ(preempted->num_pending_tokens, 0);
  EXPECT_EQ(preempted->num_tokens(), 4);
}

TEST_F(StepPipelineTest, AbandonSkipsRequestsThatEnded) {
  StepPipeline pipeline(&executor_, 2);
  Request* a = AddRequest(1, 2);
  AddRequest(2, 2);
  pipeline.Launch(Plan({{a, 2}, {requests_[2].get(), 2}}), StepNumber(1), Clock::now());
  requests_.erase(2);  // Cancelled and retired while the step ran.
  StepPipeline::Answer failed = pipeline.WaitOldest();
  pipeline.Abandon(failed.step, requests_);
  EXPECT_EQ(a->num_computed, 0);
  EXPECT_EQ(a->num_tokens(), 2);
}

TEST_F(StepPipelineTest, AbandonAllCancelsEveryStepInFlight) {
  StepPipeline pipeline(&executor_, 2);
  Request* a = AddRequest(1, 3);
  pipeline.Launch(Plan({{a, 3}}), StepNumber(1), Clock::now());
  pipeline.Launch(Plan({{a, 1}}), StepNumber(2), Clock::now());
  pipeline.AbandonAll(requests_);
  EXPECT_THAT(executor_.cancelled, ElementsAre(1, 2));
  EXPECT_TRUE(pipeline.empty());
  EXPECT_EQ(a->num_computed, 0);
  EXPECT_EQ(a->num_tokens(), 3);
}

}  // namespace
}  // namespace conveyor::scheduler
