// The real Engine loop over the scripted executor (tests/support/scripted_executor.h)
// instead of a model: the steps it sends, the order it streams tokens in, how a failed
// step ends the running requests and resets the workers, cancellation and preemption.
// Each test runs with one step in flight and with two (the next step sent before the
// last one's answer). The end-to-end checks with the model are
// tests/scheduler/engine_test.cc.
#include "scheduler/engine.h"

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/request_builder.h"
#include "tests/support/recording_sink.h"
#include "tests/support/scripted_executor.h"
#include "tests/support/test_tokenizer.h"

namespace conveyor::scheduler {
namespace {

using namespace std::chrono_literals;
using ::conveyor::testing::ByteToken;
using ::conveyor::testing::RecordingSink;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int kBlockSize = 4;

// The parameter: Engine::Options::max_steps_in_flight.
class EngineLoopTest : public ::testing::TestWithParam<int> {
 protected:
  static void SetUpTestSuite() { tokenizer_ = testing::TrainTestTokenizer(); }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }
  void TearDown() override {
    engine_.reset();  // Joins the loop before the executor goes.
    EXPECT_THAT(executor_.violations(), IsEmpty()) << "the engine sent a step a worker rejects";
  }

  // An engine (not started) under the continuous policy.
  void MakeEngine(int num_blocks, int max_num_seqs = 8) {
    PolicyOptions policy;
    policy.limits = {max_num_seqs, /*max_step_tokens=*/64};
    Engine::Options options;
    options.max_steps_in_flight = GetParam();
    options.num_kv_blocks = num_blocks;
    options.block_size = kBlockSize;
    limits_.vocab_size = tokenizer_->vocab_size();
    limits_.max_context_tokens = 4096;
    limits_.kv_capacity_tokens = num_blocks * kBlockSize;
    limits_.eos_token_ids = {testing::kTestEosId};
    limits_.bos_token_id = testing::kTestBosId;
    engine_ = std::make_unique<Engine>(options, *MakePolicy(policy), &executor_, tokenizer_.get(),
                                       nullptr);
  }

  // Submits a request over token ids; `id` gets its id (the sequence id on the workers).
  std::shared_ptr<RecordingSink> Submit(
      std::vector<int32_t> prompt, int max_new, uint64_t* id,
      const std::function<void(v1::GenerateRequest&)>& edit = {}) {
    v1::GenerateRequest proto;
    proto.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    proto.set_max_new_tokens(max_new);
    if (edit) edit(proto);
    auto built = BuildRequest(proto, limits_, *tokenizer_);
    EXPECT_TRUE(built.ok()) << built.status();
    auto sink = std::make_shared<RecordingSink>();
    (*built)->sink = sink;
    absl::StatusOr<uint64_t> submitted = engine_->Submit(std::move(*built));
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    *id = submitted.value_or(0);
    return sink;
  }

  // The n choices of one request over `prompt` (BuildChoices), submitted together.
  struct Choices {
    std::vector<uint64_t> ids;
    std::vector<std::shared_ptr<RecordingSink>> sinks;
  };
  Choices SubmitChoices(const std::vector<int32_t>& prompt, int n, int max_new,
                        const std::function<void(v1::GenerateRequest&)>& edit = {}) {
    v1::GenerateRequest proto;
    proto.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    proto.set_max_new_tokens(max_new);
    proto.set_n(n);
    if (edit) edit(proto);
    auto built = BuildChoices(proto, limits_, *tokenizer_);
    EXPECT_TRUE(built.ok()) << built.status();
    Choices choices;
    if (!built.ok()) return choices;
    for (std::unique_ptr<Request>& r : *built) {
      choices.sinks.push_back(std::make_shared<RecordingSink>());
      r->sink = choices.sinks.back();
    }
    absl::StatusOr<std::vector<uint64_t>> ids = engine_->SubmitChoices(*std::move(built));
    EXPECT_TRUE(ids.ok()) << ids.status();
    choices.ids = ids.value_or(std::vector<uint64_t>());
    return choices;
  }

