// Speculative decoding on one rank (RunningSequence.draft_token_ids): whatever drafts a
// step carries (right, wrong, partly right, none), the tokens a sequence gets, and the
// logits behind each, are bit for bit those of decoding one token per step: greedy and
// seeded sampling with penalties, alone and next to other sequences, for each way the CPU
// backend stores weights. A draft the worker cannot verify is refused, changing nothing.
#include <functional>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 128;
constexpr int kNewTokens = 24;

// Every row a step samples from, per sequence, in order (drafts give several per step).
class AllLogits final : public worker::LogitsTap {
 public:
  void OnLogits(uint64_t, uint64_t seq_id, std::span<const float> logits) override {
    rows_[seq_id].emplace_back(logits.begin(), logits.end());
  }
  std::vector<std::vector<float>>& rows(uint64_t seq_id) { return rows_[seq_id]; }

 private:
  std::map<uint64_t, std::vector<std::vector<float>>> rows_;
};

struct Case {
  std::vector<int32_t> prompt;
  worker::v1::SamplingParams sampling;
};

std::vector<Case> MakeCases(int vocab) {
  std::mt19937 rng(11);
  std::vector<Case> cases;
  for (int len : {7, 21, 13}) {
    Case c;
    c.prompt.push_back(1);
    for (int i = 1; i < len; ++i) c.prompt.push_back(3 + rng() % (vocab - 3));
    cases.push_back(c);
  }
  cases[1].sampling.set_temperature(0.9f);
  cases[1].sampling.set_top_p(0.95f);
  cases[1].sampling.set_seed(5);
  cases[2].sampling.set_temperature(1.1f);
  cases[2].sampling.set_top_k(30);
  cases[2].sampling.set_repetition_penalty(1.2f);
  cases[2].sampling.set_frequency_penalty(0.3f);
  cases[2].sampling.set_num_logprobs(3);
  cases[2].sampling.set_seed(9);
  return cases;
}

struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
  std::vector<float> logprobs;
};

// Appends a step's answered tokens to their sequences' traces; returns how many each
// sequence got (beyond the first: drafts the worker kept).
std::map<uint64_t, int> Record(const worker::v1::StepResponse& response,
                               std::map<uint64_t, Trace>* traces) {
  std::map<uint64_t, int> answered;
  for (const worker::v1::SampledToken& t : response.tokens()) {
    ++answered[t.seq_id()];
    Trace& trace = (*traces)[t.seq_id()];
    trace.tokens.push_back(t.token_id());
    trace.logprobs.push_back(t.logprob());
  }
  return answered;
}

worker::v1::NewSequence* AddNew(worker::v1::StepRequest* step, uint64_t id, const Case& c,
                                int first_block) {
  auto* seq = step->add_new_sequences();
  seq->set_seq_id(id);
  seq->mutable_token_ids()->Add(c.prompt.begin(), c.prompt.end());
  seq->set_num_tokens(static_cast<int>(c.prompt.size()));
  *seq->mutable_sampling() = c.sampling;
  // Room for the prompt, the output and the longest draft.
  const int blocks = (static_cast<int>(c.prompt.size()) + kNewTokens + 8) / kBlockSize + 1;
  for (int b = 0; b < blocks; ++b) seq->add_block_ids(first_block + b);
  return seq;
}

// How drafts are made at each decode: from the reference tokens (right), random (wrong),
// or right then wrong.
enum class Drafts { kNone, kRight, kWrong, kMixed };

