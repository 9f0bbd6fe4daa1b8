#include "model/sampler.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cassert>
#include <cmath>
#include <cstddef>
#include <initializer_list>
#include <limits>
#include <numeric>

namespace conveyor::model {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// The splitmix64 finaliser: a bijection whose output bits each depend on every input bit.
uint64_t Mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Lowest id among the largest values, so that greedy decoding is reproducible on ties.
int ArgMax(std::span<const float> values) {
  int best = 0;
  float best_value = values[0];
  for (int i = 1; i < static_cast<int>(values.size()); ++i) {
    if (values[i] > best_value) {
      best = i;
      best_value = values[i];
    }
  }
  return best;
}

// Maps a float to an unsigned integer of the same order, so that selection can work on key bits.
// Adding +0 first turns -0 into +0, which compares equal to it as a float.
uint32_t OrderedBits(float value) {
  const uint32_t bits = std::bit_cast<uint32_t>(value + 0.0f);
  return (bits & 0x80000000u) != 0 ? ~bits : bits | 0x80000000u;
}

// Reorders `ids` (non-empty) so that it begins with the shortest prefix, in (key desc, id asc)
// order, whose measure reaches `target`, and returns that prefix's length; the prefix's last token
// in that order sits at the end of it. Every measure must be positive, and tokens with equal keys
// must have equal measures. When rounding leaves the whole range short of `target`, the prefix is
// all of `ids`.
//
// A radix selection: each round buckets the keys still in play by their top bits relative to
// their range, sums the measure per bucket, and keeps only the bucket where the running measure
// reaches `target`. That is a few sequential passes in all, where a sort costs O(n log n) and
// nth_element's indirect comparisons several times more than these passes on a 128k vocabulary.
template <typename KeyOf, typename MeasureOf>
size_t SelectPrefix(std::span<int> ids, KeyOf key_of, MeasureOf measure_of, double target) {
  assert(!ids.empty());  // Empty, the rounds below never narrow the range: they loop forever.
  constexpr int kBucketBits = 11;
  // ids[0, begin) precede the group [begin, end) holding the prefix's end, and weigh mass_above.
  auto begin = ids.begin();
  auto end = ids.end();
  double mass_above = 0.0;
  while (true) {
    uint32_t lowest = std::numeric_limits<uint32_t>::max();
    uint32_t highest = 0;
    for (auto it = begin; it != end; ++it) {
      const uint32_t key = key_of(*it);
      lowest = std::min(lowest, key);
      highest = std::max(highest, key);
    }
    if (lowest == highest) break;
    const int shift = std::max(0, static_cast<int>(std::bit_width(highest - lowest)) - kBucketBits);
    auto bucket_of = [&key_of, lowest, shift](int id) { return (key_of(id) - lowest) >> shift; };
    std::array<double, 1 << kBucketBits> mass{};
    for (auto it = begin; it != end; ++it) mass[bucket_of(*it)] += measure_of(*it);

    // The boundary is where the running measure first reaches the target, or else the lowest
    // occupied bucket.
    uint32_t boundary = 0;
    double mass_above_boundary = mass_above;
    for (int bucket = static_cast<int>((highest - lowest) >> shift); bucket >= 0; --bucket) {
      if (mass[bucket] == 0.0) continue;
      boundary = bucket;
      mass_above_boundary = mass_above;
      mass_above += mass[bucket];
      if (mass_above >= target) break;
    }
    mass_above = mass_above_boundary;
    begin = std::partition(begin, end, [&](int id) { return bucket_of(id) > boundary; });
    end = std::partition(begin, end, [&](int id) { return bucket_of(id) == boundary; });
  }

  // The group's tokens share one key, hence one measure, and go in id order: the prefix ends at
  // the group's `count`-th lowest id.
  const double needed = std::ceil((target - mass_above) / measure_of(*begin));
  const auto count =
      static_cast<std::ptrdiff_t>(std::clamp(needed, 1.0, static_cast<double>(end - begin)));
  std::nth_element(begin, begin + (count - 1), end);
  return static_cast<size_t>(begin - ids.begin() + count);
}

void ComputeLogSoftmax(std::span<const float> logits, std::span<float> log_softmax) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  if (max_logit == kNegInf) {
    // Every token is impossible; say so rather than compute (-inf) - (-inf) = NaN.
    std::fill(log_softmax.begin(), log_softmax.end(), kNegInf);
    return;
  }
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(logit - max_logit);
  const float log_normaliser = max_logit + static_cast<float>(std::log(sum));
  for (size_t i = 0; i < logits.size(); ++i) log_softmax[i] = logits[i] - log_normaliser;
}

