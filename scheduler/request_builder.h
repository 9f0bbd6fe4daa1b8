// Turns a client's GenerateRequest into a scheduler Request, checking every field
// against the model and the server's limits. Each rejection is INVALID_ARGUMENT with a
// message that names the field and the allowed range.
#pragma once

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "conveyor.pb.h"
#include "scheduler/request.h"
#include "text/tokenizer.h"

namespace conveyor::scheduler {

struct ServingLimits {
  int vocab_size = 0;
  int max_context_tokens = 0;
  // Tokens the KV cache can hold for one sequence (all blocks).
  int kv_capacity_tokens = 0;
  std::vector<int32_t> eos_token_ids;
  int bos_token_id = -1;
  int default_max_new_tokens = 256;
  int max_stop_strings = 16;
  int max_stop_string_bytes = 256;
  int max_logprobs = 20;
};

// Longest request_id accepted (it is echoed in every streamed message).
inline constexpr size_t kMaxRequestIdBytes = 256;
// A text prompt longer than max_context_tokens times this many bytes cannot fit the
// context whatever the tokenizer: it is refused before tokenizing. Generous (a token of
// real text is a few bytes), so that only prompts that cannot fit are refused this way.
inline constexpr size_t kMaxPromptBytesPerToken = 32;

// OK, or INVALID_ARGUMENT if a text of `bytes` bytes cannot fit the context of `limits`
// whatever the tokenizer (kMaxPromptBytesPerToken): checked before tokenizing.
absl::Status CheckPromptBytes(size_t bytes, const ServingLimits& limits);

// Validates `proto` and builds the request (tokens, sampling, stopping). Does not set
// id, arrival, deadline or sink.
absl::StatusOr<std::unique_ptr<Request>> BuildRequest(const v1::GenerateRequest& proto,
                                                      const ServingLimits& limits,
                                                      const Tokenizer& tokenizer);

// Most choices one request may ask for (GenerateRequest.n).
inline constexpr int kMaxChoices = 128;

// As BuildRequest, for each of the request's n choices: the same prompt and parameters;
// choice i samples with the first's seed + i.
absl::StatusOr<std::vector<std::unique_ptr<Request>>> BuildChoices(const v1::GenerateRequest& proto,
                                                                   const ServingLimits& limits,
                                                                   const Tokenizer& tokenizer);

}  // namespace conveyor::scheduler
