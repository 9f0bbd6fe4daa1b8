// Summaries of a run's latencies: mean, min, max and the p50/p90/p99 percentiles
// (linear interpolation between the closest ranks, as numpy's default).
#pragma once

#include <vector>

#include "nlohmann/json.hpp"

namespace conveyor::bench {

struct Stats {
  int n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

// The p-th percentile (0-100) of sorted values; 0 for none.
double Percentile(const std::vector<double>& sorted, double p);
Stats Summarize(std::vector<double> v);
nlohmann::json ToJson(const Stats& s);

}  // namespace conveyor::bench
