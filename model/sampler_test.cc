#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

namespace conveyor::model {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

// Uniform in [lo, hi) from raw mt19937 bits, which, unlike std's distributions, are the same on
// every standard library, so the tests are deterministic everywhere.
std::vector<float> RandomLogits(int vocab_size, uint32_t seed, float lo = -4.0f, float hi = 4.0f) {
  std::mt19937 gen(seed);
  std::vector<float> logits(vocab_size);
  for (float& logit : logits) {
    logit = lo + (hi - lo) * static_cast<float>(gen() >> 8) * 0x1.0p-24f;
  }
  return logits;
}

SamplingParams Params(float temperature = 1.0f, int top_k = 0, float top_p = 1.0f,
                      float min_p = 0.0f) {
  SamplingParams params;
  params.temperature = temperature;
  params.top_k = top_k;
  params.top_p = top_p;
  params.min_p = min_p;
  return params;
}

// Sample() uses its logits as scratch, so every draw gets a fresh copy, kept in one buffer so
// that large-vocabulary tests do not spend their time allocating.
int DrawToken(Sampler& sampler, const std::vector<float>& logits, const SamplingParams& params,
              uint64_t draw_index, std::span<const int> prompt = {},
              std::span<const int> output = {}) {
  static std::vector<float> scratch;
  scratch.assign(logits.begin(), logits.end());
  return sampler.Sample(scratch, params, prompt, output, draw_index, /*want_logprob=*/false)
      .token_id;
}

std::vector<double> LogSoftmax(std::span<const float> logits) {
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  double sum = 0.0;
  for (float logit : logits) sum += std::exp(logit - max_logit);
  std::vector<double> result;
  for (float logit : logits) result.push_back(logit - max_logit - std::log(sum));
  return result;
}

// The sampling distribution written straight from the specification, with a full sort and in
// double precision: softmax(logits / T), then top-k, top-p and min-p, then renormalised.
std::vector<double> ReferenceProbs(std::span<const float> logits, const SamplingParams& params) {
  const int vocab_size = static_cast<int>(logits.size());
  std::vector<double> probs(vocab_size);
  const double max_logit = *std::max_element(logits.begin(), logits.end());
  for (int i = 0; i < vocab_size; ++i) {
    probs[i] = std::exp((logits[i] - max_logit) / params.temperature);
  }
  std::vector<int> order(vocab_size);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return probs[a] > probs[b]; });

  int kept = vocab_size;
  if (params.top_k > 0) kept = std::min(kept, params.top_k);
  double total = 0.0;
  for (int i = 0; i < kept; ++i) total += probs[order[i]];
  if (params.top_p < 1.0f) {
    double cumulative = 0.0;
    for (int i = 0; i < kept; ++i) {
      cumulative += probs[order[i]] / total;
      if (cumulative >= params.top_p) {
        kept = i + 1;
        break;
      }
    }
  }
  const double max_prob = probs[order[0]];
  while (kept > 1 && probs[order[kept - 1]] < params.min_p * max_prob) --kept;

  std::vector<double> result(vocab_size, 0.0);
  double kept_total = 0.0;
  for (int i = 0; i < kept; ++i) kept_total += probs[order[i]];
  for (int i = 0; i < kept; ++i) result[order[i]] = probs[order[i]] / kept_total;
  return result;
}

// Pearson's statistic for `counts` against `probs`. Bins expected to hold fewer than 5 draws are
// pooled, as the chi-square approximation needs; `degrees_of_freedom` receives bins - 1.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs,
                 int* degrees_of_freedom) {
  const double draws = std::accumulate(counts.begin(), counts.end(), 0.0);
  double statistic = 0.0;
  int bins = 0;
  double pooled_expected = 0.0;
  double pooled_observed = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double expected = probs[i] * draws;
    if (expected < 5.0) {
      pooled_expected += expected;
      pooled_observed += counts[i];
      continue;
    }
    statistic += (counts[i] - expected) * (counts[i] - expected) / expected;
    ++bins;
  }
  if (pooled_expected >= 5.0) {
    statistic +=
        (pooled_observed - pooled_expected) * (pooled_observed - pooled_expected) / pooled_expected;
    ++bins;
  } else {
    // Too little mass to test as a bin; still, draws there must be rare.
    EXPECT_LE(pooled_observed, pooled_expected + 5.0 * std::sqrt(pooled_expected + 1.0));
  }
  *degrees_of_freedom = bins - 1;
  return statistic;
}

