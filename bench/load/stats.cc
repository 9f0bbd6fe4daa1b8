#include "bench/load/stats.h"

#include <algorithm>
#include <cmath>

namespace conveyor::bench {

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p / 100.0 * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

Stats Summarize(std::vector<double> v) {
  Stats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  s.p50 = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

nlohmann::json ToJson(const Stats& s) {
  return {{"n", s.n},     {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99}, {"min", s.min},   {"max", s.max}};
}

}  // namespace conveyor::bench