std::vector<TokenLogprob> TopLogprobs(std::span<const float> log_softmax, int num_logprobs,
                                      std::span<int> ids) {
  const int count = std::min(num_logprobs, static_cast<int>(ids.size()));
  auto key_of = [log_softmax](int id) { return OrderedBits(log_softmax[id]); };
  auto one = [](int) { return 1.0; };
  std::iota(ids.begin(), ids.end(), 0);
  SelectPrefix(ids, key_of, one, count);
  std::sort(ids.begin(), ids.begin() + count, [&key_of](int a, int b) {
    return key_of(a) > key_of(b) || (key_of(a) == key_of(b) && a < b);
  });
  std::vector<TokenLogprob> top;
  top.reserve(count);
  for (int i = 0; i < count; ++i) top.push_back({ids[i], log_softmax[ids[i]]});
  return top;
}

// `seen` and `output_counts` are all zero on entry and are left so.
void ApplyPenalties(const SamplingParams& params, std::span<const int> prompt_tokens,
                    std::span<const int> output_tokens, std::span<float> logits,
                    std::span<uint8_t> seen, std::span<int> output_counts) {
  // Prompt ids come from clients; one outside the vocabulary must not index the scratch.
  auto in_vocab = [&logits](int token) {
    return static_cast<size_t>(static_cast<unsigned>(token)) < logits.size();
  };
  // First, as OpenAI's logit_bias: "added to the logits generated by the model prior to
  // sampling".
  for (const auto& [token, bias] : params.logit_bias) {
    if (in_vocab(token)) logits[token] += bias;
  }
  if (params.repetition_penalty != 1.0f) {
    const float penalty = params.repetition_penalty;
    for (std::span<const int> tokens : {prompt_tokens, output_tokens}) {
      for (int token : tokens) {
        if (!in_vocab(token) || seen[token]) continue;
        seen[token] = 1;
        float& logit = logits[token];
        logit = logit > 0.0f ? logit / penalty : logit * penalty;
      }
    }
    // Clear only the entries set above, so the cost follows the sequence, not the vocab.
    for (std::span<const int> tokens : {prompt_tokens, output_tokens}) {
      for (int token : tokens) {
        if (in_vocab(token)) seen[token] = 0;
      }
    }
  }
  if (params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {
    for (int token : output_tokens) {
      if (in_vocab(token)) ++output_counts[token];
    }
    // Zeroing a count once applied both clears the scratch and skips later duplicates.
    for (int token : output_tokens) {
      if (!in_vocab(token) || output_counts[token] == 0) continue;
      logits[token] -= static_cast<float>(output_counts[token]) * params.frequency_penalty +
                       params.presence_penalty;
      output_counts[token] = 0;
    }
  }
}

// Draws from the penalised `logits`, whose largest entry is the finite `max_logit`.
int Draw(std::span<const float> logits, float max_logit, const SamplingParams& params,
         uint64_t draw_index, std::span<int> candidates, std::span<float> weights) {
  const int vocab_size = static_cast<int>(logits.size());
  auto logit_key = [logits](int id) { return OrderedBits(logits[id]); };
  auto weight_key = [weights](int id) { return OrderedBits(weights[id]); };
  auto weight_of = [weights](int id) { return static_cast<double>(weights[id]); };
  auto one = [](int) { return 1.0; };

  // Weights are unnormalised probabilities, 1 for the most likely token, so the renormalisations
  // reduce to sums. min-p keeps a prefix of the descending order, and so does top-p; keeping both
  // means keeping the shorter one, so min-p can filter first and shrink what top-p must order.  The
  // same filter drops tokens of probability 0 (-inf logits), as SelectPrefix requires.
  const float min_weight = std::min(params.min_p, 1.0f);
  double total = 0.0;  // Over the top-k tokens: top-p applies to their renormalised distribution.
  double kept_total = 0.0;
  int num_kept = 0;
  auto consider = [&](int id) {
    const float weight = std::exp((logits[id] - max_logit) / params.temperature);
    weights[id] = weight;
    total += weight;
    if (weight > 0.0f && weight >= min_weight) {
      candidates[num_kept++] = id;
      kept_total += weight;
    }
  };
  if (params.top_k > 0 && params.top_k < vocab_size) {
    std::iota(candidates.begin(), candidates.end(), 0);
    const size_t top_k_end = SelectPrefix(candidates, logit_key, one, params.top_k);
    // consider() writes at or before the position it reads.
    for (size_t i = 0; i < top_k_end; ++i) consider(candidates[i]);
  } else {
    for (int id = 0; id < vocab_size; ++id) consider(id);
  }

  if (params.top_p < 1.0f) {
    num_kept = static_cast<int>(
        SelectPrefix(candidates.first(num_kept), weight_key, weight_of, params.top_p * total));
    kept_total = 0.0;
    for (int i = 0; i < num_kept; ++i) kept_total += weights[candidates[i]];
  }

  // Inverse CDF in (probability desc, id asc) order: the token where the cumulative weight first
  // reaches u * kept_total ends the shortest prefix that weighs that much.
  const double u = UniformFromCounter(params.seed, draw_index);
  const size_t drawn_end =
      SelectPrefix(candidates.first(num_kept), weight_key, weight_of, u * kept_total);
  return candidates[drawn_end - 1];
}

}  // namespace

