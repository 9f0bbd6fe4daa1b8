#include "worker/metrics.h"

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"

namespace conveyor::worker {

WorkerMetrics::WorkerMetrics(prometheus::Registry& registry) : registry_(registry) {}

void WorkerMetrics::Initialized(const std::string& model, int rank, double load_s,
                                double weight_bytes, double kv_cache_bytes) {
  const prometheus::Labels labels{{"model", model}, {"rank", std::to_string(rank)}};
  auto gauge = [&](const char* name, const char* help) -> prometheus::Gauge& {
    return prometheus::BuildGauge().Name(name).Help(help).Register(registry_).Add(labels);
  };
  gauge("conveyor_worker_model_load_seconds", "Time the last Init took.").Set(load_s);
  gauge("conveyor_worker_weight_bytes", "Weight memory held.").Set(weight_bytes);
  gauge("conveyor_worker_kv_cache_bytes", "KV-cache memory held.").Set(kv_cache_bytes);
  step_compute_ = &prometheus::BuildHistogram()
                       .Name("conveyor_worker_step_compute_seconds")
                       .Help("Forward pass and sampling of one step.")
                       .Register(registry_)
                       .Add(labels, prometheus::Histogram::BucketBoundaries{
                                        0.0005, 0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064,
                                        0.128, 0.256, 0.512, 1, 2, 4, 8});
  step_tokens_ =
      &prometheus::BuildHistogram()
           .Name("conveyor_worker_step_tokens")
           .Help("Tokens in one step.")
           .Register(registry_)
           .Add(labels, prometheus::Histogram::BucketBoundaries{1, 2, 4, 8, 16, 32, 64, 128, 256,
                                                                512, 1024, 2048, 4096, 8192});
  steps_ = &prometheus::BuildCounter()
                .Name("conveyor_worker_steps_total")
                .Help("Steps executed.")
                .Register(registry_)
                .Add(labels);
  step_errors_ = &prometheus::BuildCounter()
                      .Name("conveyor_worker_step_errors_total")
                      .Help("Steps rejected or failed.")
                      .Register(registry_)
                      .Add(labels);
}

void WorkerMetrics::ObserveStep(double compute_s, int tokens) {
  if (steps_ == nullptr) return;
  step_compute_->Observe(compute_s);
  step_tokens_->Observe(tokens);
  steps_->Increment();
}

void WorkerMetrics::CountStepError() {
  if (step_errors_ != nullptr) step_errors_->Increment();
}

}  // namespace conveyor::worker