// Well beyond the 1 - 1e-6 quantile of chi-square(df) for the df used here, so a correct sampler
// passes, while any real bias over these draw counts lands far above it.
double ChiSquareBound(int degrees_of_freedom) {
  return degrees_of_freedom + 7.0 * std::sqrt(2.0 * degrees_of_freedom) + 10.0;
}

// Draws `num_draws` tokens as one sequence does (one seed, consecutive draw indices) and checks
// their histogram against `expected`.
void ExpectDistribution(const std::vector<float>& logits, const SamplingParams& params,
                        const std::vector<double>& expected, int num_draws) {
  Sampler sampler(static_cast<int>(logits.size()));
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < num_draws; ++i) ++counts[DrawToken(sampler, logits, params, i)];
  for (size_t token = 0; token < logits.size(); ++token) {
    if (expected[token] == 0.0) {
      EXPECT_EQ(counts[token], 0) << "token " << token;
    }
  }
  int degrees_of_freedom = 0;
  const double statistic = ChiSquare(counts, expected, &degrees_of_freedom);
  EXPECT_LT(statistic, ChiSquareBound(degrees_of_freedom)) << "df " << degrees_of_freedom;
}

TEST(UniformFromCounterTest, IsAPureFunctionOfSeedAndIndex) {
  EXPECT_EQ(UniformFromCounter(7, 3), UniformFromCounter(7, 3));
  EXPECT_NE(UniformFromCounter(7, 3), UniformFromCounter(7, 4));
  EXPECT_NE(UniformFromCounter(7, 3), UniformFromCounter(8, 3));
  EXPECT_NE(UniformFromCounter(0, 0), UniformFromCounter(0, 1));
}

TEST(UniformFromCounterTest, IsUniformAlongIndicesAndAlongSeeds) {
  constexpr int kBins = 32;
  constexpr int kDraws = 64000;
  std::vector<int> along_indices(kBins, 0);
  std::vector<int> along_seeds(kBins, 0);
  for (int i = 0; i < kDraws; ++i) {
    const double by_index = UniformFromCounter(12345, i);
    const double by_seed = UniformFromCounter(i, 0);
    ASSERT_GE(by_index, 0.0);
    ASSERT_LT(by_index, 1.0);
    ASSERT_GE(by_seed, 0.0);
    ASSERT_LT(by_seed, 1.0);
    ++along_indices[static_cast<int>(by_index * kBins)];
    ++along_seeds[static_cast<int>(by_seed * kBins)];
  }
  const std::vector<double> uniform(kBins, 1.0 / kBins);
  int df = 0;
  const double index_statistic = ChiSquare(along_indices, uniform, &df);
  EXPECT_LT(index_statistic, ChiSquareBound(df));
  const double seed_statistic = ChiSquare(along_seeds, uniform, &df);
  EXPECT_LT(seed_statistic, ChiSquareBound(df));
}

TEST(UniformFromCounterTest, UsesFiftyThreeBits) {
  // A float-precision generator would leave the low bits of the mantissa zero.
  bool low_bits_seen = false;
  for (int i = 0; i < 100 && !low_bits_seen; ++i) {
    const double scaled = std::ldexp(UniformFromCounter(99, i), 53);
    low_bits_seen = static_cast<uint64_t>(scaled) % (1u << 29) != 0;
  }
  EXPECT_TRUE(low_bits_seen);
}

TEST(SamplerTest, GreedyPicksArgmax) {
  constexpr int kVocab = 1000;
  Sampler sampler(kVocab);
  SamplingParams greedy = Params(/*temperature=*/0.0f, /*top_k=*/3, /*top_p=*/0.1f);
  for (uint32_t trial = 0; trial < 50; ++trial) {
    const std::vector<float> logits = RandomLogits(kVocab, trial);
    const int argmax =
        static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    greedy.seed = trial;
    EXPECT_EQ(DrawToken(sampler, logits, greedy, trial), argmax);
  }
}

TEST(SamplerTest, GreedyBreaksTiesByLowestId) {
  Sampler sampler(5);
  EXPECT_EQ(DrawToken(sampler, {1.0f, 3.0f, 2.0f, 3.0f, 3.0f}, Params(0.0f), 0), 1);
}

