// What a request's stream carries beside its text (which the detokenizer and the stop
// checker produce): each token's logprobs, with the text each candidate would show in the
// stream at that point, and the final message's finish reason and usage.
#pragma once

#include "conveyor.pb.h"
#include "scheduler/request.h"
#include "scheduler/stop_checker.h"
#include "text/tokenizer.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

// Adds the logprobs of `token`, the latest of r's known tokens, to `message`: the
// token's and each top alternative's id, logprob and text. A candidate's text is what it
// would add to the stream here: decoded after an earlier token of complete text (the
// latest of the last few), so that a sentencepiece "▁f" reads " f" mid-text; always valid
// UTF-8 (a byte-fallback piece alone reads as U+FFFD).
void AddTokenLogprobs(const Tokenizer& tokenizer, const Request& r,
                      const worker::v1::SampledToken& token, v1::GenerateResponse* message);

// Adds the scored prompt token `scored` to r.scored_prompt (GenerateResponse.prompt_logprobs),
// with texts as AddTokenLogprobs's (the request builder added the first prompt token's entry,
// which has no logprob). Tokens scored again (a recomputed prompt) are kept once.
void AddPromptLogprob(const Tokenizer& tokenizer, Request& r,
                      const worker::v1::PromptLogprob& scored);

// Completes the final message of a request that ended well (`reason` is kLength, kEos or
// kStop): the reason on the wire and the usage, timed up to `now`.
void CompleteFinalMessage(const Request& r, FinishReason reason, Clock::time_point now,
                          v1::GenerateResponse* last);

}  // namespace conveyor::scheduler
