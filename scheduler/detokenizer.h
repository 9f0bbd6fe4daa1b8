// Turns a request's output tokens into text one token at a time, for streaming.
//
// Decoding each token alone and concatenating is wrong for sentencepiece: a piece's
// leading "▁" is a space except at the start of the text, and a character outside the
// vocabulary arrives as several byte-fallback tokens, which decode to U+FFFD until the
// last one is in. So each step decodes a short window: a prefix whose text was already
// streamed (or is prompt context), then the tokens not yet streamed; it emits what the
// window adds to the prefix's text once that no longer ends in U+FFFD. A step costs
// O(window), not O(output so far).
//
// The prefix must only reproduce what carries over from one token to the next in
// sentencepiece's Decode: whether text came before (the leading space) and an unfinished
// byte sequence. Once the text is past its start and ends in a complete character, the
// prefix is the *anchor*: one token, found among the first streamed ones and checked
// once, that decodes to the same complete, non-empty text at the start of any window. A
// step then decodes [anchor, new token]: one Decode call of two tokens. Until then (at
// the text's start, or while no token qualifies) the prefix is the tokens just streamed,
// as in vLLM, and their decoded size costs a second call per emission.
//
// The same holds for tokenizer.json tokenizers. Metaspace ones (Llama 2, Mistral) render
// like sentencepiece. Byte-level BPE (GPT-2, Llama 3, Qwen2) decodes a token the same
// anywhere, except that a character's bytes may span tokens (held back while the text
// ends in U+FFFD); its anchor is a token that decodes, twice over, to its own text twice.
// One case cannot stream exactly: HF's ByteFallback decoder renders a whole run of byte
// tokens as U+FFFD once any byte in it is stray, so an ill-formed run (which no
// tokenizer produces; a model may) turns text already streamed from that run into U+FFFD
// in the full decode. The stream stays valid UTF-8; only such garbage differs.
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "text/tokenizer.h"

namespace conveyor::scheduler {

class IncrementalDetokenizer {
 public:
  // Prompt tokens kept as decoding context: enough that the first output token renders
  // as it would mid-text (e.g. keeps its leading space).
  static constexpr size_t kContextTokens = 5;

  // `tokenizer` must outlive this object. The last kContextTokens tokens of `prompt`
  // are context only, never emitted. Context that ends inside a character (a token-id
  // prompt can) is trimmed to its last whole character; the output's remaining bytes of
  // that character then come out as U+FFFD. Context that would be trimmed away entirely
  // that way (it starts inside a character and is all bytes, as HF's ByteFallback renders
  // such a run) is cut from the front instead.
  IncrementalDetokenizer(const Tokenizer* tokenizer, std::span<const int> prompt);

  // Adds one output token and returns the text it completes: empty while the newest
  // character is incomplete, never part of a multi-byte character.
  std::string Append(int token_id);

  // Returns the text still held back, once generation has ended. Bytes of a character
  // that never completed come out as U+FFFD, as Tokenizer::Decode renders them. All
  // Append results followed by Flush's equal the text of the output tokens decoded in
  // context.
  std::string Flush();

  // Tokens decoded per step, less the new one and the anchor: those held back, and
  // until an anchor is found those of the latest emission. It does not grow with the
  // output, only with a run of tokens that adds no text or ends in U+FFFD (stray bytes
  // that never form a character).
  size_t window_tokens() const { return window_.size() - (anchored_ ? 1 : 0); }

  // Tokenizer::Decode calls so far, the constructor's included. Past the first emissions
  // it grows by one per Append, except while no anchor has been found (an output of
  // byte-fallback tokens only), when an Append that emits text costs two.
  size_t decode_calls() const { return decode_calls_; }

 private:
  // Decode calls spent checking anchor candidates, at most: bounds the cost where no
  // token qualifies.
  static constexpr int kAnchorProbes = 4;

  std::string DecodeWindow();
  // Returns what `window_text`, the window's decode, adds to the prefix, and restarts
  // the window at the tokens that added it.
  std::string TakeNewText(const std::string& window_text);
  // Looks for an anchor among the window's tokens from `candidates` on, unless one is
  // known; returns whether one is.
  bool FindAnchor(std::vector<int>::const_iterator candidates);

  const Tokenizer* tokenizer_;
  // Tokens from the window's start on: the anchor if anchored_, the rest of the prefix
  // (streamed tokens still needed as context), then the tokens not yet streamed.
  std::vector<int> window_;
  // Prefix tokens, the anchor included.
  size_t prefix_tokens_;
  // Size of the prefix's decode; the window's decode starts with it.
  size_t prefix_text_bytes_;
  // Whether the prefix decodes to non-empty text that ends in a complete character:
  // tokens after it then decode as they would anywhere after such text.
  bool prefix_text_complete_;
  // A token that decodes alone to `anchor_text_bytes_` (> 0) bytes of complete text and
  // is an ordinary piece (no byte-fallback or control token; a sentencepiece-style piece,
  // or one that decodes the same wherever it stands), so it renders the same at the
  // start of any window and the tokens behind it decode as mid-text; -1 while none is
  // known.
  int anchor_id_ = -1;
  size_t anchor_text_bytes_ = 0;
  int anchor_probes_left_ = kAnchorProbes;
  // Whether window_ starts with the anchor.
  bool anchored_ = false;
  size_t decode_calls_ = 0;
};

}  // namespace conveyor::scheduler
