// The scheduler's Prometheus metrics (names and meanings: docs/metrics.md). Every series
// carries the constant labels model and policy; the only other labels are closed sets, and
// conveyor_cache_config_info's block_size and num_gpu_blocks (constant while the workers are).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "scheduler/front_end.h"

namespace prometheus {
template <typename T>
class Family;
class Counter;
class Gauge;
class Histogram;
class Registry;
}  // namespace prometheus

namespace conveyor::scheduler {

class SchedulerMetrics {
 public:
  SchedulerMetrics(prometheus::Registry& registry, const std::string& model,
                   const std::string& policy);

  void ObserveFirstToken(double time_to_first_token_s);
  void ObserveInterToken(double gap_s);
  void ObserveQueueTime(double queue_s);
  // reason: length, eos, stop, cancelled, deadline or error; api: the front end the
  // request came through.
  void ObserveFinished(std::string_view reason, double e2e_s, int prompt_tokens,
                       int generated_tokens, FrontEnd api = FrontEnd::kGrpc);
  void ObserveStep(double duration_s, int tokens, int batch_slots, int wasted_slots);
  void AddPromptTokens(int n);
  void AddPrefillTokens(int n);
  void AddGeneratedTokens(int n);
  // Tokens sampled for requests that had ended by the time the step's answer arrived.
  void AddDiscardedTokens(int n);
  void AddPreemptions(int n);
  // Speculative decoding: one sequence's `drafted` draft tokens in a step, of which the
  // first `kept` were kept.
  void ObserveDrafts(int drafted, int kept);
  void AddPrefixCacheLookups(uint64_t queries, uint64_t hits);
  void CountRejected(absl::StatusCode code, FrontEnd api = FrontEnd::kGrpc);
  // The HTTP front's connections open now, and what its transport refused by itself
  // (reason: one of HttpTransport's k* reasons; an unknown one is counted as "other").
  void SetHttpConnections(int open);
  void CountHttpRefused(std::string_view reason);
  // kv_slots_used: tokens whose K/V the running requests hold; kv_slots_allocated: the
  // slots of the blocks they hold (their ratio shows what block rounding wastes).
  void SetPool(int running, int waiting, int kv_blocks_used, int kv_blocks_total,
               int64_t kv_slots_used, int64_t kv_slots_allocated);
  // The KV cache's shape, as routers read it (docs/scaling.md): conveyor_cache_config_info's
  // labels. Called with every SetPool; relabels only when a value changed (a worker
  // recovery may bring another block count).
  void SetCacheConfig(int block_size, int num_blocks);
  void SetWorkersReady(int ready);
  // The pool as the last SetPool left it, for the routers that poll a load endpoint
  // instead of scraping (SGLang's: GET /get_load, docs/scaling.md).
  struct Load {
    int running = 0;
    int waiting = 0;
    int64_t kv_slots_used = 0;
  };
  Load CurrentLoad() const;
  // The metrics page in Prometheus' text format, as --metrics_port serves it (the HTTP
  // API serves it too, at GET /metrics, where Kubernetes' endpoint pickers scrape).
  std::string Page() const;
  // Worker failures and recovery (docs/failure-handling.md).
  void CountWorkerFailure();
  void ObserveRecovery(double outage_s);
  void AddResumed(int requests, int64_t recomputed_tokens);

 private:
  prometheus::Histogram* ttft_;
  prometheus::Histogram* itl_;
  prometheus::Histogram* e2e_;
  prometheus::Histogram* queue_time_;
  prometheus::Histogram* prompt_tokens_hist_;
  prometheus::Histogram* generated_tokens_hist_;
  prometheus::Histogram* step_duration_;
  prometheus::Histogram* step_tokens_;
  prometheus::Gauge* running_;
  prometheus::Gauge* waiting_;
  prometheus::Gauge* kv_used_;
  prometheus::Gauge* kv_total_;
  prometheus::Gauge* kv_usage_;
  prometheus::Registry* registry_;
  prometheus::Family<prometheus::Gauge>* cache_config_;
  prometheus::Gauge* cache_config_now_ = nullptr;  // The labels in use, or null.
  int cache_block_size_ = -1;
  int cache_num_blocks_ = -1;
  prometheus::Gauge* workers_ready_;
  prometheus::Gauge* kv_slots_used_;
  prometheus::Gauge* kv_slots_allocated_;
  prometheus::Counter* prompt_tokens_;
  prometheus::Counter* prefill_tokens_;
  prometheus::Counter* generated_tokens_;
  prometheus::Counter* discarded_tokens_;
  prometheus::Counter* preemptions_;
  prometheus::Counter* draft_tokens_;
  prometheus::Counter* accepted_draft_tokens_;
  prometheus::Counter* verifications_;
  // Per draft position (0: the first token proposed): proposed, and kept.
  prometheus::Family<prometheus::Counter>* position_drafts_;
  prometheus::Family<prometheus::Counter>* position_accepted_;
  prometheus::Counter* worker_failures_;
  prometheus::Counter* worker_recoveries_;
  prometheus::Counter* resumed_requests_;
  prometheus::Counter* recomputed_tokens_;
  prometheus::Histogram* recovery_seconds_;
  prometheus::Counter* prefix_queries_;
  prometheus::Counter* prefix_hits_;
  prometheus::Counter* slot_steps_;
  prometheus::Counter* wasted_slot_steps_;
  prometheus::Family<prometheus::Counter>* finished_;
  prometheus::Family<prometheus::Counter>* rejected_;
  prometheus::Gauge* http_connections_;
  prometheus::Family<prometheus::Counter>* http_refused_;
  std::string model_;
  std::string policy_;
};

}  // namespace conveyor::scheduler