TEST(SamplerTest, SameSeedAndIndexRepeatExactly) {
  constexpr int kVocab = 500;
  const std::vector<float> logits = RandomLogits(kVocab, 1);
  SamplingParams params = Params(0.8f, 0, 0.95f);
  params.seed = 42;
  Sampler first(kVocab);
  std::vector<int> sequence;
  sequence.reserve(200);
  for (int i = 0; i < 200; ++i) sequence.push_back(DrawToken(first, logits, params, i));

  // A second sampler replays the sequence backwards with unrelated calls in between: a draw
  // depends on nothing but (seed, index), not on order or on earlier use of the scratch.
  Sampler second(kVocab);
  SamplingParams other = Params(1.3f, 7);
  other.repetition_penalty = 1.5f;
  other.frequency_penalty = 0.5f;
  const std::vector<int> history = {3, 3, 9, 400};
  for (int i = 199; i >= 0; --i) {
    DrawToken(second, RandomLogits(kVocab, 100 + i), other, i, history, history);
    EXPECT_EQ(DrawToken(second, logits, params, i), sequence[i]) << "draw " << i;
  }
}

TEST(SamplerTest, DifferentSeedsGiveDifferentSequences) {
  constexpr int kVocab = 50;
  const std::vector<float> logits(kVocab, 0.0f);
  Sampler sampler(kVocab);
  std::set<std::vector<int>> sequences;
  for (uint64_t seed = 0; seed < 20; ++seed) {
    SamplingParams params = Params();
    params.seed = seed;
    std::vector<int> sequence;
    sequence.reserve(64);
    for (int i = 0; i < 64; ++i) sequence.push_back(DrawToken(sampler, logits, params, i));
    EXPECT_GT(std::set<int>(sequence.begin(), sequence.end()).size(), 20u) << "seed " << seed;
    sequences.insert(sequence);
  }
  EXPECT_EQ(sequences.size(), 20u);
}

TEST(SamplerTest, DrawIsInverseCdfInProbabilityOrder) {
  // Candidates in (probability desc, id asc) order are 1, 3, 2, 0, 4.
  const std::vector<float> logits = {0.0f, 2.0f, 1.0f, 2.0f, -1.0f};
  const std::vector<double> probs = ReferenceProbs(logits, Params());
  const std::vector<int> order = {1, 3, 2, 0, 4};
  Sampler sampler(5);
  int checked = 0;
  for (uint64_t seed = 0; seed < 100; ++seed) {
    for (uint64_t index = 0; index < 20; ++index) {
      const double u = UniformFromCounter(seed, index);
      double cumulative = 0.0;
      int expected = order.back();
      bool near_boundary = false;
      for (int token : order) {
        cumulative += probs[token];
        near_boundary |= std::abs(cumulative - u) < 1e-6;
        if (u < cumulative) {
          expected = token;
          break;
        }
      }
      if (near_boundary) continue;
      SamplingParams params = Params();
      params.seed = seed;
      EXPECT_EQ(DrawToken(sampler, logits, params, index), expected) << "u " << u;
      ++checked;
    }
  }
  EXPECT_GT(checked, 1990);
}

struct FilterCase {
  std::string name;
  SamplingParams params;
};

class SamplerFilterTest : public testing::TestWithParam<FilterCase> {};

TEST_P(SamplerFilterTest, NeverDrawsOutsideTheKeptSet) {
  constexpr int kVocab = 1000;
  const SamplingParams& base = GetParam().params;
  Sampler sampler(kVocab);
  for (uint32_t logits_seed = 0; logits_seed < 4; ++logits_seed) {
    const std::vector<float> logits = RandomLogits(kVocab, logits_seed);
    const std::vector<double> allowed = ReferenceProbs(logits, base);
    for (int i = 0; i < 1000; ++i) {
      SamplingParams params = base;
      params.seed = 7919u * i + logits_seed;
      const int token = DrawToken(sampler, logits, params, i % 13);
      ASSERT_GT(allowed[token], 0.0) << "token " << token << " draw " << i;
    }
  }
}

TEST_P(SamplerFilterTest, MatchesTheFilteredSoftmax) {
  const std::vector<float> logits = RandomLogits(32, 77, -2.0f, 2.0f);
  SamplingParams params = GetParam().params;
  params.seed = 2024;
  ExpectDistribution(logits, params, ReferenceProbs(logits, params), 40000);
}

INSTANTIATE_TEST_SUITE_P(Filters, SamplerFilterTest,
                         testing::Values(FilterCase{"TopK1", Params(1.0f, 1)},
                                         FilterCase{"TopK5", Params(1.0f, 5)},
                                         FilterCase{"TopP03", Params(1.0f, 0, 0.3f)},
                                         FilterCase{"TopP09", Params(1.0f, 0, 0.9f)},
                                         FilterCase{"MinP02", Params(1.0f, 0, 1.0f, 0.2f)},
                                         FilterCase{"MinP07", Params(1.0f, 0, 1.0f, 0.7f)},
                                         FilterCase{"AllThree", Params(1.0f, 20, 0.8f, 0.05f)},
                                         FilterCase{"CoolTopP", Params(0.5f, 0, 0.5f)},
                                         FilterCase{"HotTopKMinP", Params(1.7f, 12, 1.0f, 0.3f)}),
                         [](const testing::TestParamInfo<FilterCase>& info) {
                           return info.param.name;
                         });

