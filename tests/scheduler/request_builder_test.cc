// Every bad GenerateRequest is INVALID_ARGUMENT with a message naming the field; good
// ones get the documented defaults.
#include "scheduler/request_builder.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::scheduler {
namespace {

using ::testing::HasSubstr;

class RequestBuilderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto tokenizer = Tokenizer::Load(conveyor::testing::TestModelDir("llama3_gqa"));
    ASSERT_TRUE(tokenizer.ok()) << tokenizer.status();
    tokenizer_ = std::move(*tokenizer);
    limits_.vocab_size = 512;
    limits_.max_context_tokens = 100;
    limits_.kv_capacity_tokens = 80;
    limits_.eos_token_ids = {2};
    limits_.bos_token_id = 1;
    limits_.default_max_new_tokens = 16;
  }

  v1::GenerateRequest Valid() {
    v1::GenerateRequest r;
    r.set_text("hello world");
    return r;
  }

  // Expects `r` to be rejected with a message containing `words`.
  void ExpectInvalid(const v1::GenerateRequest& r, const std::string& words) {
    auto built = BuildRequest(r, limits_, *tokenizer_);
    ASSERT_FALSE(built.ok()) << "accepted: " << r.ShortDebugString();
    EXPECT_EQ(built.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(built.status().message()), HasSubstr(words));
  }

  std::unique_ptr<Tokenizer> tokenizer_;
  ServingLimits limits_;
};

TEST_F(RequestBuilderTest, TextGetsBosAndDefaults) {
  auto built = BuildRequest(Valid(), limits_, *tokenizer_);
  ASSERT_TRUE(built.ok()) << built.status();
  const Request& r = **built;
  EXPECT_EQ(r.tokens.front(), 1);
  EXPECT_GT(r.num_prompt_tokens, 1);
  EXPECT_EQ(r.max_new_tokens, 16);
  EXPECT_EQ(r.sampling.temperature(), 1.0f);
  EXPECT_EQ(r.sampling.top_p(), 1.0f);
  EXPECT_EQ(r.sampling.repetition_penalty(), 1.0f);
  EXPECT_EQ(r.eos_token_ids, std::vector<int32_t>{2});

  v1::GenerateRequest no_bos = Valid();
  no_bos.set_add_bos(false);
  no_bos.set_ignore_eos(true);
  built = BuildRequest(no_bos, limits_, *tokenizer_);
  ASSERT_TRUE(built.ok());
  EXPECT_NE((*built)->tokens.front(), 1);
  EXPECT_TRUE((*built)->eos_token_ids.empty());
}

TEST_F(RequestBuilderTest, PromptErrors) {
  v1::GenerateRequest r;
  ExpectInvalid(r, "prompt is empty");
  r.set_text("");
  ExpectInvalid(r, "text is empty");
  r.mutable_token_ids();
  ExpectInvalid(r, "prompt is empty");
  r.mutable_token_ids()->add_ids(512);
  ExpectInvalid(r, "token_ids holds 512");
  r.mutable_token_ids()->set_ids(0, -4);
  ExpectInvalid(r, "token_ids holds -4");
  r.mutable_token_ids()->clear_ids();
  for (int i = 0; i < 100; ++i) r.mutable_token_ids()->add_ids(5);
  ExpectInvalid(r, "context is 100 tokens");
}

TEST_F(RequestBuilderTest, LengthErrors) {
  v1::GenerateRequest r = Valid();
  r.set_max_new_tokens(0);
  ExpectInvalid(r, "max_new_tokens must be >= 1");
  r.set_max_new_tokens(-3);
  ExpectInvalid(r, "max_new_tokens must be >= 1");
  r.set_max_new_tokens(99);
  ExpectInvalid(r, "exceeds the model's context");
  r.set_max_new_tokens(79);
  ExpectInvalid(r, "more KV cache than the server has");
}