// The cases' sequences decoded together, kNewTokens each; `drafts` picks what each
// decode step proposes (against `reference`, the tokens of one token per step).
std::map<uint64_t, Trace> Decode(const std::string& model_dir, const std::vector<Case>& cases,
                                 kernels::CpuWeightDtype weights, Drafts drafts,
                                 const std::map<uint64_t, Trace>* reference, uint32_t seed,
                                 int* kept = nullptr) {
  auto w = LocalWorker::Create(model_dir, 2, kNumBlocks, kBlockSize, weights);
  AllLogits tap;
  w->engine->set_logits_tap(&tap);
  const int vocab = w->model->config().vocab_size;
  std::mt19937 rng(seed);
  std::map<uint64_t, Trace> traces;
  int kept_drafts = 0;
  worker::v1::StepRequest step;
  step.set_step_id(1);
  for (size_t i = 0; i < cases.size(); ++i) AddNew(&step, i + 1, cases[i], 40 * i);
  for (uint64_t step_id = 1;; ++step_id) {
    worker::v1::StepResponse response;
    const absl::Status status = w->engine->Step(step, &response);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) break;
    for (const auto& [id, count] : Record(response, &traces)) kept_drafts += count - 1;
    step.Clear();
    step.set_step_id(step_id + 1);
    step.set_previous_step_id(step_id);
    bool any = false;
    for (size_t i = 0; i < cases.size(); ++i) {
      const uint64_t id = i + 1;
      const int have = static_cast<int>(traces[id].tokens.size());
      if (have >= kNewTokens) continue;
      any = true;
      auto* running = step.add_running();
      running->set_seq_id(id);
      running->set_num_tokens(1);
      const int k = std::min<int>(1 + rng() % 5, kNewTokens - have - 1);
      // Sequence 2 never gets drafts: a plain decode next to speculating ones.
      if (drafts == Drafts::kNone || id == 2 || k <= 0) continue;
      const std::vector<int32_t>& right = reference->at(id).tokens;
      const int right_count = drafts == Drafts::kRight   ? k
                              : drafts == Drafts::kWrong ? 0
                                                         : static_cast<int>(rng() % (k + 1));
      for (int j = 0; j < k; ++j) {
        int32_t token = right[have + j];
        if (j >= right_count) {
          // Anything but the right token.
          token = (token + 1 + static_cast<int32_t>(rng() % (vocab - 1))) % vocab;
        }
        running->add_draft_token_ids(token);
      }
    }
    if (!any) break;
  }
  if (kept != nullptr) *kept = kept_drafts;
  for (auto& [id, trace] : traces) trace.logits = std::move(tap.rows(id));
  return traces;
}

struct Storage {
  kernels::CpuWeightDtype weights;
  const char* name;
};

class SpeculativeStepTest : public ::testing::TestWithParam<Storage> {};

