#include "bench/load/workload.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"

namespace conveyor::bench {
namespace {

bool ParseRange(const std::string& s, int* lo, int* hi) {
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], lo) || !absl::SimpleAtoi(parts[1], hi)) {
    return false;
  }
  return *lo >= 1 && *hi >= *lo;
}

}  // namespace

std::vector<RequestSpec> MakeWorkload(const WorkloadOptions& o, int vocab_size, int max_context,
                                      std::string* error) {
  const std::string& kind = o.kind;
  const int n = o.num_requests;
  std::mt19937_64 rng(o.seed);
  std::vector<RequestSpec> specs;
  int in_lo = 0, in_hi = 0, out_lo = 0, out_hi = 0;
  if (kind == "uniform" && (!ParseRange(o.input_len_range, &in_lo, &in_hi) ||
                            !ParseRange(o.output_len_range, &out_lo, &out_hi))) {
    *error = "--input_len_range and --output_len_range must be MIN:MAX with 1 <= MIN <= MAX";
    return {};
  }
  if (kind != "fixed" && kind != "uniform" && kind != "exponential" && kind != "chat") {
    *error = "--workload must be fixed, uniform, exponential or chat";
    return {};
  }
  std::exponential_distribution<double> expo(1.0 / o.output_mean);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int32_t> token(3, std::max(3, vocab_size - 1));
  int clamped = 0;
  for (int i = 0; i < n; ++i) {
    int in = 0, out = 0;
    if (kind == "fixed") {
      in = o.input_len;
      out = o.output_len;
    } else if (kind == "uniform") {
      in = std::uniform_int_distribution<int>(in_lo, in_hi)(rng);
      out = std::uniform_int_distribution<int>(out_lo, out_hi)(rng);
    } else if (kind == "exponential") {
      in = o.input_len;
      out = static_cast<int>(std::ceil(expo(rng)));
      out = std::clamp(out, 1, o.output_cap);
    } else {
      const double li = o.chat_input_median * std::exp(o.chat_input_sigma * normal(rng));
      const double lo = o.chat_output_median * std::exp(o.chat_output_sigma * normal(rng));
      in = std::clamp(static_cast<int>(std::lround(li)), 4, o.chat_max_input);
      out = std::clamp(static_cast<int>(std::lround(lo)), 1, o.chat_max_output);
    }
    if (!o.prompts.empty()) in = static_cast<int>(o.prompts[i % o.prompts.size()].size());
    if (in < 1) in = 1;
    if (in + out > max_context) {
      ++clamped;
      in = std::min(in, max_context - 1);
      out = max_context - in;
    }
    RequestSpec spec;
    spec.index = i;
    spec.max_new_tokens = out;
    spec.seed = rng();
    if (!o.prompts.empty()) {
      const std::vector<int32_t>& prompt = o.prompts[i % o.prompts.size()];
      spec.prompt.assign(prompt.end() - in, prompt.end());  // Its end, if shortened.
    } else {
      spec.prompt.resize(in);
      for (int32_t& id : spec.prompt) id = token(rng);
    }
    specs.push_back(std::move(spec));
  }
  if (clamped > 0) {
    std::fprintf(stderr, "conveyor-bench: %d request(s) shortened to the model's context (%d)\n",
                 clamped, max_context);
  }
  return specs;
}

std::vector<double> MakeArrivals(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(n, 0.0);
  if (!std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  // Gamma(shape k, scale 1/(k*rate)) has mean 1/rate; k = 1 is the exponential (Poisson).
  std::gamma_distribution<double> gap(burstiness, 1.0 / (burstiness * rate));
  double now = 0;
  for (int i = 0; i < n; ++i) {
    if (i > 0) now += gap(rng);
    t[i] = now;
  }
  return t;
}

}  // namespace conveyor::bench
