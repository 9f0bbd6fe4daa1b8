// The scheduler loop with the real model underneath, in one process: the executor is
// the worker's StepRunner on the tiny test checkpoint (no sockets). Covers outputs under
// every policy against the same request run alone, preemption, prefix caching,
// cancellation, stop conditions, queue bounds, deadlines and worker failures.
#include "scheduler/engine.h"

#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "scheduler/request_builder.h"
#include "tests/support/recording_sink.h"
#include "tests/support/test_support.h"

namespace conveyor::scheduler {
namespace {

using namespace std::chrono_literals;
using ::conveyor::testing::LocalWorker;
using ::conveyor::testing::RecordingSink;
using ::conveyor::testing::TestModelDir;

constexpr int kBlockSize = 4;

// Runs steps on an in-process worker; can be told to fail.
class LocalExecutor final : public StepExecutor {
 public:
  explicit LocalExecutor(worker::StepRunner* engine) : engine_(engine) {}
  absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& r) override {
    if (fail_.load()) return absl::UnavailableError("worker rank 0 is gone");
    worker::v1::StepResponse response;
    absl::Status status = engine_->Step(r, &response);
    if (!status.ok()) return status;
    return response;
  }
  std::atomic<bool> fail_{false};

 private:
  worker::StepRunner* engine_;
};

class EngineTest : public ::testing::Test {
 protected:
  // A fresh worker + engine with `num_blocks` KV blocks.
  // PromptLogprobsScoreEachTokenAsDecodingWould, on a started engine.
  void CheckPromptLogprobs() {
    std::mt19937 rng(5);
    std::vector<int32_t> prompt(23);
    for (int32_t& t : prompt) t = 3 + rng() % (limits_.vocab_size - 3);
    constexpr int kTop = 3;
    auto scored = [&] {
      return Submit(prompt, 2, [&](v1::GenerateRequest& r) { r.set_prompt_logprobs(kTop); });
    };
    auto first = scored();
    ASSERT_TRUE(first->WaitDone());
    auto again = scored();  // Its prefix is cached now; a scored prompt is computed whole.
    std::vector<std::shared_ptr<RecordingSink>> references;
    for (size_t p = 1; p < prompt.size(); ++p) {
      references.push_back(Submit(std::vector<int32_t>(prompt.begin(), prompt.begin() + p), 1,
                                  [&](v1::GenerateRequest& r) {
                                    r.set_logprobs(kTop);
                                    (*r.mutable_logit_bias())[prompt[p]] = 100;
                                  }));
    }
    ASSERT_TRUE(again->WaitDone());
    for (const auto& sink : {first, again}) {
      ASSERT_TRUE(sink->status_.ok()) << sink->status_;
      const v1::GenerateResponse& m = sink->first_;
      ASSERT_EQ(m.prompt_logprobs_size(), static_cast<int>(prompt.size()));
      EXPECT_EQ(m.prompt_logprobs(0).token().token_id(), prompt[0]);
      EXPECT_EQ(m.prompt_logprobs(0).top_size(), 0);
      EXPECT_EQ(sink->last_.prompt_logprobs_size(), 0);  // The first message only.
    }
    for (size_t p = 1; p < prompt.size(); ++p) {
      SCOPED_TRACE(::testing::Message() << "prompt token " << p);
      ASSERT_TRUE(references[p - 1]->WaitDone());
      const v1::TokenLogprobs& want = references[p - 1]->first_.logprobs(0);
      ASSERT_EQ(want.token().token_id(), prompt[p]);
      for (const auto& sink : {first, again}) {
        const v1::TokenLogprobs& got = sink->first_.prompt_logprobs(p);
        EXPECT_EQ(got.token().token_id(), prompt[p]);
        EXPECT_NEAR(got.token().logprob(), want.token().logprob(), 1e-4);
        ASSERT_EQ(got.top_size(), kTop);
        for (int k = 0; k < kTop; ++k) {
          EXPECT_EQ(got.top(k).token_id(), want.top(k).token_id());
          EXPECT_NEAR(got.top(k).logprob(), want.top(k).logprob(), 1e-4);
        }
      }
    }
  }

