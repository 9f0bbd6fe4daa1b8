// The scheduler's Prometheus endpoint as conveyor-bench reads it: plain HTTP/1.0 GETs,
// the text format folded to one value per metric name, the gauges sampled during a run,
// and the counters' change over the run summarised (the bubble, tokens per step, KV
// slots used over allocated in the steady state, preemptions).
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace conveyor::bench {

struct MetricsUrl {
  std::string host;
  std::string port;
  std::string path = "/metrics";
  bool valid() const { return !host.empty(); }
};

// `url` (http://host:port/path), else the metrics port on `server`'s host; invalid if
// neither is given.
MetricsUrl ParseMetricsUrl(const std::string& url, const std::string& server, int port);

// GET the endpoint over plain HTTP/1.0; nullopt on any failure.
std::optional<std::string> HttpGet(const MetricsUrl& url, double timeout_s = 2.0);

// Prometheus text -> metric name (series name without labels) -> value summed over its
// label sets (e.g. requests_finished_total over every reason).
using MetricMap = std::map<std::string, double>;
MetricMap ParseMetrics(const std::string& text);
// The value of `name`, 0 if absent.
double Get(const MetricMap& m, const std::string& name);

struct GaugeSample {
  double t = 0;  // Seconds since the run's start.
  double running = 0, waiting = 0;
  double kv_blocks_used = 0, kv_blocks_total = 0;
  double kv_slots_used = 0, kv_slots_allocated = 0;
};
// The gauges of one scrape, taken `t` seconds into the run.
GaugeSample SampleGauges(const MetricMap& m, double t);

// The server's side of a run of `duration_s` seconds: the counters' change from `before`
// to `after`, and the gauges' steady state (samples more than `trim` of the run away
// from either end) with every sample.
nlohmann::json ServerMetricsReport(const MetricMap& before, const MetricMap& after,
                                   const std::vector<GaugeSample>& samples, double duration_s,
                                   double trim);

}  // namespace conveyor::bench
