// Structured output on the worker: a constrained sequence samples only what its grammar
// allows and EOS only where the grammar's sentence is whole; one rebuilt from its tokens
// (a preemption, a new worker) goes on exactly as if it had never stopped; and what is
// wrong with a constrained NewSequence is INVALID_ARGUMENT naming it.
#include <memory>
#include <string>
#include <vector>

#include "grammar/grammar.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"
#include "text/token_bytes.h"
#include "text/tokenizer.h"

namespace conveyor::testing {
namespace {

using worker::v1::StepRequest;
using worker::v1::StepResponse;

constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 256;

// Short strings and small arrays, so a random-weights model finishes a document.
constexpr char kSchema[] = R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["a", "b", 7]}, "maxItems": 3},
    "ok": {"type": ["boolean", "null"]}}, "required": ["name", "n"],
    "additionalProperties": false})";

class ConstrainedStepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    w_ = LocalWorker::Create(TestModelDir("llama3_gqa"), 1, kNumBlocks, kBlockSize);
    ASSERT_NE(w_, nullptr);
    auto tokenizer = Tokenizer::Load(TestModelDir("llama3_gqa"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    const int vocab = w_->model->config().vocab_size;
    TokenByteTable table = MakeTokenByteTable(**tokenizer, vocab);
    bytes_ = table.bytes;
    w_->engine->set_vocabulary(std::make_unique<grammar::Vocabulary>(
        table.bytes, table.special, w_->model->config().eos_token_ids));
    auto grammar = grammar::JsonSchemaToGrammar(nlohmann::ordered_json::parse(kSchema));
    ASSERT_TRUE(grammar.ok()) << grammar.status();
    grammar_ = *grammar;
  }

  bool IsEos(int token) const {
    for (int eos : w_->model->config().eos_token_ids) {
      if (token == eos) return true;
    }
    return false;
  }

  // A new constrained sequence: `prompt` then `output` (generated before), all to compute.
  void AddNew(StepRequest* step, uint64_t id, const std::vector<int>& prompt,
              const std::vector<int>& output, uint64_t seed) {
    auto* seq = step->add_new_sequences();
    seq->set_seq_id(id);
    for (int t : prompt) seq->add_token_ids(t);
    for (int t : output) seq->add_token_ids(t);
    seq->set_num_output_tokens(static_cast<int>(output.size()));
    seq->set_num_tokens(seq->token_ids_size());
    const int first_block = static_cast<int>(id % 4) * 32;
    for (int b = 0; b < 32; ++b) seq->add_block_ids(first_block + b);
    seq->mutable_sampling()->set_temperature(1.0f);
    seq->mutable_sampling()->set_top_p(1.0f);
    seq->mutable_sampling()->set_repetition_penalty(1.0f);
    seq->mutable_sampling()->set_seed(seed);
    seq->set_grammar(grammar_);
  }

  // Decodes sequence `id` (added by `first`) until EOS or `limit` tokens, then drops it;
  // the sampled tokens.
  std::vector<int> Decode(uint64_t id, StepRequest first, int limit) {
    std::vector<int> out;
    StepResponse response;
    first.set_step_id(++step_id_);
    absl::Status status = w_->engine->Step(first, &response);
    EXPECT_TRUE(status.ok()) << status;
    while (status.ok() && response.tokens_size() == 1) {
      out.push_back(response.tokens(0).token_id());
      if (IsEos(out.back()) || static_cast<int>(out.size()) >= limit) break;
      StepRequest next;
      next.set_step_id(++step_id_);
      auto* running = next.add_running();
      running->set_seq_id(id);
      running->set_num_tokens(1);
      response.Clear();
      status = w_->engine->Step(next, &response);
      EXPECT_TRUE(status.ok()) << status;
    }
    StepRequest drop;
    drop.set_step_id(++step_id_);
    drop.add_dropped_seq_ids(id);
    EXPECT_TRUE(w_->engine->Step(drop, &response).ok());
    return out;
  }

  uint64_t step_id_ = 0;

  std::unique_ptr<LocalWorker> w_;
  std::vector<std::string> bytes_;
  std::string grammar_;
};

TEST_F(ConstrainedStepTest, SamplesOnlyWhatTheGrammarAllowsAndEndsWhereItMayEnd) {
  auto parsed = grammar::Grammar::Parse(grammar_);
  ASSERT_TRUE(parsed.ok());
  auto shared = std::make_shared<const grammar::Grammar>(*std::move(parsed));
  int ended = 0;
  for (uint64_t seed = 0; seed < 12; ++seed) {
    StepRequest step;
    AddNew(&step, seed + 1, {5, 9, 11}, {}, seed);
    const std::vector<int> out = Decode(seed + 1, step, 200);
    grammar::Matcher matcher(shared);
    std::string text;
    for (size_t i = 0; i < out.size(); ++i) {
      if (IsEos(out[i])) {
        EXPECT_EQ(i + 1, out.size());
        EXPECT_TRUE(matcher.CanEnd()) << "EOS after " << text;
        ++ended;
        break;
      }
      text += bytes_[out[i]];
      ASSERT_TRUE(matcher.Accept(bytes_[out[i]])) << "token " << out[i] << " after " << text;
    }
    auto json = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (!out.empty() && IsEos(out.back())) EXPECT_FALSE(json.is_discarded()) << text;
  }
  EXPECT_GE(ended, 10);
}

TEST_F(ConstrainedStepTest, ARebuiltSequenceGoesOnAsIfItNeverStopped) {
  const std::vector<int> prompt = {5, 9, 11, 40};
  StepRequest step;
  AddNew(&step, 1, prompt, {}, 42);
  const std::vector<int> whole = Decode(1, step, 60);
  ASSERT_GE(whole.size(), 8u);
  for (size_t cut : {1ul, 5ul, whole.size() - 2}) {
    // The first `cut` tokens as a preempted sequence brings them back.
    StepRequest again;
    AddNew(&again, 100 + cut, prompt, std::vector<int>(whole.begin(), whole.begin() + cut), 42);
    const std::vector<int> rest = Decode(100 + cut, again, 60 - static_cast<int>(cut));
    std::vector<int> joined(whole.begin(), whole.begin() + cut);
    joined.insert(joined.end(), rest.begin(), rest.end());
    EXPECT_EQ(joined, whole) << "cut at " << cut;
  }
}

TEST_F(ConstrainedStepTest, WhatIsWrongIsNamed) {
  StepRequest bad_output;
  // "x" can never start the object.
  std::vector<int> x_token;
  for (int id = 0; id < static_cast<int>(bytes_.size()); ++id) {
    if (bytes_[id] == "x") x_token.push_back(id);
  }
  ASSERT_FALSE(x_token.empty());
  AddNew(&bad_output, 1, {5, 9}, {x_token[0]}, 1);
  StepResponse response;
  absl::Status status = w_->engine->Step(bad_output, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("not allowed by its grammar"), std::string::npos) << status;

  StepRequest bad_grammar;
  AddNew(&bad_grammar, 2, {5, 9}, {}, 1);
  bad_grammar.mutable_new_sequences(0)->set_grammar("root ::= missing");
  status = w_->engine->Step(bad_grammar, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("grammar: "), std::string::npos) << status;

  w_->engine->set_vocabulary(nullptr);
  StepRequest no_vocabulary;
  AddNew(&no_vocabulary, 3, {5, 9}, {}, 1);
  status = w_->engine->Step(no_vocabulary, &response);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(status.message().find("token_bytes"), std::string::npos) << status;
}

}  // namespace
}  // namespace conveyor::testing