double UniformFromCounter(uint64_t seed, uint64_t index) {
  // A splitmix64 stream started from a mixed seed: nearby seeds give unrelated streams, and draw
  // `index` needs no state from earlier draws.
  constexpr uint64_t kGoldenGamma = 0x9e3779b97f4a7c15ULL;
  const uint64_t bits = Mix64(Mix64(seed) + (index + 1) * kGoldenGamma);
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

Sampler::Sampler(int vocab_size)
    : vocab_size_(vocab_size),
      log_softmax_(vocab_size),
      candidates_(vocab_size),
      probs_(vocab_size),
      output_counts_(vocab_size, 0),
      seen_(vocab_size, 0) {}

SampleResult Sampler::Score(std::span<const float> logits, int token_id, int num_logprobs) {
  ComputeLogSoftmax(logits, log_softmax_);
  SampleResult result;
  result.token_id = token_id;
  result.logprob = log_softmax_[token_id];
  if (num_logprobs > 0) result.top_logprobs = TopLogprobs(log_softmax_, num_logprobs, candidates_);
  return result;
}

SampleResult Sampler::Sample(std::span<float> logits, const SamplingParams& params,
                             std::span<const int> prompt_tokens, std::span<const int> output_tokens,
                             uint64_t draw_index, bool want_logprob,
                             const uint32_t* allowed_tokens) {
  assert(logits.size() == static_cast<size_t>(vocab_size_));
  SampleResult result;
  // Log-probabilities describe the model, not the sampler, so they are taken before the penalties
  // rewrite `logits`.
  const bool need_log_softmax = want_logprob || params.num_logprobs > 0;
  if (need_log_softmax) {
    ComputeLogSoftmax(logits, log_softmax_);
    if (params.num_logprobs > 0) {
      result.top_logprobs = TopLogprobs(log_softmax_, params.num_logprobs, candidates_);
    }
  }

  if (allowed_tokens != nullptr) {
    for (int id = 0; id < vocab_size_; ++id) {
      if (((allowed_tokens[id / 32] >> (id % 32)) & 1u) == 0) logits[id] = kNegInf;
    }
  }
  ApplyPenalties(params, prompt_tokens, output_tokens, logits, seen_, output_counts_);

  const int best = ArgMax(logits);
  // With every logit at -inf there is no distribution to draw from; fall back to greedy. So too
  // when a penalty overflowed a logit to +inf (a repetition_penalty near 0 divides by it): the
  // infinitely likely tokens' weights would be NaN, and Draw needs a finite maximum.
  if (params.is_greedy() || !std::isfinite(logits[best])) {
    result.token_id = best;
  } else {
    result.token_id = Draw(logits, logits[best], params, draw_index, candidates_, probs_);
  }
  if (need_log_softmax) result.logprob = log_softmax_[result.token_id];
  return result;
}

}  // namespace conveyor::model