  // Waits until the loop has published stats that satisfy `done`.
  bool WaitStats(const std::function<bool(const Engine::Stats&)>& done) {
    for (auto until = std::chrono::steady_clock::now() + 30s;
         std::chrono::steady_clock::now() < until; std::this_thread::sleep_for(1ms)) {
      if (done(engine_->stats())) return true;
    }
    return false;
  }

  static inline std::unique_ptr<Tokenizer> tokenizer_;
  testing::ScriptedExecutor executor_{kBlockSize};
  ServingLimits limits_;
  std::unique_ptr<Engine> engine_;
};

TEST_P(EngineLoopTest, TokensStreamInOrderAndTheLastMessageSaysWhy) {
  MakeEngine(64);
  uint64_t id = 0;
  auto sink = Submit({1, 40, 41, 42, 43}, 4, &id);
  const std::vector<int32_t> script = {ByteToken('a'), ByteToken('b'), ByteToken('c'),
                                       ByteToken('d')};
  executor_.ScriptTokens(id, script);
  engine_->Start();
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_TRUE(sink->status_.ok()) << sink->status_;
  EXPECT_THAT(sink->tokens_, ElementsAreArray(script));
  EXPECT_EQ(sink->text_, "abcd");
  EXPECT_EQ(sink->messages_, 4);  // One per token; the last also ends the answer.
  EXPECT_EQ(sink->last_.finish_reason(), v1::FINISH_REASON_LENGTH);
  EXPECT_EQ(sink->last_.usage().prompt_tokens(), 5);
  EXPECT_EQ(sink->last_.usage().generated_tokens(), 4);

  // The prompt once as a new sequence, then one token per step as a running one.
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  ASSERT_EQ(steps.size(), 4u);
  ASSERT_EQ(steps[0].new_sequences_size(), 1);
  EXPECT_THAT(steps[0].new_sequences(0).token_ids(), ElementsAre(1, 40, 41, 42, 43));
  EXPECT_EQ(steps[0].new_sequences(0).num_tokens(), 5);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].step_id(), i + 1);
    EXPECT_THAT(steps[i].new_sequences(), IsEmpty());
    ASSERT_EQ(steps[i].running_size(), 1);
    EXPECT_EQ(steps[i].running(0).num_tokens(), 1);
  }
}

TEST_P(EngineLoopTest, EosAndStopStringsEndTheStream) {
  MakeEngine(64);
  uint64_t eos_id = 0, stop_id = 0;
  auto by_eos = Submit({1, 40}, 10, &eos_id);
  auto by_stop = Submit({1, 50}, 10, &stop_id, [](v1::GenerateRequest& p) { p.add_stop("yz"); });
  executor_.ScriptTokens(eos_id, {ByteToken('o'), ByteToken('k'), testing::kTestEosId});
  executor_.ScriptTokens(stop_id, {ByteToken('x'), ByteToken('y'), ByteToken('z')});
  engine_->Start();
  ASSERT_TRUE(by_eos->WaitDone());
  ASSERT_TRUE(by_stop->WaitDone());
  EXPECT_EQ(by_eos->last_.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(by_eos->text_, "ok");
  EXPECT_EQ(by_eos->tokens_.size(), 3u);  // EOS is streamed as a token, not as text.
  EXPECT_EQ(by_stop->last_.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(by_stop->text_, "x");
}

TEST_P(EngineLoopTest, AFailedStepEndsTheRunningRequestsAndTheNextStepResetsTheWorkers) {
  MakeEngine(64, /*max_num_seqs=*/1);  // `second` waits while `first` runs.
  uint64_t first_id = 0, second_id = 0;
  auto first = Submit({1, 40, 41}, 100, &first_id);
  auto second = Submit({1, 50, 51}, 3, &second_id);
  executor_.FailCall(3, absl::UnavailableError("worker rank 1 is gone"));
  engine_->Start();

  ASSERT_TRUE(first->WaitDone());
  EXPECT_EQ(first->status_.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(first->status_.message()),
              HasSubstr("the model workers failed: worker rank 1 is gone"));
  EXPECT_EQ(first->tokens_.size(), 2u);  // From the two steps that ran.
  ASSERT_TRUE(second->WaitDone());
  EXPECT_TRUE(second->status_.ok()) << second->status_;
  EXPECT_EQ(second->tokens_.size(), 3u);

  // With two in flight, step 4 was sent on step 3's back and the executor refused it
  // (ABORTED) as a worker does; it changed nothing.
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  const size_t reset_at = GetParam() == 1 ? 3 : 4;
  ASSERT_GE(steps.size(), reset_at + 2);
  EXPECT_FALSE(steps[2].reset());
  if (GetParam() == 2) {
    EXPECT_FALSE(steps[3].reset());
    EXPECT_EQ(steps[3].previous_step_id(), steps[2].step_id());
  }
  EXPECT_TRUE(steps[reset_at].reset());  // The workers start from a clean slate...
  EXPECT_EQ(steps[reset_at].previous_step_id(), 0u);
  EXPECT_THAT(steps[reset_at].dropped_seq_ids(), IsEmpty());
  EXPECT_THAT(steps[reset_at].running(), IsEmpty());
  ASSERT_EQ(steps[reset_at].new_sequences_size(), 1);  // ...with the request that waited.
  EXPECT_EQ(steps[reset_at].new_sequences(0).seq_id(), second_id);
  EXPECT_FALSE(steps[reset_at + 1].reset());
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.finished == 2; }));
}

