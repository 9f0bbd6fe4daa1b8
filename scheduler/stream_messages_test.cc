// The stream's logprobs and final message, checked against the tokenizer itself: a
// token's logprob text is what decoding the text so far gains by it, at every position
// of generated texts, and always valid UTF-8.
#include "scheduler/stream_messages.h"

#include <memory>
#include <string>
#include <vector>

#include "common/utf8.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/test_tokenizer.h"

namespace conveyor::scheduler {
namespace {

using ::conveyor::testing::ByteToken;

class StreamMessagesTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = testing::TrainTestTokenizer(); }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }

  // A request whose known tokens are `tokens`, the first `prompt` of them its prompt.
  static Request RequestOf(const std::vector<int>& tokens, int prompt) {
    Request r;
    r.tokens.assign(tokens.begin(), tokens.end());
    r.num_prompt_tokens = prompt;
    r.num_logprobs = 2;
    return r;
  }
  static worker::v1::SampledToken Sampled(int id, const std::vector<int>& top) {
    worker::v1::SampledToken token;
    token.set_token_id(id);
    token.set_logprob(-0.5f);
    for (int alt : top) {
      worker::v1::TokenLogprob* t = token.add_top_logprobs();
      t->set_token_id(alt);
      t->set_logprob(-1.5f);
    }
    return token;
  }
  // What decoding tokens [0, end] adds to decoding tokens [0, end).
  static std::string Gain(const std::vector<int>& tokens, size_t end) {
    const std::string before = tokenizer_->Decode({tokens.begin(), tokens.begin() + end});
    const std::string after = tokenizer_->Decode({tokens.begin(), tokens.begin() + end + 1});
    EXPECT_EQ(after.compare(0, before.size(), before), 0);
    return after.substr(before.size());
  }

  static std::unique_ptr<Tokenizer> tokenizer_;
};
std::unique_ptr<Tokenizer> StreamMessagesTest::tokenizer_;

TEST_F(StreamMessagesTest, EachTokensTextIsWhatItAddsToTheStream) {
  for (const char* text :
       {"the quick brown fox jumps over the lazy dog", "hello world, hello tokenizer",
        "tokens stream back to the client, lines 1, 22 and 333"}) {
    absl::StatusOr<std::vector<int>> tokens = tokenizer_->Encode(text);
    ASSERT_TRUE(tokens.ok()) << tokens.status();
    ASSERT_GT(tokens->size(), 4u);
    for (size_t i = 1; i < tokens->size(); ++i) {
      const std::vector<int> known(tokens->begin(), tokens->begin() + i + 1);
      const Request r = RequestOf(known, 1);
      // The alternatives: the token itself, and the token that came next in the text.
      const int next = i + 1 < tokens->size() ? (*tokens)[i + 1] : (*tokens)[0];
      v1::GenerateResponse message;
      AddTokenLogprobs(*tokenizer_, r, Sampled((*tokens)[i], {(*tokens)[i], next}), &message);
      ASSERT_EQ(message.logprobs_size(), 1);
      const v1::TokenLogprobs& lp = message.logprobs(0);
      EXPECT_EQ(lp.token().token_id(), (*tokens)[i]);
      EXPECT_FLOAT_EQ(lp.token().logprob(), -0.5f);
      EXPECT_EQ(lp.token().text(), Gain(*tokens, i)) << text << " at " << i;
      ASSERT_EQ(lp.top_size(), 2);
      EXPECT_EQ(lp.top(0).text(), lp.token().text());
      std::vector<int> instead(tokens->begin(), tokens->begin() + i);
      instead.push_back(next);
      EXPECT_EQ(lp.top(1).text(), Gain(instead, i)) << text << " at " << i;
      EXPECT_FLOAT_EQ(lp.top(1).logprob(), -1.5f);
    }
  }
}

TEST_F(StreamMessagesTest, TheFirstTokenDecodesAlone) {
  absl::StatusOr<std::vector<int>> tokens = tokenizer_->Encode("hello world");
  ASSERT_TRUE(tokens.ok());
  const Request r = RequestOf({(*tokens)[0]}, 0);
  v1::GenerateResponse message;
  AddTokenLogprobs(*tokenizer_, r, Sampled((*tokens)[0], {}), &message);
  EXPECT_EQ(message.logprobs(0).token().text(), tokenizer_->Decode({(*tokens)[0]}));
}

TEST_F(StreamMessagesTest, PartsOfACharacterReadAsValidUtf8) {
  absl::StatusOr<std::vector<int>> tokens = tokenizer_->Encode("hello world");
  ASSERT_TRUE(tokens.ok());
  // "é" is C3 A9: each byte token alone is half a character.
  for (const std::vector<int>& tail :
       {std::vector<int>{ByteToken(0xC3)}, std::vector<int>{ByteToken(0xC3), ByteToken(0xA9)}}) {
    std::vector<int> known = *tokens;
    known.insert(known.end(), tail.begin(), tail.end());
    const Request r = RequestOf(known, 1);
    v1::GenerateResponse message;
    AddTokenLogprobs(*tokenizer_, r, Sampled(known.back(), {ByteToken(0xA9), ByteToken('x')}),
                     &message);
    const v1::TokenLogprobs& lp = message.logprobs(0);
    for (const std::string& text : {lp.token().text(), lp.top(0).text(), lp.top(1).text()}) {
      EXPECT_EQ(ValidUtf8(text), text);
    }
    EXPECT_EQ(lp.top(1).text(), "x");
  }
}

TEST_F(StreamMessagesTest, FinalMessageCarriesTheReasonAndTheUsage) {
  Request r = RequestOf({5, 6, 7, 8, 9}, 3);
  r.num_cached_prompt_tokens = 2;
  r.preemptions = 1;
  r.arrival = Clock::now();
  r.first_scheduled = r.arrival + std::chrono::milliseconds(10);
  r.first_token = r.arrival + std::chrono::milliseconds(30);
  const struct {
    FinishReason reason;
    v1::FinishReason wire;
  } cases[] = {{FinishReason::kLength, v1::FINISH_REASON_LENGTH},
               {FinishReason::kEos, v1::FINISH_REASON_EOS},
               {FinishReason::kStop, v1::FINISH_REASON_STOP}};
  for (const auto& c : cases) {
    v1::GenerateResponse last;
    CompleteFinalMessage(r, c.reason, r.arrival + std::chrono::milliseconds(100), &last);
    EXPECT_EQ(last.finish_reason(), c.wire);
    EXPECT_EQ(last.usage().prompt_tokens(), 3);
    EXPECT_EQ(last.usage().generated_tokens(), 2);
    EXPECT_EQ(last.usage().cached_prompt_tokens(), 2);
    EXPECT_EQ(last.usage().preemptions(), 1);
    EXPECT_DOUBLE_EQ(last.usage().queue_time_ms(), 10);
    EXPECT_DOUBLE_EQ(last.usage().time_to_first_token_ms(), 30);
    EXPECT_DOUBLE_EQ(last.usage().e2e_latency_ms(), 100);
  }
}

}  // namespace
}  // namespace conveyor::scheduler
