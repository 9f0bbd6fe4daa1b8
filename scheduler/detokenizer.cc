#include "scheduler/detokenizer.h"

#include <algorithm>
#include <cstddef>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/string_view.h"
#include "common/utf8.h"

namespace conveyor::scheduler {
namespace {

// What sentencepiece decodes each byte of an incomplete or invalid UTF-8 sequence to.
constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";
// sentencepiece's word-boundary marker "▁", which decodes to a space.
constexpr absl::string_view kSpaceSymbol = "\xE2\x96\x81";

std::vector<int> LastTokens(std::span<const int> tokens, size_t count) {
  const std::span<const int> last = tokens.last(std::min(tokens.size(), count));
  return {last.begin(), last.end()};
}

// Whether a token with this piece is not worth a Decode call to check as an anchor: it
// has no piece (outside the vocabulary), or one in angle brackets, as byte-fallback
// ("<0xE4>") and control ("</s>") pieces do. Only saves calls: FindAnchor decides.
bool SkipAsAnchor(std::string_view piece) {
  return piece.empty() || (piece.front() == '<' && piece.back() == '>');
}

}  // namespace

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer* tokenizer,
                                               std::span<const int> prompt)
    : tokenizer_(tokenizer), window_(LastTokens(prompt, kContextTokens)) {
  // A prompt ending inside a character (possible with token-id prompts) would let the
  // output's bytes rewrite the context's text; keep only context that decodes whole.
  std::string text = DecodeWindow();
  const std::vector<int> context = window_;
  while (text.ends_with(kReplacementChar)) {
    window_.pop_back();
    text = DecodeWindow();
  }
  if (window_.empty() && !context.empty()) {
    // All of it decodes to U+FFFD: the context starts inside a character whose bytes
    // continue to its end (HF's ByteFallback turns a whole run of bytes into U+FFFD
    // when any is stray). Cut from the front instead, keeping the context's end, which
    // decides how the first output token renders (e.g. its leading space).
    window_ = context;
    text = DecodeWindow();
    while (!window_.empty() && text.starts_with(kReplacementChar)) {
      window_.erase(window_.begin());
      text = DecodeWindow();
    }
    while (text.ends_with(kReplacementChar)) {
      window_.pop_back();
      text = DecodeWindow();
    }
  }
  prefix_tokens_ = window_.size();
  prefix_text_bytes_ = text.size();
  prefix_text_complete_ = !text.empty();
}

std::string IncrementalDetokenizer::Append(int token_id) {
  window_.push_back(token_id);
  const std::string text = DecodeWindow();
  // A trailing U+FFFD may be a character whose last bytes are yet to come.
  if (text.ends_with(kReplacementChar)) return "";
  return TakeNewText(text);
}

std::string IncrementalDetokenizer::Flush() { return TakeNewText(DecodeWindow()); }

std::string IncrementalDetokenizer::DecodeWindow() {
  if (window_.empty()) return "";
  ++decode_calls_;
  return tokenizer_->Decode(window_);
}

std::string IncrementalDetokenizer::TakeNewText(const std::string& window_text) {
  // HF's ByteFallback can rewrite the prefix's text (an ill-formed run of byte tokens
  // becomes U+FFFD per byte; see the header), so the cut at the prefix's size may fall
  // inside a character: start at the next one, so that the stream stays valid UTF-8.
  const size_t begin = NextCharStart(window_text, prefix_text_bytes_);
  if (window_text.size() <= begin) return "";
  std::string new_text = window_text.substr(begin);
  const bool new_text_complete = !new_text.ends_with(kReplacementChar);
  const auto streamed = window_.begin() + static_cast<std::ptrdiff_t>(prefix_tokens_);
  if (prefix_text_complete_ && FindAnchor(streamed)) {
    // The new tokens followed complete, non-empty text, so they rendered as they would
    // behind the anchor: pieces keep their leading space, and bytes start a new UTF-8
    // sequence.
    if (new_text_complete) {
      // Ending in a complete character, they leave nothing to the next token that the
      // anchor's text does not: drop them.
      window_.assign(1, anchor_id_);
      prefix_text_bytes_ = anchor_text_bytes_;
    } else {
      // Flush cut a character short: later bytes may still join it, so keep them.
      window_.erase(window_.begin() + (anchored_ ? 1 : 0), streamed);
      if (!anchored_) window_.insert(window_.begin(), anchor_id_);
      prefix_text_bytes_ = anchor_text_bytes_ + new_text.size();
    }
    anchored_ = true;
    prefix_text_complete_ = new_text_complete;
  } else {
    // At the text's start (the new tokens may have lost a leading space that later ones
    // keep) or with no anchor: the new tokens alone are context enough for the next one,
    // as all sentencepiece renders differently at a text's start is leading spaces, once
    // they decode to some text. Their decoded size takes a second Decode call.
    const std::vector<int> streamed_tokens(streamed, window_.end());
    ++decode_calls_;
    const std::string streamed_text = tokenizer_->Decode(streamed_tokens);
    if (streamed_text.empty()) {
      // Alone they decode to nothing (a lone "▁" is stripped at a text's start), so the
      // next token would render at the text's start behind them, and with
      // remove_extra_whitespaces lose its leading space too: keep the whole window, whose
      // decode is known.
      prefix_text_bytes_ = window_text.size();
      prefix_text_complete_ = new_text_complete;
    } else {
      window_ = streamed_tokens;
      anchored_ = false;
      prefix_text_bytes_ = streamed_text.size();
      prefix_text_complete_ = !streamed_text.ends_with(kReplacementChar);
    }
  }
  prefix_tokens_ = window_.size();
  return new_text;
}

bool IncrementalDetokenizer::FindAnchor(std::vector<int>::const_iterator candidates) {
  if (anchor_id_ >= 0) return true;
  // The candidates are the tokens just streamed, newest first: usually plain text.
  for (auto it = window_.cend(); it != candidates && anchor_probes_left_ > 0;) {
    const int id = *--it;
    const std::string piece = tokenizer_->Piece(id);
    if (SkipAsAnchor(piece)) continue;
    --anchor_probes_left_;
    ++decode_calls_;
    const std::string text = tokenizer_->Decode({id});
    // Decoded alone, an ordinary piece is its piece with "▁" as spaces, less the leading
    // one at the text's start. Byte-fallback, control and unknown tokens decode to other
    // text (or none); a token that decodes to nothing would not end the text's start.
    if (text.empty() || text.find(kReplacementChar) != std::string::npos) continue;
    const std::string spaced = absl::StrReplaceAll(piece, {{kSpaceSymbol, " "}});
    if (spaced != text && spaced != absl::StrCat(" ", text)) {
      // Not a sentencepiece-style piece. Byte-level BPE (GPT-2, Llama 3, Qwen2 pieces
      // such as "Ġworld") decodes the same at the start as anywhere: a token that renders
      // twice as its own text twice over is one, and tokens behind it render as mid-text.
      if (anchor_probes_left_ == 0) break;
      --anchor_probes_left_;
      ++decode_calls_;
      if (tokenizer_->Decode({id, id}) != absl::StrCat(text, text)) continue;
    }
    anchor_id_ = id;
    anchor_text_bytes_ = text.size();
    return true;
  }
  return false;
}

}  // namespace conveyor::scheduler