TEST_P(SpeculativeStepTest, TokensAndLogitsAreThoseOfOneTokenPerStep) {
  const std::string dir = TestModelDir("llama3_gqa");
  const auto probe = LocalWorker::Create(dir, 1, 8, kBlockSize);
  const std::vector<Case> cases = MakeCases(probe->model->config().vocab_size);
  const std::map<uint64_t, Trace> reference =
      Decode(dir, cases, GetParam().weights, Drafts::kNone, nullptr, 1);
  for (const auto& [id, trace] : reference) ASSERT_EQ(trace.tokens.size(), kNewTokens) << id;
  for (Drafts drafts : {Drafts::kRight, Drafts::kWrong, Drafts::kMixed}) {
    for (uint32_t seed : {3u, 4u}) {
      int kept = 0;
      const std::map<uint64_t, Trace> got =
          Decode(dir, cases, GetParam().weights, drafts, &reference, seed, &kept);
      // Right drafts are all kept, wrong ones never.
      if (drafts == Drafts::kRight) EXPECT_GT(kept, kNewTokens / 2);
      if (drafts == Drafts::kWrong) EXPECT_EQ(kept, 0);
      for (const auto& [id, want] : reference) {
        const Trace& trace = got.at(id);
        SCOPED_TRACE(::testing::Message() << "drafts " << static_cast<int>(drafts) << " seed "
                                          << seed << " sequence " << id);
        ASSERT_EQ(trace.tokens, want.tokens);
        EXPECT_EQ(trace.logprobs, want.logprobs);
        // Every row sampled from is the row decoding gave at that position, bit for bit
        // (a rejected draft's later rows are never sampled from).
        ASSERT_EQ(trace.logits.size(), want.logits.size());
        for (size_t i = 0; i < want.logits.size(); ++i) {
          ASSERT_EQ(trace.logits[i], want.logits[i]) << "token " << i;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Storages, SpeculativeStepTest,
                         ::testing::Values(Storage{kernels::CpuWeightDtype::kF32, "f32"},
                                           Storage{kernels::CpuWeightDtype::kBf16, "bf16"},
                                           Storage{kernels::CpuWeightDtype::kInt8, "int8"}),
                         [](const ::testing::TestParamInfo<Storage>& info) {
                           return info.param.name;
                         });

// Decodes the cases with the engine's draft model (`draft_dir`): every step asks for 1 to
// 5 proposals per sequence (from `seed`) and carries the ones the last step answered as
// its drafts. `proposal` sees each proposal, the tokens it follows, and how many were
// asked for.
struct DraftRun {
  std::map<uint64_t, Trace> traces;
  std::map<uint64_t, int> proposed, kept;  // Draft tokens carried and kept, per sequence.
};
DraftRun DecodeWithDraftModel(
    const std::string& model_dir, const std::string& draft_dir, const std::vector<Case>& cases,
    uint32_t seed,
    const std::function<void(const std::vector<int32_t>& tokens,
                             const std::vector<int32_t>& proposal, int asked)>& proposal) {
  auto w = LocalWorker::Create(model_dir, 2, kNumBlocks, kBlockSize);
  w->AttachDraft(draft_dir);
  AllLogits tap;
  w->engine->set_logits_tap(&tap);
  std::mt19937 rng(seed);
  DraftRun run;
  std::map<uint64_t, std::vector<int32_t>> drafts;
  std::map<uint64_t, int> asked;
  worker::v1::StepRequest step;
  step.set_step_id(1);
  for (size_t i = 0; i < cases.size(); ++i) {
    const uint64_t id = i + 1;
    asked[id] = 1 + static_cast<int>(rng() % 5);
    AddNew(&step, id, cases[i], 40 * i)->set_num_tokens_to_propose(asked[id]);
  }
  for (uint64_t step_id = 1;; ++step_id) {
    worker::v1::StepResponse response;
    const absl::Status status = w->engine->Step(step, &response);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok()) break;
    std::map<uint64_t, int> answered = Record(response, &run.traces);
    for (auto& [id, carried] : drafts) {
      run.proposed[id] += static_cast<int>(carried.size());
      run.kept[id] += answered[id] - 1;
    }
    drafts.clear();
    for (const worker::v1::DraftProposal& p : response.proposals()) {
      const std::vector<int32_t> got(p.token_ids().begin(), p.token_ids().end());
      // The tokens it follows: the prompt, then what was answered.
      std::vector<int32_t> tokens = cases[p.seq_id() - 1].prompt;
      const std::vector<int32_t>& output = run.traces[p.seq_id()].tokens;
      tokens.insert(tokens.end(), output.begin(), output.end());
      proposal(tokens, got, asked[p.seq_id()]);
      drafts[p.seq_id()] = got;
    }
    step.Clear();
    step.set_step_id(step_id + 1);
    step.set_previous_step_id(step_id);
    bool any = false;
    for (size_t i = 0; i < cases.size(); ++i) {
      const uint64_t id = i + 1;
      const int have = static_cast<int>(run.traces[id].tokens.size());
      if (have >= kNewTokens) {
        drafts.erase(id);  // Not carried: it is done.
        continue;
      }
      any = true;
      auto* running = step.add_running();
      running->set_seq_id(id);
      running->set_num_tokens(1);
      std::vector<int32_t>& draft = drafts[id];
      draft.resize(std::min<size_t>(draft.size(), kNewTokens - have - 1));
      running->mutable_draft_token_ids()->Add(draft.begin(), draft.end());
      asked[id] = 1 + static_cast<int>(rng() % 5);
      running->set_num_tokens_to_propose(asked[id]);
    }
    if (!any) break;
  }
  for (auto& [id, trace] : run.traces) trace.logits = std::move(tap.rows(id));
  return run;
}

TEST(DraftModelTest, ProposalsAreTheDraftsGreedyTokensAndOutputsDoNotChange) {
  const std::string dir = TestModelDir("llama3_gqa");
  const std::string draft_dir = TestModelDir("qwen2_bias_f16");  // Same vocabulary.
  const auto probe = LocalWorker::Create(dir, 1, 8, kBlockSize);
  const std::vector<Case> cases = MakeCases(probe->model->config().vocab_size);
  const std::map<uint64_t, Trace> reference =
      Decode(dir, cases, kernels::CpuWeightDtype::kF32, Drafts::kNone, nullptr, 1);
  // The draft model alone, each proposal recomputed from scratch: the runner's K/V
  // bookkeeping (the catch-up, the last proposal's entries kept where they held) must
  // give the same tokens.
  auto draft = LocalWorker::Create(draft_dir, 1, 64, kBlockSize);
  int proposals = 0;
  for (uint32_t seed : {3u, 4u}) {
    SCOPED_TRACE(::testing::Message() << "seed " << seed);
    const DraftRun run = DecodeWithDraftModel(
        dir, draft_dir, cases, seed,
        [&](const std::vector<int32_t>& tokens, const std::vector<int32_t>& proposal, int asked) {
          ++proposals;
          ASSERT_EQ(static_cast<int>(proposal.size()), asked);  // The blocks have room.
          EXPECT_EQ(proposal, GreedyByPrefill(*draft, tokens, asked));
        });
    for (const auto& [id, want] : reference) {
      SCOPED_TRACE(::testing::Message() << "sequence " << id);
      const Trace& got = run.traces.at(id);
      ASSERT_EQ(got.tokens, want.tokens);
      EXPECT_EQ(got.logprobs, want.logprobs);
      ASSERT_EQ(got.logits, want.logits);
      EXPECT_GT(run.proposed.at(id), 0);
    }
  }
  EXPECT_GT(proposals, 2 * kNewTokens);
}

TEST(DraftModelTest, TheModelAsItsOwnDraftHasEveryGreedyProposalKept) {
  // Same weights, same backend, batch-invariant kernels: the draft's logits are the
  // model's, so a greedy sequence keeps every proposal, which only holds if the draft
  // model's K/V is right at every position it reuses.
  const std::string dir = TestModelDir("llama3_gqa");
  const auto probe = LocalWorker::Create(dir, 1, 8, kBlockSize);
  const std::vector<Case> cases = MakeCases(probe->model->config().vocab_size);
  const std::map<uint64_t, Trace> reference =
      Decode(dir, cases, kernels::CpuWeightDtype::kF32, Drafts::kNone, nullptr, 1);
  const DraftRun run =
      DecodeWithDraftModel(dir, dir, cases, 7, [](const auto&, const auto&, int) {});
  for (const auto& [id, want] : reference) {
    ASSERT_EQ(run.traces.at(id).tokens, want.tokens) << "sequence " << id;
  }
  // Sequence 1 is greedy; the others sample, and keep what their draws agree with.
  EXPECT_GT(run.proposed.at(1), kNewTokens / 2);
  EXPECT_EQ(run.kept.at(1), run.proposed.at(1));
}

// A sequence decoded to its first token, ready for a step with drafts.
std::unique_ptr<LocalWorker> Started(worker::v1::StepRequest* next) {
  auto w = LocalWorker::Create(TestModelDir("llama3_gqa"), 1, 16, kBlockSize);
  worker::v1::StepRequest step;
  step.set_step_id(1);
  auto* seq = step.add_new_sequences();
  seq->set_seq_id(1);
  for (int t : {1, 5, 9, 13, 17}) seq->add_token_ids(t);
  seq->set_num_tokens(5);
  seq->add_block_ids(0);
  seq->add_block_ids(1);
  worker::v1::StepResponse response;
  EXPECT_TRUE(w->engine->Step(step, &response).ok());
  next->set_step_id(2);
  next->set_previous_step_id(1);
  auto* running = next->add_running();
  running->set_seq_id(1);
  running->set_num_tokens(1);
  return w;
}

TEST(SpeculativeStepValidationTest, RefusesDraftsItCannotVerify) {
  struct Bad {
    const char* what;
    std::function<void(worker::v1::RunningSequence*)> edit;
    const char* message;
  };
  const std::vector<Bad> bad = {
      {"out of the vocabulary", [](auto* r) { r->add_draft_token_ids(1 << 20); },
       "outside the vocabulary"},
      {"negative", [](auto* r) { r->add_draft_token_ids(-1); }, "outside the vocabulary"},
      {"too many",
       [](auto* r) {
         for (int i = 0; i < 33; ++i) r->add_draft_token_ids(3);
       },
       "above the limit"},
      // 6 tokens + the last one + 2 drafts fit 2 blocks of 4; 3 more do not.
      {"beyond the blocks",
       [](auto* r) {
         for (int i = 0; i < 3; ++i) r->add_draft_token_ids(3);
       },
       "KV slots"},
      {"on a prefill chunk",
       [](auto* r) {
         r->set_num_tokens(2);
         r->add_draft_token_ids(3);
       },
       "needs a decode"},
  };
  for (const Bad& b : bad) {
    SCOPED_TRACE(b.what);
    worker::v1::StepRequest step;
    auto w = Started(&step);
    b.edit(step.mutable_running(0));
    worker::v1::StepResponse response;
    const absl::Status status = w->engine->Step(step, &response);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(b.message), std::string::npos) << status;
    // Nothing changed: the same step without drafts runs.
    step.mutable_running(0)->clear_draft_token_ids();
    step.mutable_running(0)->set_num_tokens(1);
    step.set_step_id(3);
    step.set_previous_step_id(0);  // Not built on the refused step 2.
    worker::v1::StepResponse again;
    EXPECT_TRUE(w->engine->Step(step, &again).ok());
    EXPECT_EQ(again.tokens_size(), 1);
  }
}

TEST(DraftModelTest, ProposalsNeedADraftModelAndABoundedCount) {
  worker::v1::StepRequest step;
  auto w = Started(&step);
  step.mutable_running(0)->set_num_tokens_to_propose(2);
  worker::v1::StepResponse response;
  absl::Status status = w->engine->Step(step, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("without draft_model_path"), std::string::npos) << status;

  w->AttachDraft(TestModelDir("llama3_gqa"));
  step.mutable_running(0)->set_num_tokens_to_propose(33);
  step.set_step_id(3);
  step.set_previous_step_id(0);  // Not built on the refused step 2.
  status = w->engine->Step(step, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("num_tokens_to_propose must be in [0, 32]"), std::string::npos)
      << status;
  // The sequence holds 2 blocks of 4 slots and 7 tokens after this step: the first
  // proposal comes from the last token's row, the second needs the first's K/V in the
  // last slot, a third would need a ninth slot. So 2 of the 8 asked for.
  step.mutable_running(0)->set_num_tokens_to_propose(8);
  step.set_step_id(4);
  ASSERT_TRUE(w->engine->Step(step, &response).ok());
  ASSERT_EQ(response.proposals_size(), 1);
  EXPECT_EQ(response.proposals(0).token_ids_size(), 2);

  // A prompt that fills its blocks: the token sampled after it has no slot yet (the
  // scheduler adds one before the next step), and the draft needs one to read its row.
  worker::v1::StepRequest full;
  full.set_step_id(5);
  auto* seq = full.add_new_sequences();
  seq->set_seq_id(2);
  for (int t = 0; t < 8; ++t) seq->add_token_ids(3 + t);
  seq->set_num_tokens(8);
  seq->add_block_ids(4);
  seq->add_block_ids(5);
  seq->set_num_tokens_to_propose(4);
  worker::v1::StepResponse answer;
  ASSERT_TRUE(w->engine->Step(full, &answer).ok());
  EXPECT_EQ(answer.tokens_size(), 1);
  EXPECT_EQ(answer.proposals_size(), 0);
}

}  // namespace
}  // namespace conveyor::testing