  void Start(const std::string& policy, int num_blocks, int max_num_seqs = 16,
             int max_step_tokens = 64, int max_queue = 1024, int max_steps_in_flight = 2,
             const Engine::Options::Speculative& speculative = {}) {
    engine_.reset();
    worker_ = LocalWorker::Create(TestModelDir("llama3_gqa"), 2, num_blocks, kBlockSize);
    ASSERT_NE(worker_, nullptr);
    if (speculative.method == "draft") worker_->AttachDraft(speculative.model);
    executor_ = std::make_unique<LocalExecutor>(worker_->engine.get());
    auto tokenizer = Tokenizer::Load(TestModelDir("llama3_gqa"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
    const ModelConfig& c = worker_->model->config();
    limits_.vocab_size = c.vocab_size;
    limits_.max_context_tokens = c.max_context_tokens;
    limits_.kv_capacity_tokens = num_blocks * kBlockSize;
    limits_.eos_token_ids = c.eos_token_ids;
    limits_.bos_token_id = c.bos_token_id;
    PolicyOptions options;
    options.name = policy;
    options.limits = {max_num_seqs, max_step_tokens};
    options.limits.max_scored_tokens = max_scored_tokens_;
    options.batch_size = 4;
    options.batch_timeout_ms = 5;
    options.batch_window_ms = 2;
    Engine::Options engine_options;
    engine_options.num_kv_blocks = num_blocks;
    engine_options.block_size = kBlockSize;
    engine_options.max_queue = max_queue;
    engine_options.max_steps_in_flight = max_steps_in_flight;
    engine_options.max_context_tokens = c.max_context_tokens;
    engine_options.speculative = speculative;
    engine_options.speculative.max_step_tokens = max_step_tokens;
    engine_ = std::make_unique<Engine>(engine_options, *MakePolicy(options), executor_.get(),
                                       tokenizer_.get(), nullptr);
  }

  // Builds and submits a greedy request over token ids; returns its sink.
  std::shared_ptr<RecordingSink> Submit(
      std::vector<int32_t> prompt, int max_new,
      const std::function<void(v1::GenerateRequest&)>& edit = {}) {
    v1::GenerateRequest proto;
    proto.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    proto.set_max_new_tokens(max_new);
    proto.set_temperature(0);
    proto.set_ignore_eos(true);
    if (edit) edit(proto);
    auto built = BuildRequest(proto, limits_, *tokenizer_);
    EXPECT_TRUE(built.ok()) << built.status();
    auto sink = std::make_shared<RecordingSink>();
    (*built)->sink = sink;
    last_id_ = engine_->Submit(std::move(*built));
    EXPECT_TRUE(last_id_.ok()) << last_id_.status();
    return sink;
  }

  // Requests with prompts of mixed lengths (some sharing nothing, ids 3..vocab).
  std::vector<std::pair<std::vector<int32_t>, int>> MixedRequests(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::pair<std::vector<int32_t>, int>> out;
    for (int i = 0; i < n; ++i) {
      std::vector<int32_t> prompt(1 + rng() % 30);
      for (int32_t& t : prompt) t = 3 + rng() % (limits_.vocab_size - 3);
      out.emplace_back(prompt, 1 + rng() % 20);
    }
    return out;
  }

  // The greedy tokens of each request when run alone on a fresh engine.
  std::vector<std::vector<int>> RunAlone(
      const std::vector<std::pair<std::vector<int32_t>, int>>& requests) {
    std::vector<std::vector<int>> out;
    for (const auto& [prompt, max_new] : requests) {
      Start("continuous", 256);
      engine_->Start();
      auto sink = Submit(prompt, max_new);
      EXPECT_TRUE(sink->WaitDone());
      out.push_back(sink->tokens_);
    }
    return out;
  }

  // What a client saw of one request: its tokens, text and final message (timings cleared:
  // they differ between runs, the rest may not).
  struct Stream {
    std::vector<int> tokens;
    std::string text;
    std::string last;  // The final message, serialized.
  };
  using Edit = std::function<void(v1::GenerateRequest&)>;

  // Starts the engine made by Start, submits every request (request i edited by
  // edit(i)), and returns their streams once all ended and every block is free again;
  // the engine's stats then.
  std::vector<Stream> RunToEnd(const std::vector<std::pair<std::vector<int32_t>, int>>& requests,
                               const std::function<Edit(size_t)>& edit, Engine::Stats* stats) {
    engine_->Start();
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    for (size_t i = 0; i < requests.size(); ++i) {
      sinks.push_back(Submit(requests[i].first, requests[i].second, edit(i)));
    }
    std::vector<Stream> out;
    for (auto& sink : sinks) {
      EXPECT_TRUE(sink->WaitDone());
      EXPECT_TRUE(sink->status_.ok()) << sink->status_;
      v1::GenerateResponse last = sink->last_;
      last.mutable_usage()->clear_queue_time_ms();
      last.mutable_usage()->clear_time_to_first_token_ms();
      last.mutable_usage()->clear_e2e_latency_ms();
      last.mutable_usage()->clear_preemptions();
      out.push_back({sink->tokens_, sink->text_, last.SerializeAsString()});
    }
    // Every block comes back (a run-to-completion batch releases its members at the
    // iteration after the last one finished).
    for (int i = 0; i < 5000 && engine_->stats().kv_blocks_used != 0; ++i) {
      std::this_thread::sleep_for(1ms);
    }
    engine_->Stop(absl::OkStatus());
    *stats = engine_->stats();
    EXPECT_EQ(stats->kv_blocks_used, 0);
    return out;
  }

  std::unique_ptr<LocalWorker> worker_;
  std::unique_ptr<LocalExecutor> executor_;
  std::unique_ptr<Tokenizer> tokenizer_;
  ServingLimits limits_;
  int max_scored_tokens_ = 1 << 30;  // The policy's PolicyLimits::max_scored_tokens.
  std::unique_ptr<Engine> engine_;   // Destroyed first: it uses everything above.
  absl::StatusOr<uint64_t> last_id_;
};

// Every policy, a small KV cache that forces preemption, and concurrency all give the
// tokens the request gives alone.
TEST_F(EngineTest, EveryPolicyGivesTheSameGreedyTokensAsAlone) {
  Start("continuous", 256);
  const auto requests = MixedRequests(12, 1);
  const std::vector<std::vector<int>> alone = RunAlone(requests);
  struct Case {
    const char* policy;
    int num_blocks;
  };
  for (const Case& c : {Case{"continuous", 256}, Case{"static", 256}, Case{"dynamic", 256},
                        Case{"continuous", 24}}) {
    SCOPED_TRACE(::testing::Message() << c.policy << " with " << c.num_blocks << " blocks");
    Start(c.policy, c.num_blocks);
    engine_->Start();
    std::vector<std::shared_ptr<RecordingSink>> sinks;
    sinks.reserve(requests.size());
    for (const auto& [prompt, max_new] : requests) sinks.push_back(Submit(prompt, max_new));
    for (size_t i = 0; i < sinks.size(); ++i) {
      ASSERT_TRUE(sinks[i]->WaitDone());
      EXPECT_TRUE(sinks[i]->status_.ok()) << sinks[i]->status_;
      EXPECT_EQ(sinks[i]->tokens_, alone[i]) << "request " << i;
      EXPECT_EQ(sinks[i]->last_.finish_reason(), v1::FINISH_REASON_LENGTH);
    }
    const Engine::Stats stats = engine_->stats();
    if (c.num_blocks == 24) {
      EXPECT_GT(stats.preemptions, 0u) << "the small cache should force preemption";
    }
    if (std::string(c.policy) != "continuous") {
      EXPECT_GT(stats.wasted_slot_steps, 0u) << "run-to-completion batches hold finished slots";
    }
    engine_.reset();  // Joins the loop; then every block must be free.
  }
}

// Sending the next step before the last one's answer (the default) changes no stream:
// against one step in flight, every request gets the same tokens, text, logprobs and
// finish, under every policy and with a cache small enough to preempt; seeded sampling,
// and stop ids that end half the requests early (so steps compute requests that have
// already stopped).
TEST_F(EngineTest, TwoStepsInFlightStreamWhatOneDoes) {
  Start("continuous", 256);
  const auto requests = MixedRequests(16, 7);
  auto edit = [](size_t i, int32_t stop_id) {
    return [i, stop_id](v1::GenerateRequest& r) {
      r.set_temperature(0.8f);
      r.set_seed(100 + i);
      r.set_logprobs(static_cast<int>(i % 3));
      if (stop_id >= 0) r.add_stop_token_ids(stop_id);
    };
  };
  auto run = [&](const std::string& policy, int num_blocks, int in_flight,
                 const std::vector<int32_t>& stop_ids, Engine::Stats* stats) {
    Start(policy, num_blocks, 16, 64, 1024, in_flight);
    return RunToEnd(
        requests, [&](size_t i) { return edit(i, stop_ids[i]); }, stats);
  };
  // Half the requests stop at the token they sample halfway (learnt from a first run).
  Engine::Stats stats;
  const std::vector<Stream> free_run =
      run("continuous", 256, 1, std::vector<int32_t>(requests.size(), -1), &stats);
  std::vector<int32_t> stop_ids(requests.size(), -1);
  for (size_t i = 0; i < requests.size(); i += 2) {
    if (free_run[i].tokens.size() >= 3)
      stop_ids[i] = free_run[i].tokens[free_run[i].tokens.size() / 2];
  }
  uint64_t discarded = 0;
  for (const auto& [policy, blocks] : std::vector<std::pair<std::string, int>>{
           {"continuous", 256}, {"continuous", 24}, {"static", 256}, {"dynamic", 256}}) {
    SCOPED_TRACE(::testing::Message() << policy << " with " << blocks << " blocks");
    Engine::Stats one_stats, two_stats;
    const std::vector<Stream> one = run(policy, blocks, 1, stop_ids, &one_stats);
    const std::vector<Stream> two = run(policy, blocks, 2, stop_ids, &two_stats);
    for (size_t i = 0; i < requests.size(); ++i) {
      EXPECT_EQ(two[i].tokens, one[i].tokens) << "request " << i;
      EXPECT_EQ(two[i].text, one[i].text) << "request " << i;
      EXPECT_EQ(two[i].last, one[i].last) << "request " << i;
    }
    EXPECT_EQ(one_stats.discarded_tokens, 0u);
    EXPECT_EQ(two_stats.generated_tokens, one_stats.generated_tokens);
    if (blocks == 24) EXPECT_GT(two_stats.preemptions, 0u);
    discarded += two_stats.discarded_tokens;
  }
  EXPECT_GT(discarded, 0u) << "no step computed a request that had stopped";
}

// Speculative decoding (n-gram and suffix drafts) changes no stream: against decoding one
// token per step, every request gets the same tokens, text, logprobs and finish, under
// every policy and with a cache small enough to preempt; greedy and seeded sampling, stop
// ids that end requests mid-draft, and max_new_tokens that cut drafts short. Prompts
// repeat a phrase, so that drafts are proposed and some kept. (How many steps a run takes
// depends on when requests arrive, so that is not compared.)
TEST_F(EngineTest, SpeculationStreamsWhatDecodingDoes) {
  Start("continuous", 256);
  std::mt19937 rng(17);
  std::vector<std::pair<std::vector<int32_t>, int>> requests;
  for (int i = 0; i < 12; ++i) {
    std::vector<int32_t> phrase(2 + rng() % 5);
    for (int32_t& t : phrase) t = 3 + rng() % (limits_.vocab_size - 3);
    std::vector<int32_t> prompt;
    for (int r = 0; r < 3 + static_cast<int>(rng() % 3); ++r) {
      prompt.insert(prompt.end(), phrase.begin(), phrase.end());
    }
    requests.emplace_back(prompt, 4 + rng() % 60);
  }
  auto edit = [](size_t i, int32_t stop_id) {
    return [i, stop_id](v1::GenerateRequest& r) {
      if (i % 2 == 1) {
        r.set_temperature(0.7f);
        r.set_seed(300 + i);
      }
      r.set_logprobs(static_cast<int>(i % 3));
      if (stop_id >= 0) r.add_stop_token_ids(stop_id);
    };
  };
  Engine::Options::Speculative ngram;
  ngram.method = "ngram";
  ngram.num_tokens = 4;
  ngram.ngram = {1, 3};
  ngram.max_batch = 64;
  auto run = [&](const std::string& policy, int num_blocks,
                 const Engine::Options::Speculative& spec, const std::vector<int32_t>& stop_ids,
                 Engine::Stats* stats) {
    Start(policy, num_blocks, 16, 64, 1024, 1, spec);
    return RunToEnd(
        requests, [&](size_t i) { return edit(i, stop_ids[i]); }, stats);
  };
  Engine::Stats stats;
  const std::vector<Stream> free_run =
      run("continuous", 256, {}, std::vector<int32_t>(requests.size(), -1), &stats);
  std::vector<int32_t> stop_ids(requests.size(), -1);
  for (size_t i = 0; i < requests.size(); i += 3) {
    if (free_run[i].tokens.size() >= 3) {
      stop_ids[i] = free_run[i].tokens[free_run[i].tokens.size() / 2];
    }
  }
  Engine::Options::Speculative suffix = ngram;
  suffix.method = "suffix";
  // Draft models: another model of the same vocabulary (its proposals mostly wrong), and
  // the model itself (greedy proposals all right, sampled ones as the draws go).
  Engine::Options::Speculative draft_other = ngram;
  draft_other.method = "draft";
  draft_other.model = TestModelDir("qwen2_bias_f16");
  Engine::Options::Speculative draft_self = draft_other;
  draft_self.model = TestModelDir("llama3_gqa");
  std::map<std::string, std::pair<uint64_t, uint64_t>> drafted_kept;
  for (const auto& [policy, blocks] : std::vector<std::pair<std::string, int>>{
           {"continuous", 256}, {"continuous", 24}, {"static", 256}, {"dynamic", 256}}) {
    Engine::Stats off_stats;
    const std::vector<Stream> off = run(policy, blocks, {}, stop_ids, &off_stats);
    EXPECT_EQ(off_stats.draft_tokens, 0u);
    for (const Engine::Options::Speculative& spec : {ngram, suffix, draft_other, draft_self}) {
      SCOPED_TRACE(::testing::Message() << spec.method << " " << spec.model << ", " << policy
                                        << " with " << blocks << " blocks");
      Engine::Stats on_stats;
      const std::vector<Stream> on = run(policy, blocks, spec, stop_ids, &on_stats);
      for (size_t i = 0; i < requests.size(); ++i) {
        EXPECT_EQ(on[i].tokens, off[i].tokens) << "request " << i;
        EXPECT_EQ(on[i].text, off[i].text) << "request " << i;
        EXPECT_EQ(on[i].last, off[i].last) << "request " << i;
      }
      EXPECT_EQ(on_stats.generated_tokens, off_stats.generated_tokens);
      drafted_kept[spec.method].first += on_stats.draft_tokens;
      drafted_kept[spec.method].second += on_stats.accepted_draft_tokens;
    }
  }
  for (const auto& [method, counts] : drafted_kept) {
    const auto [drafted, kept] = counts;
    EXPECT_GT(kept, 0u) << method << ": " << drafted << " drafted";
    EXPECT_LT(kept, drafted) << method << ": every draft was kept, the rejection path untested";
  }
}

TEST_F(EngineTest, RepeatedPrefixIsServedFromTheCache) {
  Start("continuous", 256);
  engine_->Start();
  std::vector<int32_t> prompt(37);
  for (int i = 0; i < 37; ++i) prompt[i] = 3 + (i * 7) % 300;
  auto first = Submit(prompt, 8);
  ASSERT_TRUE(first->WaitDone());
  const uint64_t prefill_before = engine_->stats().prefill_tokens;
  auto second = Submit(prompt, 8);
  ASSERT_TRUE(second->WaitDone());
  EXPECT_EQ(second->tokens_, first->tokens_);
  EXPECT_EQ(first->last_.usage().cached_prompt_tokens(), 0);
  EXPECT_EQ(second->last_.usage().cached_prompt_tokens(), 36);  // 9 full blocks of 4.
  EXPECT_EQ(engine_->stats().prefill_tokens - prefill_before, 1u);
}

TEST_F(EngineTest, CancellingHalfTheRequestsFreesEveryBlock) {
  Start("continuous", 256);
  engine_->Start();
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  std::vector<uint64_t> ids;
  for (int i = 0; i < 8; ++i) {
    sinks.push_back(Submit({1, 5, 9, static_cast<int32_t>(10 + i)}, 200));
    ids.push_back(*last_id_);
  }
  for (auto& sink : sinks) {
    while (sink->messages() < 3) std::this_thread::sleep_for(1ms);
  }
  for (int i = 0; i < 8; i += 2) engine_->Cancel(ids[i]);
  for (int i = 0; i < 8; ++i) {
    ASSERT_TRUE(sinks[i]->WaitDone());
    if (i % 2 == 0) {
      EXPECT_EQ(sinks[i]->status_.code(), absl::StatusCode::kCancelled);
      EXPECT_LT(sinks[i]->tokens_.size(), 200u);
    } else {
      EXPECT_TRUE(sinks[i]->status_.ok());
      EXPECT_EQ(sinks[i]->tokens_.size(), 200u);
    }
  }
  // The stats are published by a later loop iteration: wait for it (under load, one
  // may take longer than any fixed sleep), then check.
  for (int i = 0;
       i < 5000 && (engine_->stats().kv_blocks_used != 0 || engine_->num_live_requests() != 0);
       ++i) {
    std::this_thread::sleep_for(1ms);
  }
  EXPECT_EQ(engine_->stats().kv_blocks_used, 0);
  EXPECT_EQ(engine_->num_live_requests(), 0);
}

TEST_F(EngineTest, StopsAtStopStringsStopTokensAndEos) {
  Start("continuous", 256);
  engine_->Start();
  // Learn what the model says, then stop on a piece of it.
  auto probe = Submit({1, 40, 41, 42}, 24);
  ASSERT_TRUE(probe->WaitDone());
  ASSERT_GE(probe->text_.size(), 6u);
  const std::string stop = probe->text_.substr(3, 2);
  auto stopped = Submit({1, 40, 41, 42}, 24, [&](v1::GenerateRequest& r) { r.add_stop(stop); });
  ASSERT_TRUE(stopped->WaitDone());
  EXPECT_EQ(stopped->last_.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(stopped->text_, probe->text_.substr(0, probe->text_.find(stop)));

  const int fifth = probe->tokens_[4];
  auto by_token =
      Submit({1, 40, 41, 42}, 24, [&](v1::GenerateRequest& r) { r.add_stop_token_ids(fifth); });
  ASSERT_TRUE(by_token->WaitDone());
  EXPECT_EQ(by_token->last_.finish_reason(), v1::FINISH_REASON_STOP);
  EXPECT_EQ(by_token->tokens_.back(), fifth);
  EXPECT_LE(by_token->tokens_.size(), 5u);

  limits_.eos_token_ids = {fifth};  // Pretend that token is the model's EOS.
  auto by_eos =
      Submit({1, 40, 41, 42}, 24, [&](v1::GenerateRequest& r) { r.set_ignore_eos(false); });
  ASSERT_TRUE(by_eos->WaitDone());
  EXPECT_EQ(by_eos->last_.finish_reason(), v1::FINISH_REASON_EOS);
  EXPECT_EQ(by_eos->last_.usage().generated_tokens(), static_cast<int>(by_eos->tokens_.size()));
}

// Token-id prompts may end inside a character and outputs may be stray bytes: every
// streamed text must still be well-formed UTF-8 (the sink checks each message).
TEST_F(EngineTest, StreamedTextIsAlwaysValidUtf8) {
  Start("continuous", 512);
  engine_->Start();
  std::mt19937 rng(9);
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  for (int i = 0; i < 40; ++i) {
    std::vector<int32_t> prompt(1 + rng() % 6);
    for (int32_t& t : prompt) t = 3 + rng() % 256;  // The byte-fallback pieces.
    sinks.push_back(Submit(prompt, 12, [&](v1::GenerateRequest& r) {
      r.set_temperature(1.5f);
      r.set_seed(i);
      r.set_logprobs(2);
    }));
  }
  for (auto& sink : sinks) {
    ASSERT_TRUE(sink->WaitDone());
    EXPECT_TRUE(sink->status_.ok());
  }
}

TEST_F(EngineTest, SeededSamplingRepeatsAndLogprobsArrive) {
  Start("continuous", 256);
  engine_->Start();
  auto sampled = [&](uint64_t seed) {
    return Submit({1, 17, 18}, 16, [&](v1::GenerateRequest& r) {
      r.set_temperature(0.9f);
      r.set_top_p(0.95f);
      r.set_seed(seed);
      r.set_logprobs(3);
    });
  };
  auto a = sampled(11), b = sampled(11), c = sampled(12);
  ASSERT_TRUE(a->WaitDone() && b->WaitDone() && c->WaitDone());
  EXPECT_EQ(a->tokens_, b->tokens_);
  EXPECT_NE(a->tokens_, c->tokens_);
  EXPECT_EQ(a->last_.logprobs_size(), 1);
  EXPECT_EQ(a->last_.logprobs(0).top_size(), 3);
}

// Each prompt token's score (prompt_logprobs, computed in chunks: of the step's token
// budget, or of its scoring budget) is the logprob decoding gives that token after the
// tokens before it: a request for the prefix, with the token forced by logit_bias (which
// leaves logprobs alone).
TEST_F(EngineTest, PromptLogprobsScoreEachTokenAsDecodingWould) {
  for (const auto& [max_step_tokens, max_scored_tokens] :
       {std::pair{8, 1 << 30}, std::pair{64, 5}}) {
    SCOPED_TRACE(::testing::Message() << "max_step_tokens " << max_step_tokens
                                      << ", max_scored_tokens " << max_scored_tokens);
    max_scored_tokens_ = max_scored_tokens;
    Start("continuous", 256, /*max_num_seqs=*/32, max_step_tokens);
    engine_->Start();
    CheckPromptLogprobs();
  }
}

// n choices share the prompt's blocks and sample apart: choice i is the request with seed
// + i alone, token for token, under every policy.
TEST_F(EngineTest, ChoicesAreWhatSeparateSeededRequestsGive) {
  std::mt19937 rng(9);
  std::vector<int32_t> prompt(37);
  for (const char* policy : {"continuous", "static"}) {
    SCOPED_TRACE(policy);
    Start(policy, 256);
    for (int32_t& t : prompt) t = 3 + rng() % (limits_.vocab_size - 3);
    engine_->Start();
    v1::GenerateRequest proto;
    proto.mutable_token_ids()->mutable_ids()->Add(prompt.begin(), prompt.end());
    proto.set_max_new_tokens(12);
    proto.set_temperature(1.0f);
    proto.set_seed(77);
    proto.set_ignore_eos(true);
    proto.set_n(4);
    auto built = BuildChoices(proto, limits_, *tokenizer_);
    ASSERT_TRUE(built.ok()) << built.status();
    std::vector<std::shared_ptr<RecordingSink>> choices;
    for (std::unique_ptr<Request>& r : *built) {
      choices.push_back(std::make_shared<RecordingSink>());
      r->sink = choices.back();
    }
    ASSERT_TRUE(engine_->SubmitChoices(*std::move(built)).ok());
    std::vector<std::shared_ptr<RecordingSink>> alone;
    alone.reserve(4);
    for (int i = 0; i < 4; ++i) {
      alone.push_back(Submit(prompt, 12, [&](v1::GenerateRequest& r) {
        r.set_temperature(1.0f);
        r.set_seed(77 + i);
      }));
    }
    std::set<std::vector<int>> distinct;
    for (int i = 0; i < 4; ++i) {
      ASSERT_TRUE(choices[i]->WaitDone() && alone[i]->WaitDone());
      EXPECT_TRUE(choices[i]->status_.ok()) << choices[i]->status_;
      EXPECT_EQ(choices[i]->tokens_, alone[i]->tokens_) << "choice " << i;
      distinct.insert(choices[i]->tokens_);
    }
    EXPECT_GT(distinct.size(), 1u);
    engine_->Stop(absl::OkStatus());
  }
}

TEST_F(EngineTest, FullQueueIsResourceExhaustedAndDrainIsUnavailable) {
  Start("continuous", 256, 16, 64, /*max_queue=*/2);  // Loop not started: nothing drains.
  Submit({1, 2, 3}, 4);
  Submit({1, 2, 3}, 4);
  v1::GenerateRequest proto;
  proto.mutable_token_ids()->add_ids(5);
  auto built = BuildRequest(proto, limits_, *tokenizer_);
  ASSERT_TRUE(built.ok());
  (*built)->sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(engine_->Submit(std::move(*built)).status().code(),
            absl::StatusCode::kResourceExhausted);
  engine_->StartDrain();
  built = BuildRequest(proto, limits_, *tokenizer_);
  (*built)->sink = std::make_shared<RecordingSink>();
  EXPECT_EQ(engine_->Submit(std::move(*built)).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(EngineTest, DeadlinesAndWorkerFailuresEndRequestsWithAStatus) {
  Start("continuous", 600);  // Room for a 2000-token generation.
  engine_->Start();
  v1::GenerateRequest proto;
  proto.mutable_token_ids()->add_ids(5);
  proto.set_max_new_tokens(2000);
  proto.set_ignore_eos(true);
  auto built = BuildRequest(proto, limits_, *tokenizer_);
  ASSERT_TRUE(built.ok());
  auto late = std::make_shared<RecordingSink>();
  (*built)->sink = late;
  (*built)->deadline = Clock::now() + 5ms;  // 2000 steps take far longer.
  ASSERT_TRUE(engine_->Submit(std::move(*built)).ok());
  ASSERT_TRUE(late->WaitDone());
  EXPECT_EQ(late->status_.code(), absl::StatusCode::kDeadlineExceeded);

  auto running = Submit({1, 2, 3}, 1000);
  while (running->messages() < 2) std::this_thread::sleep_for(1ms);
  executor_->fail_ = true;
  ASSERT_TRUE(running->WaitDone());
  EXPECT_EQ(running->status_.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(running->status_.message()), ::testing::HasSubstr("worker"));

  // Once the worker is back, the next request runs (the first step resets the worker).
  executor_->fail_ = false;
  auto after = Submit({1, 2, 3}, 5);
  ASSERT_TRUE(after->WaitDone());
  EXPECT_TRUE(after->status_.ok()) << after->status_;
  EXPECT_EQ(after->tokens_.size(), 5u);
}

TEST_F(EngineTest, StoppingEndsEveryLiveRequest) {
  Start("static", 256);
  engine_->Start();
  std::vector<std::shared_ptr<RecordingSink>> sinks;
  sinks.reserve(3);
  for (int i = 0; i < 3; ++i) sinks.push_back(Submit({1, 2, 3}, 1000));  // Batch not full.
  engine_->Stop(absl::UnavailableError("shutting down"));
  for (auto& sink : sinks) {
    ASSERT_TRUE(sink->WaitDone(1s));
    EXPECT_EQ(sink->status_.code(), absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace conveyor::scheduler
