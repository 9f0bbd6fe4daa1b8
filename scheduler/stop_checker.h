// Decides, token by token, whether a request's generation ends and what text goes out
// with each token: EOS ids, stop token ids, stop strings (through the request's
// detokenizer and StopMatcher), max_new_tokens and the model's context. Also names why a
// request ended (FinishReason), for the final message, metrics and logs.
//
// Pure logic over one Request, apart from the tokenizer its detokenizer decodes with: no
// engine, workers or clients needed to test it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "scheduler/request.h"

namespace conveyor::scheduler {

// Why a request's answer ended. The first three end it with OK and a final message; the
// others with the matching error status (CANCELLED, DEADLINE_EXCEEDED, or the failure).
enum class FinishReason { kLength, kEos, kStop, kCancelled, kDeadline, kError };

// "length", "eos", "stop", "cancelled", "deadline" or "error": the metric label values
// (docs/metrics.md) and what the logs print.
std::string_view FinishReasonName(FinishReason reason);

class StopChecker {
 public:
  // What one sampled token does to its request's stream.
  struct Verdict {
    // Text to stream with the token: well-formed UTF-8, possibly empty (text is held back
    // while it may still become a stop string or completes no character). On a finish
    // other than kStop it includes every byte still held back.
    std::string text;
    // Set when generation ends at this token.
    std::optional<FinishReason> finish;
    // With kStop: the stop string that occurred, or else the stop token id sampled.
    std::string stop_string;
    std::optional<int32_t> stop_token_id;
  };

  // Requests end with kLength once they hold `max_context_tokens` tokens.
  explicit StopChecker(int max_context_tokens) : max_context_tokens_(max_context_tokens) {}

  // Judges the token just sampled for `r`, which must already be the last of r's known
  // tokens (pending ones may follow it).
  // Advances r's detokenizer and stop matcher, so it is called once per token, in order.
  // Precedence: an EOS id (the token adds no text), then a stop token id (nor does it),
  // then a stop string completed by the token's text, then the length limits.
  Verdict Check(Request& r) const;

 private:
  const int max_context_tokens_;
};

}  // namespace conveyor::scheduler
