#include "scheduler/http/reasoning.h"

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor::scheduler::openai {
namespace {

constexpr std::string_view kWhitespace = " \t\r\n";

// The length of the longest end of `text` that is a proper prefix of `tag`: what may still
// become the tag once more text arrives.
size_t HeldPrefix(std::string_view text, std::string_view tag) {
  for (size_t n = std::min(text.size(), tag.size() - 1); n > 0; --n) {
    if (tag.starts_with(text.substr(text.size() - n))) return n;
  }
  return 0;
}

}  // namespace

std::string_view ReasoningFormatName(ReasoningFormat format) {
  switch (format) {
    case ReasoningFormat::kQwen3:
      return "qwen3";
    case ReasoningFormat::kDeepSeekR1:
      return "deepseek_r1";
    case ReasoningFormat::kNone:
      break;
  }
  return "none";
}

absl::StatusOr<ReasoningFormat> ReasoningFormatFromName(std::string_view name) {
  for (ReasoningFormat format :
       {ReasoningFormat::kNone, ReasoningFormat::kQwen3, ReasoningFormat::kDeepSeekR1}) {
    if (name == ReasoningFormatName(format)) return format;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown reasoning parser '",
                                                 absl::string_view(name.data(), name.size()),
                                                 "'; the parsers are none, qwen3 and "
                                                 "deepseek_r1"));
}

ReasoningFormat GuessReasoningFormat(std::string_view chat_template) {
  // DeepSeek-R1's first templates only strip "</think>" from earlier turns.
  const auto contains = [&](std::string_view s) {
    return chat_template.find(s) != std::string_view::npos;
  };
  if (!contains(kThinkOpenTag) && !contains(kThinkCloseTag)) return ReasoningFormat::kNone;
  return contains("<｜Assistant｜>") ? ReasoningFormat::kDeepSeekR1 : ReasoningFormat::kQwen3;
}

PromptThinking PromptThinkingState(std::string_view prompt) {
  const size_t open = prompt.rfind(kThinkOpenTag);
  const size_t close = prompt.rfind(kThinkCloseTag);
  if (open != std::string_view::npos && (close == std::string_view::npos || open > close)) {
    return PromptThinking::kOpen;
  }
  if (close != std::string_view::npos &&
      prompt.find_first_not_of(kWhitespace, close + kThinkCloseTag.size()) ==
          std::string_view::npos) {
    return PromptThinking::kClosed;
  }
  return PromptThinking::kNone;
}

ReasoningParser::ReasoningParser(ReasoningFormat format, PromptThinking prompt) {
  if (format == ReasoningFormat::kDeepSeekR1) {
    state_ = prompt == PromptThinking::kClosed ? State::kContent : State::kReasoningStart;
  } else {
    state_ = prompt == PromptThinking::kOpen ? State::kReasoningStart : State::kMaybeOpen;
  }
}

ReasoningDelta ReasoningParser::Feed(std::string_view text) {
  held_.append(text);
  ReasoningDelta out;
  for (;;) {
    switch (state_) {
      case State::kMaybeOpen:
      case State::kReasoningStart: {
        const size_t start = held_.find_first_not_of(kWhitespace);
        if (start == std::string::npos) return out;  // Only whitespace so far.
        const std::string_view rest = std::string_view(held_).substr(start);
        if (rest.starts_with(kThinkOpenTag)) {
          held_.erase(0, start + kThinkOpenTag.size());
          state_ = State::kReasoning;
          continue;
        }
        if (kThinkOpenTag.starts_with(rest)) return out;  // Maybe the tag, split.
        // No opening tag: the held text is what the state says it is.
        state_ = state_ == State::kMaybeOpen ? State::kContent : State::kReasoning;
        continue;
      }
      case State::kReasoning: {
        const size_t end = held_.find(kThinkCloseTag);
        if (end != std::string::npos) {
          out.reasoning.append(held_, 0, end);
          held_.erase(0, end + kThinkCloseTag.size());
          state_ = State::kContentStart;
          continue;
        }
        const size_t keep = HeldPrefix(held_, kThinkCloseTag);
        out.reasoning.append(held_, 0, held_.size() - keep);
        held_.erase(0, held_.size() - keep);
        return out;
      }
      case State::kContentStart: {
        const size_t start = held_.find_first_not_of(kWhitespace);
        if (start == std::string::npos) {
          held_.clear();
          return out;
        }
        held_.erase(0, start);
        state_ = State::kContent;
        continue;
      }
      case State::kContent:
        out.content.append(held_);
        held_.clear();
        return out;
    }
  }
}

ReasoningDelta ReasoningParser::Finish() {
  ReasoningDelta out;
  switch (state_) {
    case State::kMaybeOpen:
    case State::kContent:
      out.content = std::move(held_);
      break;
    case State::kReasoningStart:
    case State::kReasoning:
      out.reasoning = std::move(held_);
      break;
    case State::kContentStart:
      break;
  }
  held_.clear();
  return out;
}

}  // namespace conveyor::scheduler::openai