TEST_P(EngineLoopTest, AStepTheWorkersRejectIsAnInternalErrorForTheClient) {
  MakeEngine(64);
  uint64_t id = 0;
  auto sink = Submit({1, 40, 41}, 100, &id);
  executor_.FailCall(2, absl::InvalidArgumentError("sequence 1: too few blocks"));
  engine_->Start();
  ASSERT_TRUE(sink->WaitDone());
  // The client's request was fine; the scheduler's step was not.
  EXPECT_EQ(sink->status_.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(sink->status_.message()), HasSubstr("too few blocks"));
}

TEST_P(EngineLoopTest, CancellingFreesTheBlocksAndDropsTheSequence) {
  MakeEngine(64);
  executor_.set_step_delay(1ms);  // Time to cancel while it runs.
  uint64_t id = 0;
  auto sink = Submit({1, 40, 41}, 200, &id);
  engine_->Start();
  ASSERT_TRUE(sink->WaitMessages(3));
  engine_->Cancel(id);
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->status_.code(), absl::StatusCode::kCancelled);
  EXPECT_LT(sink->tokens_.size(), 200u);
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 0; }));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
  EXPECT_EQ(engine_->num_live_requests(), 0);

  // The next step tells the workers to forget the cancelled sequence.
  const int calls = executor_.num_calls();
  uint64_t next_id = 0;
  auto next = Submit({1, 50}, 1, &next_id);
  ASSERT_TRUE(next->WaitDone());
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  ASSERT_GT(steps.size(), static_cast<size_t>(calls));
  EXPECT_THAT(steps[calls].dropped_seq_ids(), ElementsAre(id));
  EXPECT_EQ(steps[calls].new_sequences(0).seq_id(), next_id);
}

TEST_P(EngineLoopTest, APreemptedRequestIsResentWithItsGeneratedTokens) {
  // 6 blocks of 4: three 8-token prompts fill them, so the first decode preempts the
  // newest request, which comes back later with its prompt and its first token.
  MakeEngine(6);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<uint64_t> ids(3);
  for (int i = 0; i < 3; ++i) {
    sinks.push_back(Submit({1, 40, 41, 42, 43, 44, 45, static_cast<int32_t>(50 + i)}, 4, &ids[i]));
    const char first = static_cast<char>('a' + 4 * i);  // Each request its own letters.
    executor_.ScriptTokens(ids[i], {ByteToken(first), ByteToken(first + 1), ByteToken(first + 2),
                                    ByteToken(first + 3)});
  }
  engine_->Start();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(sinks[i]->WaitDone());
    EXPECT_TRUE(sinks[i]->status_.ok()) << sinks[i]->status_;
    std::string expected;
    for (int k = 0; k < 4; ++k) expected += static_cast<char>('a' + 4 * i + k);
    EXPECT_EQ(sinks[i]->text_, expected);
  }
  EXPECT_GT(engine_->stats().preemptions, 0u);

  // The newest request is dropped, then sent again with its prompt and the token it had
  // streamed.
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  int dropped_at = -1, resent_at = -1;
  for (int i = 0; i < static_cast<int>(steps.size()) && resent_at < 0; ++i) {
    for (uint64_t dropped : steps[i].dropped_seq_ids()) {
      if (dropped == ids[2] && dropped_at < 0) dropped_at = i;
    }
    for (const worker::v1::NewSequence& seq : steps[i].new_sequences()) {
      if (seq.seq_id() != ids[2] || i == 0) continue;
      resent_at = i;
      EXPECT_EQ(seq.token_ids_size(), 9);
      EXPECT_EQ(seq.token_ids(8), ByteToken('i'));
      EXPECT_EQ(seq.num_output_tokens(), 1);
    }
  }
  EXPECT_GT(dropped_at, 0);
  EXPECT_GT(resent_at, dropped_at);
}

