#include "scheduler/stream_messages.h"

#include <cstddef>
#include <optional>
#include <span>
#include <string>

#include "common/utf8.h"

namespace conveyor::scheduler {
namespace {

// How far back a logprob's text looks for a token of complete text to decode after.
constexpr size_t kLogprobAnchorTokens = 8;

double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The reason a final message carries. Cancellations, deadlines and errors end with a
// non-OK status and no final message, so the wire needs no values of its own for them.
v1::FinishReason WireFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
    case FinishReason::kDeadline:
    case FinishReason::kError:
      return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_CANCELLED;  // Unreachable: the switch covers every value.
}

}  // namespace

namespace {

// Fills `lp` for `token_id` (and its alternatives) following the tokens `before`.
template <typename Alternatives>
void FillTokenLogprobs(const Tokenizer& tokenizer, std::span<const int32_t> before_tokens,
                       int32_t token_id, float logprob, const Alternatives& alternatives,
                       v1::TokenLogprobs* lp) {
  // The anchor: the latest of the last few tokens before this one whose text is complete.
  std::optional<int32_t> anchor;
  std::string before;
  const size_t known = before_tokens.size() + 1;
  for (size_t k = known - 1; k-- > 0 && known - k <= kLogprobAnchorTokens;) {
    before = tokenizer.Decode({before_tokens[k]});
    if (!before.empty() && ValidUtf8(before) == before &&
        before.find("\xEF\xBF\xBD") == std::string::npos) {
      anchor = before_tokens[k];
      break;
    }
  }
  auto text_in_stream = [&](int32_t candidate) {
    if (!anchor.has_value()) return ValidUtf8(tokenizer.Decode({candidate}));
    std::string both = tokenizer.Decode({*anchor, candidate});
    if (both.compare(0, before.size(), before) == 0) both.erase(0, before.size());
    return ValidUtf8(both);
  };
  lp->mutable_token()->set_token_id(token_id);
  lp->mutable_token()->set_text(text_in_stream(token_id));
  lp->mutable_token()->set_logprob(logprob);
  for (const worker::v1::TokenLogprob& alt : alternatives) {
    v1::TokenLogprob* t = lp->add_top();
    t->set_token_id(alt.token_id());
    t->set_text(text_in_stream(alt.token_id()));
    t->set_logprob(alt.logprob());
  }
}

}  // namespace

void AddTokenLogprobs(const Tokenizer& tokenizer, const Request& r,
                      const worker::v1::SampledToken& token, v1::GenerateResponse* message) {
  const std::span<const int32_t> before(r.tokens.data(), r.num_known_tokens() - 1);
  FillTokenLogprobs(tokenizer, before, token.token_id(), token.logprob(), token.top_logprobs(),
                    message->add_logprobs());
}

void AddPromptLogprob(const Tokenizer& tokenizer, Request& r,
                      const worker::v1::PromptLogprob& scored) {
  // A recomputed prompt (after a preemption) scores its tokens again: kept once.
  if (scored.position() != static_cast<int>(r.scored_prompt.size()) ||
      scored.position() >= r.num_prompt_tokens) {
    return;
  }
  const std::span<const int32_t> before(r.tokens.data(), scored.position());
  FillTokenLogprobs(tokenizer, before, scored.token_id(), scored.logprob(), scored.top_logprobs(),
                    &r.scored_prompt.emplace_back());
}

void CompleteFinalMessage(const Request& r, FinishReason reason, Clock::time_point now,
                          v1::GenerateResponse* last) {
  last->set_finish_reason(WireFinishReason(reason));
  v1::Usage* usage = last->mutable_usage();
  usage->set_prompt_tokens(r.num_prompt_tokens);
  usage->set_generated_tokens(r.num_output_tokens());
  usage->set_cached_prompt_tokens(r.num_cached_prompt_tokens);
  usage->set_queue_time_ms(Millis(r.first_scheduled - r.arrival));
  usage->set_time_to_first_token_ms(Millis(r.first_token - r.arrival));
  usage->set_e2e_latency_ms(Millis(now - r.arrival));
  usage->set_preemptions(r.preemptions);
}

}  // namespace conveyor::scheduler
