#include "scheduler/request_builder.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/utf8.h"
#include "rpc/sampling_params_wire.h"
#include "scheduler/output_constraint.h"

namespace conveyor::scheduler {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// The request's sampling fields over SamplingParams' defaults, validated, on the wire.
absl::Status FillSampling(const v1::GenerateRequest& p, const ServingLimits& limits,
                          worker::v1::SamplingParams* s) {
  SamplingParams params;
  if (p.has_temperature()) params.temperature = p.temperature();
  if (p.has_top_k()) params.top_k = p.top_k();
  if (p.has_top_p()) params.top_p = p.top_p();
  if (p.has_min_p()) params.min_p = p.min_p();
  if (p.has_repetition_penalty()) params.repetition_penalty = p.repetition_penalty();
  if (p.has_presence_penalty()) params.presence_penalty = p.presence_penalty();
  if (p.has_frequency_penalty()) params.frequency_penalty = p.frequency_penalty();
  params.num_logprobs = p.logprobs();
  params.logit_bias.assign(p.logit_bias().begin(), p.logit_bias().end());
  std::sort(params.logit_bias.begin(), params.logit_bias.end());  // A map has no order.
  for (const auto& [token, bias] : params.logit_bias) {
    if (token < 0 || token >= limits.vocab_size) {
      return Invalid(absl::StrCat("logit_bias names token ", token, ", outside the vocabulary [0, ",
                                  limits.vocab_size, ")"));
    }
  }
  if (p.has_seed()) {
    params.seed = p.seed();
  } else {
    static thread_local std::mt19937_64 rng(std::random_device{}());
    params.seed = rng();
  }
  RETURN_IF_ERROR(ValidateSamplingParams(params, limits.max_logprobs));
  *s = ToWire(params);
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckPromptBytes(size_t bytes, const ServingLimits& limits) {
  if (bytes <= static_cast<size_t>(limits.max_context_tokens) * kMaxPromptBytesPerToken) {
    return absl::OkStatus();
  }
  return Invalid(absl::StrCat("text is ", bytes, " bytes: more than a context of ",
                              limits.max_context_tokens, " tokens can hold; shorten the prompt"));
}

absl::StatusOr<std::unique_ptr<Request>> BuildRequest(const v1::GenerateRequest& p,
                                                      const ServingLimits& limits,
                                                      const Tokenizer& tokenizer) {
  // Bounds first, before anything costs in proportion to the input.
  if (p.request_id().size() > kMaxRequestIdBytes) {
    return Invalid(absl::StrCat("request_id is ", p.request_id().size(), " bytes; at most ",
                                kMaxRequestIdBytes, " are echoed back"));
  }
  if (p.prompt_case() == v1::GenerateRequest::kText) {
    RETURN_IF_ERROR(CheckPromptBytes(p.text().size(), limits));
  }
  auto r = std::make_unique<Request>();
  switch (p.prompt_case()) {
    case v1::GenerateRequest::kText: {
      if (p.text().empty()) return Invalid("text is empty; give a prompt");
      // The tokenizer frames the text as the model was trained (BOS for Llama, nothing
      // for Qwen2) unless add_bos is false.
      const bool add_special = !p.has_add_bos() || p.add_bos();
      ASSIGN_OR_RETURN(std::vector<int> ids, add_special
                                                 ? tokenizer.EncodeWithSpecialTokens(p.text())
                                                 : tokenizer.Encode(p.text()));
      r->tokens.assign(ids.begin(), ids.end());
      break;
    }
    case v1::GenerateRequest::kTokenIds:
      for (int32_t id : p.token_ids().ids()) {
        if (id < 0 || id >= limits.vocab_size) {
          return Invalid(absl::StrCat("token_ids holds ", id, ", outside the vocabulary [0, ",
                                      limits.vocab_size, ")"));
        }
      }
      // Token ids are used as given, unless the client asks for a BOS explicitly.
      if (p.has_add_bos() && p.add_bos()) {
        if (limits.bos_token_id < 0) {
          return Invalid("add_bos is true but the model has no BOS token; leave it unset");
        }
        if (p.token_ids().ids().empty() || p.token_ids().ids(0) != limits.bos_token_id) {
          r->tokens.push_back(limits.bos_token_id);
        }
      }
      r->tokens.insert(r->tokens.end(), p.token_ids().ids().begin(), p.token_ids().ids().end());
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
  if (p.has_constraint()) {
    if (p.ignore_eos()) {
      return Invalid(
          "ignore_eos cannot be combined with a constraint: EOS is how a "
          "constrained output ends");
    }
    absl::StatusOr<std::shared_ptr<const std::string>> grammar = CompileConstraint(p.constraint());
    if (!grammar.ok()) {
      return absl::Status(grammar.status().code(),
                          absl::StrCat("constraint: ", grammar.status().message()));
    }
    r->grammar = *std::move(grammar);
  }
  if (!p.ignore_eos()) r->eos_token_ids = limits.eos_token_ids;
  r->num_logprobs = p.logprobs();
  if (p.has_prompt_logprobs()) {
    if (p.prompt_logprobs() < 0 || p.prompt_logprobs() > limits.max_logprobs) {
      return Invalid(absl::StrCat("prompt_logprobs must be in [0, ", limits.max_logprobs, "], got ",
                                  p.prompt_logprobs()));
    }
    r->prompt_logprobs = p.prompt_logprobs();
    // The first token's entry: nothing before it to score it by.
    v1::TokenLogprob* first = r->scored_prompt.emplace_back().mutable_token();
    first->set_token_id(r->tokens[0]);
    first->set_text(ValidUtf8(tokenizer.Decode({r->tokens[0]})));
  }
  r->priority = p.priority();
  r->request_id = p.request_id();

  // The detokenizer keeps the prompt's last few tokens as context for the first output's
  // spacing (IncrementalDetokenizer::kContextTokens).
  r->detokenizer = std::make_unique<IncrementalDetokenizer>(
      &tokenizer, std::span<const int>(r->tokens.data(), r->num_prompt_tokens));
  r->stop_matcher = std::make_unique<StopMatcher>(std::move(stops));
  return r;
}

absl::StatusOr<std::vector<std::unique_ptr<Request>>> BuildChoices(const v1::GenerateRequest& p,
                                                                   const ServingLimits& limits,
                                                                   const Tokenizer& tokenizer) {
  const int n = p.has_n() ? p.n() : 1;
  if (n < 1 || n > kMaxChoices) {
    return Invalid(absl::StrCat("n must be in [1, ", kMaxChoices, "], got ", n));
  }
  std::vector<std::unique_ptr<Request>> choices;
  ASSIGN_OR_RETURN(choices.emplace_back(), BuildRequest(p, limits, tokenizer));
  const Request& first = *choices.front();
  if (n == 1) return choices;
  // The other choices from the first one's tokens (no second tokenization) and grammar
  // (no second compilation).
  v1::GenerateRequest other = p;
  other.clear_constraint();
  other.clear_add_bos();
  other.mutable_token_ids()->mutable_ids()->Assign(first.tokens.begin(), first.tokens.end());
  for (int i = 1; i < n; ++i) {
    other.set_seed(first.sampling.seed() + static_cast<uint64_t>(i));
    ASSIGN_OR_RETURN(choices.emplace_back(), BuildRequest(other, limits, tokenizer));
    choices.back()->grammar = first.grammar;
  }
  return choices;
}

}  // namespace conveyor::scheduler