TEST_P(EngineLoopTest, EachStepNamesTheStepItWasBuiltOn) {
  MakeEngine(64);
  uint64_t id = 0;
  auto sink = Submit({1, 40, 41}, 5, &id);
  engine_->Start();
  ASSERT_TRUE(sink->WaitDone());
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  ASSERT_EQ(steps.size(), 5u);  // The last token ends it by length: no sixth step.
  EXPECT_EQ(steps[0].previous_step_id(), 0u);
  for (size_t i = 1; i < steps.size(); ++i) {
    EXPECT_EQ(steps[i].previous_step_id(), steps[i - 1].step_id());
  }
}

TEST_P(EngineLoopTest, ARequestThatStopsIsComputedOnceMoreOnlyWithTwoStepsInFlight) {
  MakeEngine(64);
  uint64_t id = 0;
  auto sink = Submit({1, 40, 41}, 10, &id);
  executor_.ScriptTokens(id, {ByteToken('o'), ByteToken('k'), testing::kTestEosId});
  engine_->Start();
  ASSERT_TRUE(sink->WaitDone());
  EXPECT_EQ(sink->last_.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(sink->text_, "ok");
  EXPECT_EQ(sink->last_.usage().generated_tokens(), 3);

  // Sent before EOS was known, a fourth step computes the request once more; its token
  // is dropped, and the next step tells the workers to forget the sequence.
  const int extra = GetParam() - 1;
  EXPECT_TRUE(WaitStats([&](const Engine::Stats& s) { return s.steps == 3u + extra; }));
  EXPECT_EQ(engine_->stats().discarded_tokens, static_cast<uint64_t>(extra));
  uint64_t next_id = 0;
  auto next = Submit({1, 50}, 1, &next_id);
  ASSERT_TRUE(next->WaitDone());
  const std::vector<worker::v1::StepRequest> steps = executor_.requests();
  ASSERT_EQ(steps.size(), 4u + extra);
  EXPECT_THAT(steps[3 + extra].dropped_seq_ids(), ElementsAre(id));
}

TEST_P(EngineLoopTest, CancellingWhileTwoStepsRunLosesNothingElse) {
  // Two requests; one is cancelled at a random point while steps run, the other streams
  // every token of its script in order.
  MakeEngine(64);
  executor_.set_step_delay(200us);
  uint64_t kept_id = 0, cancelled_id = 0;
  auto kept = Submit({1, 40, 41}, 30, &kept_id);
  auto cancelled = Submit({1, 50, 51}, 200, &cancelled_id);
  std::vector<int32_t> script(30);
  for (int i = 0; i < 30; ++i) script[i] = ByteToken(static_cast<char>('a' + i % 26));
  executor_.ScriptTokens(kept_id, script);
  engine_->Start();
  ASSERT_TRUE(cancelled->WaitMessages(7));
  engine_->Cancel(cancelled_id);
  ASSERT_TRUE(cancelled->WaitDone());
  EXPECT_EQ(cancelled->status_.code(), absl::StatusCode::kCancelled);
  ASSERT_TRUE(kept->WaitDone());
  EXPECT_TRUE(kept->status_.ok()) << kept->status_;
  EXPECT_THAT(kept->tokens_, ElementsAreArray(script));
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 0; }));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
}

const std::vector<int32_t> kTenTokens = {1, 40, 41, 42, 43, 44, 45, 46, 47, 48};  // 2.5 blocks.