TEST(SamplerTest, TopPCountsTheMassThatMinPDrops) {
  // Probabilities 0.4, 0.3, 0.2, 0.1. min-p 0.3 drops token 3 (0.1 < 0.12); top-p 0.75 needs
  // 0.4 + 0.3 + 0.2 of the whole distribution, so token 2 stays. Measuring top-p against the mass
  // left after min-p (0.9) would stop at 0.7 >= 0.675 and lose token 2.
  const std::vector<float> logits = {std::log(0.4f), std::log(0.3f), std::log(0.2f),
                                     std::log(0.1f)};
  SamplingParams params = Params(1.0f, 0, 0.75f, 0.3f);
  params.seed = 6;
  ExpectDistribution(logits, params, {4.0 / 9, 3.0 / 9, 2.0 / 9, 0.0}, 9000);
}

class SamplerTemperatureTest : public testing::TestWithParam<float> {};

TEST_P(SamplerTemperatureTest, MatchesTheSoftmax) {
  std::vector<float> logits(16);
  for (int i = 0; i < 16; ++i)
    logits[i] = 0.25f * static_cast<float>((i * 7) % 16);  // Not monotone in id.
  // Explicit "off" values of the filters, which must keep every token.
  SamplingParams params = Params(GetParam(), /*top_k=*/0, /*top_p=*/1.0f, /*min_p=*/0.0f);
  params.seed = 5;
  ExpectDistribution(logits, params, ReferenceProbs(logits, params), 60000);
}

TEST_P(SamplerTemperatureTest, DistributionCheckRejectsAnotherTemperature) {
  // Guards the test above: draws at this temperature must fail against a nearby one.
  std::vector<float> logits(16);
  for (int i = 0; i < 16; ++i) logits[i] = 0.25f * static_cast<float>((i * 7) % 16);
  SamplingParams params = Params(GetParam());
  params.seed = 5;
  Sampler sampler(16);
  std::vector<int> counts(16, 0);
  for (int i = 0; i < 60000; ++i) ++counts[DrawToken(sampler, logits, params, i)];
  int df = 0;
  const double statistic =
      ChiSquare(counts, ReferenceProbs(logits, Params(GetParam() * 1.4f)), &df);
  EXPECT_GT(statistic, 5 * ChiSquareBound(df)) << statistic;
}

INSTANTIATE_TEST_SUITE_P(Temperatures, SamplerTemperatureTest, testing::Values(1.0f, 0.5f, 2.0f));

TEST(SamplerTest, LargeVocabularyMatchesTheSoftmax) {
  // A realistic vocabulary size, with a head of likely tokens at scattered ids over a long tail,
  // so that the selection runs several rounds.
  constexpr int kVocab = 128256;
  constexpr int kHead = 10;
  std::vector<float> logits = RandomLogits(kVocab, 3);
  // Bins: the head tokens, then the tail pooled by the ChiSquare helper.
  std::vector<int> bin_of(kVocab, kHead);
  for (int i = 0; i < kHead; ++i) {
    const int token = (i * 12821 + 17) % kVocab;
    logits[token] = 10.0f + 0.3f * static_cast<float>(i);
    bin_of[token] = i;
  }
  const std::vector<double> probs = ReferenceProbs(logits, Params());
  std::vector<double> bin_probs(kHead + 1, 0.0);
  for (int token = 0; token < kVocab; ++token) bin_probs[bin_of[token]] += probs[token];

  Sampler sampler(kVocab);
  SamplingParams params = Params();
  params.seed = 11;
  std::vector<int> counts(kHead + 1, 0);
  for (int i = 0; i < 1000; ++i) ++counts[bin_of[DrawToken(sampler, logits, params, i)]];
  int df = 0;
  const double statistic = ChiSquare(counts, bin_probs, &df);
  EXPECT_LT(statistic, ChiSquareBound(df));
}