TEST_F(RequestBuilderTest, SamplingErrors) {
  auto with = [&](auto edit, const std::string& words) {
    v1::GenerateRequest r = Valid();
    edit(r);
    ExpectInvalid(r, words);
  };
  with([](auto& r) { r.set_temperature(-0.5f); }, "temperature");
  with([](auto& r) { r.set_top_p(0.0f); }, "top_p");
  with([](auto& r) { r.set_top_p(1.5f); }, "top_p");
  with([](auto& r) { r.set_min_p(2.0f); }, "min_p");
  with([](auto& r) { r.set_top_k(-1); }, "top_k");
  with([](auto& r) { r.set_repetition_penalty(0.0f); }, "repetition_penalty");
  with([](auto& r) { r.set_presence_penalty(3.0f); }, "presence_penalty");
  with([](auto& r) { r.set_frequency_penalty(-2.5f); }, "frequency_penalty");
  with([](auto& r) { r.set_temperature(std::nanf("")); }, "temperature");
  with([](auto& r) { r.set_logprobs(21); }, "logprobs");
  with([](auto& r) { (*r.mutable_logit_bias())[3] = 100.5f; }, "logit_bias for token 3");
  with([](auto& r) { (*r.mutable_logit_bias())[-1] = 1.0f; }, "logit_bias names token -1");
  with([](auto& r) { (*r.mutable_logit_bias())[1 << 20] = 1.0f; }, "outside the vocabulary");
}

TEST_F(RequestBuilderTest, StopErrors) {
  v1::GenerateRequest r = Valid();
  for (int i = 0; i < 17; ++i) r.add_stop("x");
  ExpectInvalid(r, "at most 16");
  r = Valid();
  r.add_stop("");
  ExpectInvalid(r, "empty string");
  r = Valid();
  r.add_stop(std::string(300, 'a'));
  ExpectInvalid(r, "256 bytes");
  r = Valid();
  r.add_stop_token_ids(9999);
  ExpectInvalid(r, "stop_token_ids holds 9999");
}

TEST_F(RequestBuilderTest, SeedIsKeptOrDrawn) {
  v1::GenerateRequest r = Valid();
  r.set_seed(42);
  EXPECT_EQ((*BuildRequest(r, limits_, *tokenizer_))->sampling.seed(), 42u);
  const uint64_t a = (*BuildRequest(Valid(), limits_, *tokenizer_))->sampling.seed();
  const uint64_t b = (*BuildRequest(Valid(), limits_, *tokenizer_))->sampling.seed();
  EXPECT_NE(a, b);
}

TEST_F(RequestBuilderTest, ConstraintsCompileToTheGrammarTheWorkersGet) {
  v1::GenerateRequest r = Valid();
  r.mutable_constraint()->set_json_schema(
      R"({"type": "object", "properties": {"a": {"enum": [1]}}})");
  auto built = BuildRequest(r, limits_, *tokenizer_);
  ASSERT_TRUE(built.ok()) << built.status();
  ASSERT_NE((*built)->grammar, nullptr);
  EXPECT_THAT(*(*built)->grammar, HasSubstr("root ::="));
  // The same constraint again is the same compiled grammar (cached).
  auto again = BuildRequest(r, limits_, *tokenizer_);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)->grammar, (*built)->grammar);

  v1::GenerateRequest object = Valid();
  object.mutable_constraint()->set_json_object(true);
  auto built_object = BuildRequest(object, limits_, *tokenizer_);
  ASSERT_TRUE(built_object.ok());
  EXPECT_NE((*built_object)->grammar, nullptr);

  v1::GenerateRequest regex = Valid();
  regex.mutable_constraint()->set_regex("[a-z]{2,4}@example\\.com");
  auto built_regex = BuildRequest(regex, limits_, *tokenizer_);
  ASSERT_TRUE(built_regex.ok()) << built_regex.status();
  EXPECT_NE((*built_regex)->grammar, nullptr);

  EXPECT_EQ((*BuildRequest(Valid(), limits_, *tokenizer_))->grammar, nullptr);
}

TEST_F(RequestBuilderTest, BadConstraintsSayWhatToFix) {
  v1::GenerateRequest r = Valid();
  r.mutable_constraint()->set_json_schema("{\"type\": ");
  ExpectInvalid(r, "constraint: json_schema is not valid JSON");
  r.mutable_constraint()->set_json_schema(R"({"type": "string", "format": "pigeon"})");
  ExpectInvalid(r, "pigeon");
  r.mutable_constraint()->set_grammar("root ::= \"a\" missing");
  ExpectInvalid(r, "missing");
  r.mutable_constraint()->set_regex("(a)\\1");
  ExpectInvalid(r, "backreference");
  r.mutable_constraint()->set_json_object(false);
  ExpectInvalid(r, "json_object is false");
  r.mutable_constraint()->Clear();
  r.mutable_constraint();
  ExpectInvalid(r, "constraint has no kind");
  r.mutable_constraint()->set_json_object(true);
  r.set_ignore_eos(true);
  ExpectInvalid(r, "ignore_eos cannot be combined");
}

}  // namespace
}  // namespace conveyor::scheduler
