// How a sequence's next token is drawn from its logits. This is the one validated form:
// the scheduler fills it from a client's request (unset fields keep the defaults below)
// and checks it with ValidateSamplingParams; the step protocol carries it
// (rpc/sampling_params_wire.h); the worker checks it again with the same function
// (it trusts no peer) and its samplers read it.
#pragma once

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace conveyor {

inline constexpr int kMaxLogitBias = 1024;

struct SamplingParams {
  float temperature = 1.0f;         // 0: greedy (argmax). In [0, 100].
  int top_k = 0;                    // 0: off. >= 0.
  float top_p = 1.0f;               // 1: off. In (0, 1].
  float min_p = 0.0f;               // 0: off. In [0, 1].
  float repetition_penalty = 1.0f;  // 1: off. HF semantics over prompt + output. In (0, 100].
  float presence_penalty = 0.0f;    // 0: off. OpenAI semantics over output. In [-2, 2].
  float frequency_penalty = 0.0f;   // 0: off. OpenAI semantics over output. In [-2, 2].
  // Draw n of a sequence depends only on (seed, n): a recomputed sequence (preempted, or
  // resumed after a worker failure) draws what it would have drawn.
  uint64_t seed = 0;
  int num_logprobs = 0;  // Top alternatives to report with each token; 0: none.
  // Added to a token's logit before any other transform (OpenAI's logit_bias): -100 bans
  // it in practice, +100 forces it. Sorted by id, each id once, values in [-100, 100], at
  // most kMaxLogitBias entries; ids must be in the vocabulary (checked where it is known).
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool is_greedy() const { return temperature == 0.0f; }
};

// OK, or INVALID_ARGUMENT naming the first field outside its range (as in the comments
// above; num_logprobs up to `max_logprobs`) and the value it has.
inline absl::Status ValidateSamplingParams(const SamplingParams& p, int max_logprobs) {
  struct Range {
    const char* field;
    float value;
    float lo, hi;
    bool lo_open;
  };
  for (const Range& r : {Range{"temperature", p.temperature, 0, 100, false},
                         Range{"top_p", p.top_p, 0, 1, true}, Range{"min_p", p.min_p, 0, 1, false},
                         Range{"repetition_penalty", p.repetition_penalty, 0, 100, true},
                         Range{"presence_penalty", p.presence_penalty, -2, 2, false},
                         Range{"frequency_penalty", p.frequency_penalty, -2, 2, false}}) {
    const bool ok =
        std::isfinite(r.value) && (r.lo_open ? r.value > r.lo : r.value >= r.lo) && r.value <= r.hi;
    if (!ok) {
      return absl::InvalidArgumentError(absl::StrCat(r.field, " must be in ", r.lo_open ? "(" : "[",
                                                     r.lo, ", ", r.hi, "], got ", r.value));
    }
  }
  if (p.logit_bias.size() > static_cast<size_t>(kMaxLogitBias)) {
    return absl::InvalidArgumentError(absl::StrCat("logit_bias holds ", p.logit_bias.size(),
                                                   " entries, above the limit of ", kMaxLogitBias));
  }
  for (size_t i = 0; i < p.logit_bias.size(); ++i) {
    const auto [token, bias] = p.logit_bias[i];
    if (token < 0 || (i > 0 && token <= p.logit_bias[i - 1].first)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "logit_bias token ids must be >= 0, each once, in ascending order; got ", token));
    }
    if (!std::isfinite(bias) || bias < -100.0f || bias > 100.0f) {
      return absl::InvalidArgumentError(
          absl::StrCat("logit_bias for token ", token, " must be in [-100, 100], got ", bias));
    }
  }
  if (p.top_k < 0) {
    return absl::InvalidArgumentError(absl::StrCat("top_k must be >= 0 (0 = off), got ", p.top_k));
  }
  if (p.num_logprobs < 0 || p.num_logprobs > max_logprobs) {
    return absl::InvalidArgumentError(absl::StrCat("num_logprobs (logprobs) must be in [0, ",
                                                   max_logprobs, "], got ", p.num_logprobs));
  }
  return absl::OkStatus();
}

}  // namespace conveyor