TEST(SamplerTest, LargeVocabularyFiltersStayInTheKeptSet) {
  constexpr int kVocab = 128256;
  const std::vector<float> logits = RandomLogits(kVocab, 4, -8.0f, 8.0f);
  for (const SamplingParams& base :
       {Params(1.0f, 50), Params(1.0f, 0, 0.9f), Params(0.7f, 0, 1.0f, 0.1f)}) {
    const std::vector<double> allowed = ReferenceProbs(logits, base);
    Sampler sampler(kVocab);
    std::set<int> drawn;
    for (int i = 0; i < 200; ++i) {
      SamplingParams params = base;
      params.seed = i;
      const int token = DrawToken(sampler, logits, params, 0);
      ASSERT_GT(allowed[token], 0.0) << "token " << token;
      drawn.insert(token);
    }
    // Not stuck on a few tokens: every kept set here has well over 50 members.
    EXPECT_GT(drawn.size(), 40u);
  }
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveLogits) {
  Sampler sampler(3);
  const std::vector<float> logits = {2.0f, 1.5f, -1.0f};
  const std::vector<int> prompt = {0};
  SamplingParams params = Params(0.0f);
  params.repetition_penalty = 1.3f;  // 2 / 1.3 = 1.54 > 1.5.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, prompt), 0);
  params.repetition_penalty = 1.4f;  // 2 / 1.4 = 1.43 < 1.5.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, prompt), 1);
}

TEST(SamplerTest, LogitBiasIsAddedFirstAndLeavesLogprobsAlone) {
  Sampler sampler(4);
  const std::vector<float> logits = {2.0f, 1.0f, 0.5f, -1.0f};
  SamplingParams greedy = Params(0.0f);
  greedy.logit_bias = {{1, 1.5f}};  // 1 + 1.5 > 2.
  EXPECT_EQ(DrawToken(sampler, logits, greedy, 0), 1);
  greedy.logit_bias = {{1, 0.5f}};  // 1 + 0.5 < 2.
  EXPECT_EQ(DrawToken(sampler, logits, greedy, 0), 0);
  // -100 bans a token in practice, +100 forces one, sampling at any temperature.
  SamplingParams hot = Params(1.5f);
  hot.logit_bias = {{0, -100.0f}, {3, 100.0f}};
  for (uint64_t draw = 0; draw < 200; ++draw) {
    EXPECT_EQ(DrawToken(sampler, logits, hot, draw), 3) << "draw " << draw;
  }
  hot.logit_bias = {{0, -100.0f}};
  for (uint64_t draw = 0; draw < 200; ++draw) {
    EXPECT_NE(DrawToken(sampler, logits, hot, draw), 0) << "draw " << draw;
  }
  // The reported logprob is the model's (before any transform), as with the penalties.
  std::vector<float> row = logits;
  const SampleResult biased = sampler.Sample(row, greedy, {}, {}, 0, /*want_logprob=*/true);
  row = logits;
  const SampleResult plain = sampler.Sample(row, Params(0.0f), {}, {}, 0, /*want_logprob=*/true);
  EXPECT_EQ(biased.token_id, plain.token_id);
  EXPECT_EQ(biased.logprob, plain.logprob);
}

TEST(SamplerTest, RepetitionPenaltyOverflowingLogitsFallsBackToGreedy) {
  // A denormal penalty passes validation (it is > 0) and divides both seen logits to +inf:
  // drawing then looped forever in top-p's selection over no candidates (found by
  // tests/fuzz/step_request_fuzzer). Greedy takes the first of the infinite logits.
  Sampler sampler(4);
  const std::vector<float> logits = {2.0f, 3.0f, -1.0f, 1.0f};
  const std::vector<int> prompt = {0, 1};
  SamplingParams params = Params(1.0f, 0, 0.5f);
  params.repetition_penalty = 2.5e-44f;
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, prompt), 0);
  params.top_p = 1.0f;
  params.top_k = 2;
  EXPECT_EQ(DrawToken(sampler, logits, params, 1, prompt), 0);
}

TEST(SamplerTest, RepetitionPenaltyMultipliesNonPositiveLogits) {
  Sampler sampler(3);
  const std::vector<float> logits = {-1.0f, -1.1f, -5.0f};
  const std::vector<int> output = {0};
  SamplingParams params = Params(0.0f);
  params.repetition_penalty = 1.05f;  // -1 * 1.05 = -1.05 > -1.1.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, output), 0);
  params.repetition_penalty = 1.15f;  // -1 * 1.15 = -1.15 < -1.1; dividing would raise it.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, output), 1);
}

