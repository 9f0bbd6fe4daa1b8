// The stop checks on requests built as the API builds them (request_builder.h), over a
// small trained tokenizer: which token ends generation, why, and which text goes out.
// Byte-fallback tokens (one byte each) place token boundaries exactly where a test wants.
#include "scheduler/stop_checker.h"

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "scheduler/request_builder.h"
#include "tests/support/test_tokenizer.h"

namespace conveyor::scheduler {
namespace {

using ::conveyor::testing::ByteToken;
using ::conveyor::testing::kTestEosId;

// The tokens of `text`, one byte each.
std::vector<int> Bytes(std::string_view text) {
  std::vector<int> ids;
  for (char c : text) ids.push_back(ByteToken(static_cast<unsigned char>(c)));
  return ids;
}

// What a request's stream was, token by token, until it finished.
struct Stream {
  std::vector<std::string> texts;  // One per token checked.
  std::optional<FinishReason> finish;
  // The last verdict's: what ended it with kStop.
  std::string stop_string;
  std::optional<int32_t> stop_token_id;

  std::string text() const {
    std::string all;
    for (const std::string& t : texts) all += t;
    return all;
  }
};

class StopCheckerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { tokenizer_ = testing::TrainTestTokenizer(); }
  static void TearDownTestSuite() { tokenizer_.reset(); }
  void SetUp() override { ASSERT_NE(tokenizer_, nullptr); }

  // A request for prompt "the quick", with `edit` applied to its proto.
  static std::unique_ptr<Request> Build(
      const std::function<void(v1::GenerateRequest&)>& edit = {}) {
    v1::GenerateRequest proto;
    proto.set_text("the quick");
    proto.set_max_new_tokens(100);
    if (edit) edit(proto);
    ServingLimits limits;
    limits.vocab_size = tokenizer_->vocab_size();
    limits.max_context_tokens = 1000;
    limits.kv_capacity_tokens = 1000;
    limits.eos_token_ids = {kTestEosId};
    limits.bos_token_id = testing::kTestBosId;
    auto built = BuildRequest(proto, limits, *tokenizer_);
    EXPECT_TRUE(built.ok()) << built.status();
    return built.ok() ? *std::move(built) : std::make_unique<Request>();
  }

  // Samples `output` for r, one token at a time, as the engine does, until one finishes.
  static Stream Generate(Request& r, const std::vector<int>& output,
                         const StopChecker& checker = StopChecker(1 << 30)) {
    Stream stream;
    for (int token : output) {
      r.tokens.push_back(token);
      StopChecker::Verdict verdict = checker.Check(r);
      stream.texts.push_back(std::move(verdict.text));
      if (verdict.finish.has_value()) {
        stream.finish = verdict.finish;
        stream.stop_string = std::move(verdict.stop_string);
        stream.stop_token_id = verdict.stop_token_id;
        break;
      }
    }
    return stream;
  }

  static inline std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_F(StopCheckerTest, NamesEveryReasonAsTheMetricsDo) {
  EXPECT_EQ(FinishReasonName(FinishReason::kLength), "length");
  EXPECT_EQ(FinishReasonName(FinishReason::kEos), "eos");
  EXPECT_EQ(FinishReasonName(FinishReason::kStop), "stop");
  EXPECT_EQ(FinishReasonName(FinishReason::kCancelled), "cancelled");
  EXPECT_EQ(FinishReasonName(FinishReason::kDeadline), "deadline");
  EXPECT_EQ(FinishReasonName(FinishReason::kError), "error");
}

TEST_F(StopCheckerTest, StreamsTextUntilMaxNewTokens) {
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) { p.set_max_new_tokens(3); });
  const Stream stream = Generate(*r, Bytes("abcdef"));
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "b", "c"}));
  EXPECT_EQ(stream.finish, FinishReason::kLength);
}

TEST_F(StopCheckerTest, EndsAtTheModelsContext) {
  std::unique_ptr<Request> r = Build();
  const StopChecker checker(r->num_prompt_tokens + 2);
  const Stream stream = Generate(*r, Bytes("abcdef"), checker);
  EXPECT_EQ(stream.text(), "ab");
  EXPECT_EQ(stream.finish, FinishReason::kLength);
}

TEST_F(StopCheckerTest, EosEndsWithoutItsTextButWithEverythingHeldBack) {
  // "xy" may begin the stop string "xyz", so it is held back until EOS makes it final.
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) { p.add_stop("xyz"); });
  std::vector<int> output = Bytes("abxy");
  output.push_back(kTestEosId);
  const Stream stream = Generate(*r, output);
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "b", "", "", "xy"}));
  EXPECT_EQ(stream.finish, FinishReason::kEos);
}

TEST_F(StopCheckerTest, IgnoreEosKeepsGoingPastEos) {
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) {
    p.set_ignore_eos(true);
    p.set_max_new_tokens(3);
  });
  const Stream stream = Generate(*r, {ByteToken('a'), kTestEosId, ByteToken('b')});
  EXPECT_EQ(stream.finish, FinishReason::kLength);
  EXPECT_EQ(stream.text(), "ab");
}

