// The worker's Prometheus metrics (docs/metrics.md), labelled with model and rank.
#pragma once

#include <string>

namespace prometheus {
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace conveyor::worker {

class WorkerMetrics {
 public:
  explicit WorkerMetrics(prometheus::Registry& registry);

  // Called once Init has loaded `model` as `rank`: fixes the labels and the sizes.
  void Initialized(const std::string& model, int rank, double load_s, double weight_bytes,
                   double kv_cache_bytes);
  void ObserveStep(double compute_s, int tokens);
  void CountStepError();

 private:
  prometheus::Registry& registry_;
  // Null until Initialized (the labels are not known before).
  prometheus::Histogram* step_compute_ = nullptr;
  prometheus::Histogram* step_tokens_ = nullptr;
  prometheus::Counter* steps_ = nullptr;
  prometheus::Counter* step_errors_ = nullptr;
};

}  // namespace conveyor::worker
