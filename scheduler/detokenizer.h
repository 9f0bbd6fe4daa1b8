// Turns a request's output tokens into text one token at a time, for streaming.
//
// Decoding each token alone and concatenating is wrong for sentencepiece: a piece's
// leading "▁" is a space except at the start of the text, and a character outside the
// vocabulary arrives as several byte-fallback tokens, which decode to U+FFFD until the
// last one is in. So each step decodes a short window of recent tokens, whose front
// part ("prefix") was already streamed, and emits what the window adds to the prefix
// once it no longer ends in U+FFFD. After each emission the window starts where the
// newly streamed tokens start, so a step costs O(window), not O(output so far).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "common/tokenizer.h"

namespace conveyor::scheduler {

class IncrementalDetokenizer {
 public:
  // Prompt tokens kept as decoding context: enough that the first output token renders
  // as it would mid-text (e.g. keeps its leading space).
  static constexpr size_t kContextTokens = 5;

  // `tokenizer` must outlive this object. The last kContextTokens tokens of `prompt`
  // are context only, never emitted. Context that ends inside a character (a token-id
  // prompt can) is trimmed to its last whole character; the output's remaining bytes of
  // that character then come out as U+FFFD.
  IncrementalDetokenizer(const Tokenizer* tokenizer, std::span<const int> prompt);

  // Adds one output token and returns the text it completes: empty while the newest
  // character is incomplete, never part of a multi-byte character.
  std::string Append(int token_id);

  // Returns the text still held back, once generation has ended. Bytes of a character
  // that never completed come out as U+FFFD, as Tokenizer::Decode renders them. All
  // Append results followed by Flush's equal the text of the output tokens decoded in
  // context.
  std::string Flush();

  // Tokens decoded per step, less the new one: those of the latest emission and those
  // held back. It does not grow with the output, only with a run of tokens that adds no
  // text or ends in U+FFFD (stray bytes that never form a character).
  size_t window_tokens() const { return window_.size(); }

 private:
  // Returns what `window_text`, the window's decode, adds to the prefix, and restarts
  // the window at the tokens that added it.
  std::string TakeNewText(const std::string& window_text);

  const Tokenizer* tokenizer_;
  // Tokens from the window's start on: first the prefix, then those not yet streamed.
  std::vector<int> window_;
  size_t prefix_tokens_;
  // Size of the prefix's decode; the window's decode starts with it.
  size_t prefix_text_bytes_;
};

}  // namespace conveyor::scheduler