TEST(SamplerTest, RepetitionPenaltyAppliesOncePerDistinctToken) {
  Sampler sampler(3);
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams params = Params(0.0f);
  params.repetition_penalty = 1.2f;  // Once: 2 / 1.2 = 1.67 > 1.5. Thrice: 1.16 < 1.5.
  const std::vector<int> tokens = {0, 0, 0};
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, tokens, tokens), 0);
  // Tokens seen only in the prompt are penalised too.
  params.repetition_penalty = 1.4f;
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, tokens, {}), 1);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithOutputCountOnly) {
  Sampler sampler(2);
  const std::vector<float> logits = {3.0f, 2.0f};
  const std::vector<int> three_zeros = {0, 0, 0};
  SamplingParams params = Params(0.0f);
  params.frequency_penalty = 0.3f;  // 3 - 3 * 0.3 = 2.1 > 2.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, three_zeros), 0);
  params.frequency_penalty = 0.34f;  // 3 - 3 * 0.34 = 1.98 < 2.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, three_zeros), 1);
  params.frequency_penalty = 10.0f;  // The prompt does not count.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, three_zeros, {}), 0);
}

TEST(SamplerTest, PresencePenaltyAppliesOnceAndToOutputOnly) {
  Sampler sampler(2);
  const std::vector<float> logits = {3.0f, 2.0f};
  const std::vector<int> three_zeros = {0, 0, 0};
  SamplingParams params = Params(0.0f);
  params.presence_penalty = 0.9f;  // 3 - 0.9 = 2.1 > 2, however often token 0 occurred.
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, three_zeros), 0);
  params.presence_penalty = 1.1f;
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, {}, three_zeros), 1);
  params.presence_penalty = 10.0f;
  EXPECT_EQ(DrawToken(sampler, logits, params, 0, three_zeros, {}), 0);
}

TEST(SamplerTest, PenaltiesShiftTheDistributionExactly) {
  const std::vector<float> logits = {0.0f, 1.0f, 0.0f, 0.0f};
  const std::vector<int> prompt = {1, 1};
  const std::vector<int> output = {0, 2, 0};
  SamplingParams params = Params();
  params.repetition_penalty = 2.0f;  // Token 1: 1 / 2. Tokens 0 and 2: 0 * 2 = 0.
  params.frequency_penalty = 0.5f;   // Token 0: -2 * 0.5; token 2: -0.5.
  params.presence_penalty = 0.25f;   // Tokens 0 and 2: -0.25.
  params.seed = 8;
  const std::vector<float> penalised = {-1.25f, 0.5f, -0.75f, 0.0f};
  const std::vector<double> expected = ReferenceProbs(penalised, Params());

  Sampler sampler(4);
  std::vector<int> counts(4, 0);
  for (int i = 0; i < 40000; ++i) ++counts[DrawToken(sampler, logits, params, i, prompt, output)];
  int df = 0;
  const double statistic = ChiSquare(counts, expected, &df);
  EXPECT_LT(statistic, ChiSquareBound(df));
  // And the unpenalised distribution is clearly rejected.
  const double unpenalised_statistic = ChiSquare(counts, ReferenceProbs(logits, Params()), &df);
  EXPECT_GT(unpenalised_statistic, 10 * ChiSquareBound(df));
}

TEST(SamplerTest, PenaltyScratchIsClearedBetweenCalls) {
  Sampler sampler(3);
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  const std::vector<int> tokens = {0, 0};
  SamplingParams penalised = Params(0.0f);
  penalised.repetition_penalty = 2.0f;
  penalised.frequency_penalty = 0.2f;
  penalised.presence_penalty = 0.2f;
  for (int round = 0; round < 3; ++round) {
    EXPECT_EQ(DrawToken(sampler, logits, penalised, 0, tokens, tokens), 1);
    EXPECT_EQ(DrawToken(sampler, logits, Params(0.0f), 0, tokens, tokens), 0);
  }
}

TEST(SamplerTest, PenaltiesIgnoreIdsOutsideTheVocabulary) {
  Sampler sampler(3);
  const std::vector<int> tokens = {-1, 3, 1 << 30, 0};
  SamplingParams params = Params(0.0f);
  params.repetition_penalty = 2.0f;
  params.frequency_penalty = 1.0f;
  EXPECT_EQ(DrawToken(sampler, {2.0f, 1.5f, 0.0f}, params, 0, tokens, tokens), 1);
}

