#include "scheduler/detokenizer.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

namespace conveyor::scheduler {
namespace {

// What sentencepiece decodes each byte of an incomplete or invalid UTF-8 sequence to.
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";

std::vector<int> LastTokens(std::span<const int> tokens, size_t count) {
  const std::span<const int> last = tokens.last(std::min(tokens.size(), count));
  return {last.begin(), last.end()};
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               std::span<const int> prompt)
    : tokenizer_(tokenizer),
      window_(LastTokens(prompt, kContextTokens)),
      prefix_tokens_(0),
      prefix_text_bytes_(0) {
  // A prompt ending inside a character (possible with token-id prompts) would let the
  // output's bytes rewrite the context's text; keep only context that decodes whole.
  while (!window_.empty() && tokenizer_->Decode(window_).ends_with(kReplacementChar)) {
    window_.pop_back();
  }
  prefix_tokens_ = window_.size();
  prefix_text_bytes_ = tokenizer_->Decode(window_).size();
}

std::string IncrementalDetokenizer::Append(int token_id) {
  window_.push_back(token_id);
  const std::string text = tokenizer_->Decode(window_);
  // A trailing U+FFFD may be a character whose last bytes are yet to come.
  if (text.ends_with(kReplacementChar)) return "";
  return TakeNewText(text);
}

std::string IncrementalDetokenizer::Flush() { return TakeNewText(tokenizer_->Decode(window_)); }

std::string IncrementalDetokenizer::TakeNewText(const std::string& window_text) {
  if (window_text.size() <= prefix_text_bytes_) return "";
  std::string new_text = window_text.substr(prefix_text_bytes_);
  // The tokens just streamed are context enough for the next token to decode as it would
  // mid-text: all sentencepiece renders differently at a text's start is the first
  // piece's leading space (0.1.97 drops it once, even from a lone "▁" piece).
  window_.erase(window_.begin(), window_.begin() + static_cast<std::ptrdiff_t>(prefix_tokens_));
  prefix_tokens_ = window_.size();
  prefix_text_bytes_ = tokenizer_->Decode(window_).size();
  return new_text;
}

}  // namespace conveyor::scheduler
