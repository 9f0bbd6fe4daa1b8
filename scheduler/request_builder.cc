#include "scheduler/request_builder.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::scheduler {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// Checks an optional float field against [lo, hi] (open at lo when lo_open).
absl::Status CheckRange(const char* field, bool has, float value, float lo, float hi,
                        bool lo_open = false) {
  if (!has) return absl::OkStatus();
  const bool ok = std::isfinite(value) && (lo_open ? value > lo : value >= lo) && value <= hi;
  if (ok) return absl::OkStatus();
  return Invalid(
      absl::StrCat(field, " must be in ", lo_open ? "(" : "[", lo, ", ", hi, "], got ", value));
}

absl::Status FillSampling(const v1::GenerateRequest& p, const ServingLimits& limits,
                          worker::v1::SamplingParams* s) {
  RETURN_IF_ERROR(CheckRange("temperature", p.has_temperature(), p.temperature(), 0, 100));
  RETURN_IF_ERROR(CheckRange("top_p", p.has_top_p(), p.top_p(), 0, 1, /*lo_open=*/true));
  RETURN_IF_ERROR(CheckRange("min_p", p.has_min_p(), p.min_p(), 0, 1));
  RETURN_IF_ERROR(CheckRange("repetition_penalty", p.has_repetition_penalty(),
                             p.repetition_penalty(), 0, 100, /*lo_open=*/true));
  RETURN_IF_ERROR(
      CheckRange("presence_penalty", p.has_presence_penalty(), p.presence_penalty(), -2, 2));
  RETURN_IF_ERROR(
      CheckRange("frequency_penalty", p.has_frequency_penalty(), p.frequency_penalty(), -2, 2));
  if (p.has_top_k() && p.top_k() < 0) {
    return Invalid(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k()));
  }
  if (p.logprobs() < 0 || p.logprobs() > limits.max_logprobs) {
    return Invalid(
        absl::StrCat("logprobs must be in [0, ", limits.max_logprobs, "], got ", p.logprobs()));
  }
  s->set_temperature(p.has_temperature() ? p.temperature() : 1.0f);
  s->set_top_k(p.top_k());
  s->set_top_p(p.has_top_p() ? p.top_p() : 1.0f);
  s->set_min_p(p.min_p());
  s->set_repetition_penalty(p.has_repetition_penalty() ? p.repetition_penalty() : 1.0f);
  s->set_presence_penalty(p.presence_penalty());
  s->set_frequency_penalty(p.frequency_penalty());
  if (p.has_seed()) {
    s->set_seed(p.seed());
  } else {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    s->set_seed(rng());
  }
  s->set_num_logprobs(p.logprobs());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Request>> BuildRequest(const v1::GenerateRequest& p,
                                                      const ServingLimits& limits,
                                                      const Tokenizer& tokenizer) {
  auto r = std::make_unique<Request>();
  const bool add_bos = !p.has_add_bos() || p.add_bos();
  switch (p.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (p.text().empty()) return Invalid("text is empty; give a prompt");
      ASSIGN_OR_RETURN(std::vector<int> ids, tokenizer.Encode(p.text()));
      if (add_bos && limits.bos_token_id >= 0) r->tokens.push_back(limits.bos_token_id);
      r->tokens.insert(r->tokens.end(), ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      for (int32_t id : p.token_ids().ids()) {
        if (id < 0 || id >= limits.vocab_size) {
          return Invalid(absl::StrCat("token_ids holds ", id, ", outside the vocabulary [0, ",
                                      limits.vocab_size, ")"));
        }
      }
      r->tokens.assign(p.token_ids().ids().begin(), p.token_ids().ids().end());
      break;
    case v1::GenerateRequest::PROMPT_NOT_SET:
      break;
  }
  if (r->tokens.empty()) return Invalid("the prompt is empty; set text or token_ids");
  r->num_prompt_tokens = r->num_tokens();
  if (r->num_prompt_tokens >= limits.max_context_tokens) {
    return Invalid(absl::StrCat("the prompt has ", r->num_prompt_tokens,
                                " tokens; the model's context is ", limits.max_context_tokens,
                                " tokens, and at least one must be left to generate"));
  }

  if (p.has_max_new_tokens() && p.max_new_tokens() < 1) {
    return Invalid(absl::StrCat("max_new_tokens must be >= 1, got ", p.max_new_tokens()));
  }
  const int room = limits.max_context_tokens - r->num_prompt_tokens;
  if (p.has_max_new_tokens() && p.max_new_tokens() > room) {
    return Invalid(absl::StrCat("prompt (", r->num_prompt_tokens, " tokens) + max_new_tokens (",
                                p.max_new_tokens(), ") exceeds the model's context of ",
                                limits.max_context_tokens, " tokens"));
  }
  r->max_new_tokens =
      p.has_max_new_tokens() ? p.max_new_tokens() : std::min(limits.default_max_new_tokens, room);
  if (r->num_prompt_tokens + r->max_new_tokens > limits.kv_capacity_tokens) {
    return Invalid(absl::StrCat("prompt (", r->num_prompt_tokens, " tokens) + max_new_tokens (",
                                r->max_new_tokens, ") needs more KV cache than the server has (",
                                limits.kv_capacity_tokens, " tokens); lower max_new_tokens"));
  }

  RETURN_IF_ERROR(FillSampling(p, limits, &r->sampling));

  if (p.stop_size() > limits.max_stop_strings) {
    return Invalid(absl::StrCat("stop holds ", p.stop_size(), " strings; at most ",
                                limits.max_stop_strings, " are allowed"));
  }
  std::vector<std::string> stops;
  for (const std::string& s : p.stop()) {
    if (s.empty()) return Invalid("stop holds an empty string");
    if (static_cast<int>(s.size()) > limits.max_stop_string_bytes) {
      return Invalid(
          absl::StrCat("stop strings are limited to ", limits.max_stop_string_bytes, " bytes"));
    }
    stops.push_back(s);
  }
  for (int32_t id : p.stop_token_ids()) {
    if (id < 0 || id >= limits.vocab_size) {
      return Invalid(absl::StrCat("stop_token_ids holds ", id, ", outside the vocabulary [0, ",
                                  limits.vocab_size, ")"));
    }
  }
  r->stop_token_ids.assign(p.stop_token_ids().begin(), p.stop_token_ids().end());
  if (!p.ignore_eos()) r->eos_token_ids = limits.eos_token_ids;
  r->num_logprobs = p.logprobs();
  r->priority = p.priority();
  r->request_id = p.request_id();

  // A few prompt tokens give the detokenizer the context for the first output's spacing.
  constexpr int kDetokenizerContext = 4;
  const int context = std::min(kDetokenizerContext, r->num_prompt_tokens);
  r->detokenizer = std::make_unique<IncrementalDetokenizer>(
      &tokenizer, std::span<const int>(r->tokens.data() + r->num_prompt_tokens - context, context));
  r->stop_matcher = std::make_unique<StopMatcher>(std::move(stops));
  return r;
}

}  // namespace conveyor::scheduler