TEST(SamplerTest, LogprobsAreLogSoftmaxOfRawLogits) {
  constexpr int kVocab = 1000;
  Sampler sampler(kVocab);
  SamplingParams params = Params(0.7f, 40, 0.9f);
  params.repetition_penalty = 1.3f;
  params.presence_penalty = 0.5f;
  params.num_logprobs = 5;
  const std::vector<int> history = {1, 2, 3, 500, 500};
  for (uint32_t trial = 0; trial < 20; ++trial) {
    std::vector<float> logits = RandomLogits(kVocab, trial);
    const std::vector<double> expected = LogSoftmax(logits);
    std::vector<int> by_logprob(kVocab);
    std::iota(by_logprob.begin(), by_logprob.end(), 0);
    std::stable_sort(by_logprob.begin(), by_logprob.end(),
                     [&](int a, int b) { return expected[a] > expected[b]; });

    params.seed = trial;
    const SampleResult result =
        sampler.Sample(logits, params, history, history, trial, /*want_logprob=*/false);
    EXPECT_NEAR(result.logprob, expected[result.token_id], 1e-4);
    ASSERT_EQ(result.top_logprobs.size(), 5u);
    for (int i = 0; i < 5; ++i) {
      EXPECT_EQ(result.top_logprobs[i].token_id, by_logprob[i]);
      EXPECT_NEAR(result.top_logprobs[i].logprob, expected[by_logprob[i]], 1e-4);
    }
  }
}

TEST(SamplerTest, LogprobIgnoresPenalties) {
  Sampler sampler(2);
  std::vector<float> logits = {3.0f, 2.0f};
  const std::vector<double> expected = LogSoftmax(logits);
  const std::vector<int> output = {0};
  SamplingParams params = Params(0.0f);
  params.presence_penalty = 5.0f;
  const SampleResult result = sampler.Sample(logits, params, {}, output, 0, /*want_logprob=*/true);
  EXPECT_EQ(result.token_id, 1);
  EXPECT_NEAR(result.logprob, expected[1], 1e-6);
  EXPECT_TRUE(result.top_logprobs.empty());
}

TEST(SamplerTest, TopLogprobsBreakTiesByLowerIdAndAreClampedToTheVocabulary) {
  Sampler sampler(5);
  std::vector<float> logits = {1.0f, 3.0f, 3.0f, -kInf, 3.0f};
  SamplingParams params = Params(0.0f);
  params.num_logprobs = 10;
  const SampleResult result = sampler.Sample(logits, params, {}, {}, 0, /*want_logprob=*/false);
  ASSERT_EQ(result.top_logprobs.size(), 5u);
  const std::vector<int> expected_ids = {1, 2, 4, 0, 3};
  for (int i = 0; i < 5; ++i) EXPECT_EQ(result.top_logprobs[i].token_id, expected_ids[i]);
  EXPECT_NEAR(result.top_logprobs[0].logprob, std::log(1.0 / (3.0 + std::exp(-2.0))), 1e-6);
  EXPECT_EQ(result.top_logprobs[4].logprob, -kInf);
}

TEST(SamplerTest, LogprobsOnlyWhenAsked) {
  Sampler sampler(3);
  std::vector<float> logits = {1.0f, 0.0f, 0.0f};
  const SampleResult result = sampler.Sample(logits, Params(0.0f), {}, {}, 0, false);
  EXPECT_EQ(result.logprob, 0.0f);
  EXPECT_TRUE(result.top_logprobs.empty());
}

TEST(SamplerTest, TopKAboveVocabularyIsOff) {
  const std::vector<float> logits = RandomLogits(100, 9);
  Sampler sampler(100);
  SamplingParams off = Params();
  SamplingParams huge = Params(1.0f, 1000);
  for (int i = 0; i < 500; ++i) {
    off.seed = huge.seed = i;
    EXPECT_EQ(DrawToken(sampler, logits, huge, i), DrawToken(sampler, logits, off, i));
  }
}

TEST(SamplerTest, AllEqualLogits) {
  constexpr int kVocab = 8;
  const std::vector<float> logits(kVocab, 0.5f);
  Sampler sampler(kVocab);
  EXPECT_EQ(DrawToken(sampler, logits, Params(0.0f), 0), 0);
  // min-p of 1 keeps every token that ties with the maximum.
  for (float min_p : {0.0f, 1.0f}) {
    SamplingParams params = Params(1.0f, 0, 1.0f, min_p);
    ExpectDistribution(logits, params, std::vector<double>(kVocab, 1.0 / kVocab), 16000);
  }
  // Ties are cut by id: top-3 keeps 0..2, and top-p 0.5 keeps 0..3.
  std::vector<double> first_three(kVocab, 0.0);
  std::fill_n(first_three.begin(), 3, 1.0 / 3);
  ExpectDistribution(logits, Params(1.0f, 3), first_three, 6000);
  std::vector<double> first_half(kVocab, 0.0);
  std::fill_n(first_half.begin(), 4, 0.25);
  ExpectDistribution(logits, Params(1.0f, 0, 0.5f), first_half, 8000);
}

