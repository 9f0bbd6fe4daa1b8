// Turns one sequence's logits into its next token: penalties, temperature, top-k, top-p,
// min-p, a seeded draw, and optional log-probabilities.
//
// Randomness is counter-based: draw n of a sequence depends only on (seed, n), so a
// sequence that is preempted and recomputed samples exactly what it would have sampled.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "common/sampling_params.h"

namespace conveyor::model {

using conveyor::SamplingParams;

struct TokenLogprob {
  int token_id = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int token_id = 0;
  // Log-probability of token_id under the unmodified model distribution
  // (log_softmax of the raw logits). Computed only when num_logprobs > 0 or asked.
  float logprob = 0.0f;
  std::vector<TokenLogprob> top_logprobs;  // Highest first, num_logprobs entries.
};

// One Sampler per worker thread; it owns scratch buffers sized to the vocabulary.
class Sampler {
 public:
  explicit Sampler(int vocab_size);

  // Samples the next token from `logits` (vocab_size entries; used as scratch, so its
  // contents are unspecified afterwards). `prompt_tokens` and `output_tokens` are the
  // sequence so far, for penalties; `draw_index` is the index of this draw in the
  // sequence's random stream (the number of tokens it generated before this one).
  // `allowed_tokens`, when not null, is a bit per token (bit id % 32 of word id / 32) of
  // the tokens structured output allows (grammar/token_mask.h); the others are removed
  // before penalties, temperature and the filters, as if their logits were -inf (the
  // log-probabilities still describe the model). It must allow at least one token.
  SampleResult Sample(std::span<float> logits, const SamplingParams& params,
                      std::span<const int> prompt_tokens, std::span<const int> output_tokens,
                      uint64_t draw_index, bool want_logprob,
                      const uint32_t* allowed_tokens = nullptr);

  // Scores `token_id` under `logits` (the model's distribution, no sampling transform):
  // its logprob and the `num_logprobs` most likely tokens'. For prompt logprobs.
  SampleResult Score(std::span<const float> logits, int token_id, int num_logprobs);

  int vocab_size() const { return vocab_size_; }

 private:
  int vocab_size_;
  std::vector<float> log_softmax_;  // Scratch: raw distribution for logprobs.
  std::vector<int> candidates_;     // Scratch: token ids sorted by logit.
  std::vector<float> probs_;        // Scratch.
  std::vector<int> output_counts_;  // Scratch: occurrences per token in the output.
  std::vector<uint8_t> seen_;       // Scratch: token appears in prompt or output.
};

// A uniform number in [0, 1) that depends only on (seed, index).
double UniformFromCounter(uint64_t seed, uint64_t index);

}  // namespace conveyor::model
