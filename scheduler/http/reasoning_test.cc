// The reasoning parser (reasoning.h): each format's split of whole outputs, and that every
// split of an output into streamed deltas (at every byte, tags cut anywhere) gives the same
// reasoning and answer as the whole.
#include "scheduler/http/reasoning.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler::openai {
namespace {

ReasoningDelta Whole(ReasoningFormat format, PromptThinking prompt, std::string_view text) {
  ReasoningParser parser(format, prompt);
  ReasoningDelta out = parser.Feed(text);
  ReasoningDelta rest = parser.Finish();
  out.reasoning += rest.reasoning;
  out.content += rest.content;
  return out;
}

// Fed in pieces cut at `cuts` (byte offsets, ascending).
ReasoningDelta Split(ReasoningFormat format, PromptThinking prompt, std::string_view text,
                     const std::vector<size_t>& cuts) {
  ReasoningParser parser(format, prompt);
  ReasoningDelta out;
  size_t at = 0;
  for (size_t cut : cuts) {
    ReasoningDelta d = parser.Feed(text.substr(at, cut - at));
    out.reasoning += d.reasoning;
    out.content += d.content;
    at = cut;
  }
  ReasoningDelta d = parser.Feed(text.substr(at));
  out.reasoning += d.reasoning;
  out.content += d.content;
  d = parser.Finish();
  out.reasoning += d.reasoning;
  out.content += d.content;
  return out;
}

void ExpectSplit(ReasoningFormat format, PromptThinking prompt, std::string_view text,
                 std::string_view reasoning, std::string_view content) {
  const ReasoningDelta whole = Whole(format, prompt, text);
  EXPECT_EQ(whole.reasoning, reasoning) << text;
  EXPECT_EQ(whole.content, content) << text;
  // Every cut into two and three pieces, and one byte at a time.
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      const ReasoningDelta split = Split(format, prompt, text, {i, j});
      ASSERT_EQ(split.reasoning, reasoning) << text << " cut at " << i << ", " << j;
      ASSERT_EQ(split.content, content) << text << " cut at " << i << ", " << j;
    }
  }
  std::vector<size_t> every;
  for (size_t i = 1; i < text.size(); ++i) every.push_back(i);
  const ReasoningDelta bytes = Split(format, prompt, text, every);
  EXPECT_EQ(bytes.reasoning, reasoning) << text;
  EXPECT_EQ(bytes.content, content) << text;
}

constexpr auto kQwen3 = ReasoningFormat::kQwen3;
constexpr auto kR1 = ReasoningFormat::kDeepSeekR1;

TEST(ReasoningParserTest, Qwen3OpenedByTheModel) {
  ExpectSplit(kQwen3, PromptThinking::kNone, "<think>\nLet me see.\n</think>\n\nIt is 4.",
              "\nLet me see.\n", "It is 4.");
  ExpectSplit(kQwen3, PromptThinking::kNone, "\n <think>a<b</thin</think>c</think>d", "a<b</thin",
              "c</think>d");
}

TEST(ReasoningParserTest, Qwen3WithoutTagsIsAllContent) {
  ExpectSplit(kQwen3, PromptThinking::kNone, "It is 4.", "", "It is 4.");
  ExpectSplit(kQwen3, PromptThinking::kNone, "  <thin", "", "  <thin");
  ExpectSplit(kQwen3, PromptThinking::kNone, "x<think>y</think>z", "", "x<think>y</think>z");
  // Thinking turned off by the template (enable_thinking: false).
  ExpectSplit(kQwen3, PromptThinking::kClosed, "It is 4.", "", "It is 4.");
  ExpectSplit(kQwen3, PromptThinking::kNone, "", "", "");
}

TEST(ReasoningParserTest, Qwen3PromptEndingInsideThinkIsReasoning) {
  ExpectSplit(kQwen3, PromptThinking::kOpen, "Hmm.\n</think>\n\nIt is 4.", "Hmm.\n", "It is 4.");
}

TEST(ReasoningParserTest, MissingEndTagIsAllReasoning) {
  ExpectSplit(kQwen3, PromptThinking::kNone, "<think>still thinking </thi", "still thinking </thi",
              "");
  ExpectSplit(kR1, PromptThinking::kNone, "still thinking", "still thinking", "");
  ExpectSplit(kR1, PromptThinking::kOpen, "", "", "");
}

TEST(ReasoningParserTest, DeepSeekR1IsReasoningFromTheStart) {
  ExpectSplit(kR1, PromptThinking::kNone, "Okay.</think>\n\nFour.", "Okay.", "Four.");
  ExpectSplit(kR1, PromptThinking::kOpen, "\n<think>\nOkay.\n</think>Four.", "\nOkay.\n", "Four.");
  // Not a leading tag: reasoning as written.
  ExpectSplit(kR1, PromptThinking::kNone, " <thinking> x</think>y", " <thinking> x", "y");
  // Only whitespace after </think>: no answer.
  ExpectSplit(kR1, PromptThinking::kNone, "a</think>\n\n", "a", "");
  // A prompt that closed the block: the output is the answer.
  ExpectSplit(kR1, PromptThinking::kClosed, "<think>x</think>y", "", "<think>x</think>y");
}

TEST(ReasoningParserTest, MultiByteTextAroundTags) {
  ExpectSplit(kR1, PromptThinking::kNone, "思考…</think>答え", "思考…", "答え");
}

TEST(ReasoningParserTest, ReasoningOpenFollowsTheState) {
  ReasoningParser parser(kQwen3, PromptThinking::kNone);
  EXPECT_FALSE(parser.reasoning_open());
  parser.Feed("<think>x");
  EXPECT_TRUE(parser.reasoning_open());
  parser.Feed("</think>");
  EXPECT_FALSE(parser.reasoning_open());
  ReasoningParser r1(kR1, PromptThinking::kNone);
  EXPECT_TRUE(r1.reasoning_open());
}

TEST(ReasoningFormatTest, NamesAndGuesses) {
  for (ReasoningFormat f : {ReasoningFormat::kNone, kQwen3, kR1}) {
    EXPECT_EQ(*ReasoningFormatFromName(ReasoningFormatName(f)), f);
  }
  EXPECT_FALSE(ReasoningFormatFromName("qwen").ok());
  EXPECT_EQ(GuessReasoningFormat("{{ messages }}"), ReasoningFormat::kNone);
  EXPECT_EQ(GuessReasoningFormat("{% if enable_thinking is false %}<think>\n\n</think>"), kQwen3);
  EXPECT_EQ(GuessReasoningFormat("<｜Assistant｜>{{ c.split('</think>')[-1] }}"), kR1);
}

TEST(ReasoningFormatTest, PromptThinkingState) {
  EXPECT_EQ(PromptThinkingState("<|im_start|>assistant\n"), PromptThinking::kNone);
  EXPECT_EQ(PromptThinkingState("<|im_start|>assistant\n<think>\n"), PromptThinking::kOpen);
  EXPECT_EQ(PromptThinkingState("<think>\n\n</think>\n\n"), PromptThinking::kClosed);
  EXPECT_EQ(PromptThinkingState("<think>a</think>b<|im_start|>assistant\n"), PromptThinking::kNone);
}

}  // namespace
}  // namespace conveyor::scheduler::openai