TEST(SamplerTest, NegativeInfinityLogitsAreNeverDrawn) {
  constexpr int kVocab = 64;
  std::vector<float> logits = RandomLogits(kVocab, 5);
  for (int i = 0; i < kVocab; i += 2) logits[i] = -kInf;
  Sampler sampler(kVocab);
  for (const SamplingParams& base : {Params(), Params(3.0f), Params(1.0f, 50, 0.999f)}) {
    for (int i = 0; i < 4000; ++i) {
      SamplingParams params = base;
      params.seed = i;
      ASSERT_EQ(DrawToken(sampler, logits, params, i) % 2, 1) << "draw " << i;
    }
  }
  SamplingParams params = Params();
  params.seed = 3;
  ExpectDistribution(logits, params, ReferenceProbs(logits, params), 20000);
}

TEST(SamplerTest, AllNegativeInfinityFallsBackToTokenZero) {
  Sampler sampler(4);
  std::vector<float> logits(4, -kInf);
  SamplingParams params = Params(1.0f, 2, 0.5f, 0.1f);
  params.num_logprobs = 2;
  const SampleResult result = sampler.Sample(logits, params, {}, {}, 0, /*want_logprob=*/true);
  EXPECT_EQ(result.token_id, 0);
  EXPECT_EQ(result.logprob, -kInf);
  ASSERT_EQ(result.top_logprobs.size(), 2u);
  EXPECT_EQ(result.top_logprobs[1].token_id, 1);
}

TEST(SamplerTest, DegenerateSettingsKeepOnlyTheMostLikelyToken) {
  const std::vector<float> logits = RandomLogits(300, 6);
  const int argmax =
      static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  Sampler sampler(300);
  for (const SamplingParams& base :
       {Params(1.0f, 0, 0.0f), Params(1.0f, 0, 1.0f, 1.0f), Params(1.0f, 0, 1.0f, 5.0f),
        Params(1e-40f), Params(1.0f, 1)}) {
    for (int i = 0; i < 200; ++i) {
      SamplingParams params = base;
      params.seed = i;
      ASSERT_EQ(DrawToken(sampler, logits, params, i), argmax);
    }
  }
}

// A grammar's mask removes tokens exactly as -inf logits would, whatever the filters, and
// leaves the log-probabilities the model's.
TEST(SamplerTest, AllowedTokensActAsMinusInfinity) {
  constexpr int kVocab = 300;
  Sampler sampler(kVocab);
  std::mt19937 rng(11);
  const std::vector<int> history = {1, 2, 3, 7};
  for (uint32_t trial = 0; trial < 200; ++trial) {
    const std::vector<float> logits = RandomLogits(kVocab, trial);
    std::vector<uint32_t> mask((kVocab + 31) / 32, 0);
    std::vector<float> removed = logits;
    const int density = 1 + trial % 5;  // 1 in `density` tokens allowed.
    bool any = false;
    for (int id = 0; id < kVocab; ++id) {
      if (rng() % density == 0 || (!any && id == kVocab - 1)) {
        mask[id / 32] |= 1u << (id % 32);
        any = true;
      } else {
        removed[id] = -std::numeric_limits<float>::infinity();
      }
    }
    SamplingParams params =
        Params(trial % 4 == 0 ? 0.0f : 0.7f, trial % 3 == 0 ? 5 : 0, trial % 2 == 0 ? 0.9f : 1.0f);
    params.repetition_penalty = trial % 7 == 0 ? 1.3f : 1.0f;
    params.seed = trial;
    params.num_logprobs = 2;
    std::vector<float> a = logits;
    std::vector<float> b = removed;
    const SampleResult masked =
        sampler.Sample(a, params, history, history, trial, true, mask.data());
    const SampleResult reference = sampler.Sample(b, params, history, history, trial, true);
    EXPECT_EQ(masked.token_id, reference.token_id) << trial;
    EXPECT_TRUE((mask[masked.token_id / 32] >> (masked.token_id % 32)) & 1u) << trial;
    EXPECT_NEAR(masked.logprob, LogSoftmax(logits)[masked.token_id], 1e-4) << trial;
  }
}

}  // namespace
}  // namespace conveyor::model