TEST_P(EngineLoopTest, ChoicesShareThePromptsFullBlocksAndSampleApart) {
  MakeEngine(64);
  Choices choices =
      SubmitChoices(kTenTokens, 4, 3, [](v1::GenerateRequest& r) { r.set_seed(100); });
  ASSERT_EQ(choices.ids.size(), 4u);
  std::vector<std::vector<int32_t>> scripts;
  for (int i = 0; i < 4; ++i) {
    scripts.push_back({ByteToken('a' + i), ByteToken('k' + i), ByteToken('u' + i)});
    executor_.ScriptTokens(choices.ids[i], scripts.back());
  }
  engine_->Start();
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(choices.sinks[i]->WaitDone());
    EXPECT_TRUE(choices.sinks[i]->status_.ok()) << choices.sinks[i]->status_;
    EXPECT_THAT(choices.sinks[i]->tokens_, ElementsAreArray(scripts[i])) << "choice " << i;
  }

  // The first choice computes the whole prompt; the others start from its two full
  // blocks and compute the rest (the prompt's partial block is each one's own).
  std::map<uint64_t, worker::v1::NewSequence> started;
  for (const worker::v1::StepRequest& step : executor_.requests()) {
    for (const worker::v1::NewSequence& s : step.new_sequences()) started[s.seq_id()] = s;
  }
  ASSERT_EQ(started.size(), 4u);
  const worker::v1::NewSequence& leader = started[choices.ids[0]];
  EXPECT_EQ(leader.num_cached_tokens(), 0);
  std::set<int32_t> own_blocks;
  for (int i = 0; i < 4; ++i) {
    const worker::v1::NewSequence& s = started[choices.ids[i]];
    EXPECT_THAT(s.token_ids(), ElementsAreArray(kTenTokens));
    EXPECT_EQ(s.sampling().seed(), 100u + i);  // Choice i samples with seed + i.
    ASSERT_GE(s.block_ids_size(), 3);
    if (i > 0) {
      EXPECT_EQ(s.num_cached_tokens(), 8) << "choice " << i;
      EXPECT_EQ(s.block_ids(0), leader.block_ids(0));
      EXPECT_EQ(s.block_ids(1), leader.block_ids(1));
    }
    EXPECT_TRUE(own_blocks.insert(s.block_ids(2)).second) << "choice " << i << " shares block 2";
  }
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 0; }));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
}

TEST_P(EngineLoopTest, ChoicesWhoseFirstIsCancelledComputeThePromptThemselves) {
  MakeEngine(64);
  Choices choices = SubmitChoices(kTenTokens, 3, 2);
  ASSERT_EQ(choices.ids.size(), 3u);
  engine_->Cancel(choices.ids[0]);  // Before the loop runs: the others must not wait for it.
  engine_->Start();
  ASSERT_TRUE(choices.sinks[0]->WaitDone());
  EXPECT_EQ(choices.sinks[0]->status_.code(), absl::StatusCode::kCancelled);
  for (int i = 1; i < 3; ++i) {
    ASSERT_TRUE(choices.sinks[i]->WaitDone());
    EXPECT_TRUE(choices.sinks[i]->status_.ok()) << choices.sinks[i]->status_;
    EXPECT_EQ(choices.sinks[i]->tokens_.size(), 2u);
  }
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 0; }));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
}

TEST_P(EngineLoopTest, CancellingEveryChoiceFreesEveryBlock) {
  MakeEngine(512);
  executor_.set_step_delay(2ms);
  Choices choices =
      SubmitChoices(kTenTokens, 5, 400, [](v1::GenerateRequest& r) { r.set_ignore_eos(true); });
  ASSERT_EQ(choices.ids.size(), 5u);
  engine_->Start();
  ASSERT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 5; }));
  for (uint64_t id : choices.ids) engine_->Cancel(id);
  for (const std::shared_ptr<RecordingSink>& sink : choices.sinks) {
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_EQ(sink->status_.code(), absl::StatusCode::kCancelled);
  }
  EXPECT_TRUE(WaitStats([](const Engine::Stats& s) { return s.running == 0; }));
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, EngineLoopTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 1 ? std::string("OneStepInFlight")
                                                  : std::string("TwoStepsInFlight");
                         });

}  // namespace
}  // namespace conveyor::scheduler
