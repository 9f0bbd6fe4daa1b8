// Reasoning in a chat completion's output (docs/reasoning.md): models whose chat template
// has them think inside `<think>…</think>` (Qwen3, QwQ, DeepSeek-R1 and its distills)
// before they answer, and the OpenAI API returns that thinking apart from the answer, in
// `reasoning_content` (and `reasoning`, the name current vLLM uses). This file holds the
// parser that splits the output text into the two parts, as it streams, and the choice of
// parser from a name (--reasoning_parser) or from the chat template. Pure logic, no engine
// or sockets (reasoning_test.cc).
//
// Parsers (vLLM's names):
//  - "deepseek_r1": the output is reasoning from its first byte, up to the first
//    `</think>`; the rest is the answer. A leading `<think>` (after optional whitespace)
//    is dropped, so it does not matter whether the template or the model opens the block.
//    Only a prompt that already closed the block (it ends in `</think>` and whitespace:
//    the template turned thinking off) makes the whole output the answer.
//  - "qwen3": the output is reasoning only when it opens with `<think>` (after optional
//    whitespace; the tag is dropped) or the prompt ended inside an open `<think>` (its
//    last `<think>` comes after its last `</think>`, as Qwen3-Thinking-2507's and
//    DeepSeek-R1's templates leave it); otherwise all of it is the answer, as Qwen3 with
//    `enable_thinking: false` writes it.
//  - "none": no parsing; everything is the answer.
//
// Either way: reasoning with no `</think>` (the output ended first) is all reasoning; the
// whitespace right after `</think>` is dropped, so the answer does not open with the
// blank line the models write; the tags themselves are never in either part. Tags the
// model writes inside its answer (after the first `</think>`) stay text.
//
// Streaming and the whole response are one code path: the whole response is the parser fed
// the text at once, then Finish. A tag may arrive split across deltas: the parser holds
// back the longest end of its input that could still begin a tag, so the parts of any split
// of the same text concatenate to the same reasoning and the same answer.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace conveyor::scheduler::openai {

enum class ReasoningFormat { kNone, kQwen3, kDeepSeekR1 };

inline constexpr std::string_view kThinkOpenTag = "<think>";
inline constexpr std::string_view kThinkCloseTag = "</think>";
// What ends the reasoning when max_reasoning_tokens runs out (docs/reasoning.md): the
// text Qwen3 and DeepSeek-R1 write between their reasoning and their answer.
inline constexpr std::string_view kReasoningEndText = "\n</think>\n\n";

// "none", "qwen3" or "deepseek_r1" (the names --reasoning_parser takes).
std::string_view ReasoningFormatName(ReasoningFormat format);
// The format named `name`; INVALID_ARGUMENT listing the names for any other.
absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name);
// The parser a chat template's text calls for: no "<think>" in it is none; DeepSeek's
// turn markers ("<｜Assistant｜>") are deepseek_r1; any other template with "<think>"
// (Qwen3, QwQ) is qwen3.
ReasoningFormat GuessReasoningFormat(std::string_view chat_template);

// Where a rendered prompt leaves the `<think>` block.
enum class PromptThinking {
  kNone,    // Neither open nor just closed.
  kOpen,    // Its last <think> comes after its last </think>: the output continues it.
  kClosed,  // It ends with </think> and whitespace: the template turned thinking off.
};
PromptThinking PromptThinkingState(std::string_view prompt);

// One step's worth of output, split.
struct ReasoningDelta {
  std::string reasoning;
  std::string content;
};

class ReasoningParser {
 public:
  // `format` must not be kNone.
  ReasoningParser(ReasoningFormat format, PromptThinking prompt);

  // The parts of `text` that are decided; the rest is held back for the next call.
  ReasoningDelta Feed(std::string_view text);
  // What was held back, once the output has ended.
  ReasoningDelta Finish();
  // Whether the output is inside its reasoning (opened, not yet closed): what the
  // reasoning budget ends by appending kReasoningEndText.
  bool reasoning_open() const {
    return state_ == State::kReasoningStart || state_ == State::kReasoning;
  }

 private:
  enum class State {
    kMaybeOpen,       // Content, unless the output opens with <think> (qwen3).
    kReasoningStart,  // Reasoning; a leading <think> is dropped.
    kReasoning,
    kContentStart,  // Just after </think>: whitespace is dropped.
    kContent,
  };
  State state_;
  std::string held_;  // Text not yet decided.
};

}  // namespace conveyor::scheduler::openai