TEST_F(StopCheckerTest, StopTokenIdEndsWithReasonStopAndNoText) {
  const int stop_id = ByteToken('!');
  std::unique_ptr<Request> r =
      Build([&](v1::GenerateRequest& p) { p.add_stop_token_ids(stop_id); });
  const Stream stream = Generate(*r, {ByteToken('o'), ByteToken('k'), stop_id, ByteToken('x')});
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"o", "k", ""}));
  EXPECT_EQ(stream.finish, FinishReason::kStop);
  EXPECT_EQ(stream.stop_token_id, stop_id);  // Which one (vLLM's stop_reason).
  EXPECT_EQ(stream.stop_string, "");
}

TEST_F(StopCheckerTest, StopTokenIdReleasesHeldBackTextAsEosDoes) {
  const int stop_id = ByteToken('!');
  std::unique_ptr<Request> r = Build([&](v1::GenerateRequest& p) {
    p.add_stop_token_ids(stop_id);
    p.add_stop("cde");
  });
  // "c" waits (it could begin "cde"); the stop id ends the text, which includes it.
  const Stream stream = Generate(*r, {ByteToken('a'), ByteToken('c'), stop_id});
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "", "c"}));
  EXPECT_EQ(stream.finish, FinishReason::kStop);
}

TEST_F(StopCheckerTest, EosWinsOverAStopTokenIdForTheSameToken) {
  std::unique_ptr<Request> r =
      Build([](v1::GenerateRequest& p) { p.add_stop_token_ids(kTestEosId); });
  EXPECT_EQ(Generate(*r, {kTestEosId}).finish, FinishReason::kEos);
}

TEST_F(StopCheckerTest, StopStringAcrossTokensIsCutAndNeverStreamed) {
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) { p.add_stop("cde"); });
  const Stream stream = Generate(*r, Bytes("abcdefg"));
  // "c" and "cd" could begin the stop string, so they wait; "e" completes it.
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "b", "", "", ""}));
  EXPECT_EQ(stream.finish, FinishReason::kStop);
  EXPECT_EQ(stream.stop_string, "cde");  // Which one (Anthropic's stop_sequence).
  EXPECT_FALSE(stream.stop_token_id.has_value());
}

TEST_F(StopCheckerTest, HeldBackTextIsReleasedOnceItCannotBeAStop) {
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) { p.add_stop("cde"); });
  const Stream stream = Generate(*r, Bytes("acdx"));
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "", "", "cdx"}));
  EXPECT_FALSE(stream.finish.has_value());
}

TEST_F(StopCheckerTest, StopStringAcrossWordPiecesMatchesTheStreamedText) {
  // Real pieces: learn the text the tokens stream without stops, then stop on four bytes
  // of it around a token boundary.
  auto ids = tokenizer_->Encode("brown fox jumps over the lazy dog");
  ASSERT_TRUE(ids.ok());
  const std::vector<int> output = *ids;
  std::unique_ptr<Request> plain = Build();
  const Stream free_run = Generate(*plain, output);
  ASSERT_FALSE(free_run.finish.has_value());
  const std::string full = free_run.text();
  ASSERT_EQ(full, " brown fox jumps over the lazy dog");
  std::string stop;
  for (size_t i = 0, end = 0; i + 1 < free_run.texts.size() && stop.empty(); ++i) {
    end += free_run.texts[i].size();
    if (i > 0 && free_run.texts[i].size() >= 2 && free_run.texts[i + 1].size() >= 2) {
      stop = full.substr(end - 2, 4);
    }
  }
  ASSERT_FALSE(stop.empty());

  std::unique_ptr<Request> r = Build([&](v1::GenerateRequest& p) { p.add_stop(stop); });
  const Stream stream = Generate(*r, output);
  EXPECT_EQ(stream.finish, FinishReason::kStop) << "stop string '" << stop << "'";
  EXPECT_EQ(stream.text(), full.substr(0, full.find(stop)));
}

TEST_F(StopCheckerTest, AnUnfinishedCharacterIsFlushedAsReplacementAtTheEnd) {
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) { p.set_max_new_tokens(2); });
  // "a", then the first byte of a three-byte character that never completes.
  const Stream stream = Generate(*r, {ByteToken('a'), ByteToken(0xE4)});
  EXPECT_EQ(stream.texts, (std::vector<std::string>{"a", "\uFFFD"}));
  EXPECT_EQ(stream.finish, FinishReason::kLength);
}

TEST_F(StopCheckerTest, TextFlushedAtTheEndCanStillCompleteAStopString) {
  // The flushed U+FFFD completes the stop string "a\uFFFD": the reason becomes stop.
  std::unique_ptr<Request> r = Build([](v1::GenerateRequest& p) {
    p.set_max_new_tokens(2);
    p.add_stop("a\uFFFD");
  });
  const Stream stream = Generate(*r, {ByteToken('a'), ByteToken(0xE4)});
  EXPECT_EQ(stream.text(), "");
  EXPECT_EQ(stream.finish, FinishReason::kStop);
  EXPECT_EQ(stream.stop_string, "a\uFFFD");
}

}  // namespace
}  // namespace conveyor::scheduler
