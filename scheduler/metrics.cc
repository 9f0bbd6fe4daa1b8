#include "scheduler/metrics.h"

#include <algorithm>
#include <cctype>
#include <sstream>

#include "prometheus/counter.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"

namespace conveyor::scheduler {
namespace {

using prometheus::Histogram;

// Latency buckets from 1 ms to 2 min, roughly ×2 apart.
Histogram::BucketBoundaries LatencyBuckets() {
  return {0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3,
          0.6,   1.2,    2.5,   5,    10,   20,   40,   80,   120};
}

Histogram::BucketBoundaries TokenBuckets() {
  return {1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384};
}

// HttpTransport's refusal reasons (kept in step with http_transport.h; the metrics library
// does not depend on the HTTP front).
constexpr const char* kHttpRefusalReasons[] = {
    "connection_limit", "header_timeout", "body_timeout", "header_too_large",
    "body_too_large",   "body_budget",    "malformed",    "slow_reader",
    "tls_handshake",    "idle_evicted",   "other"};

std::string CodeLabel(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

}  // namespace

SchedulerMetrics::SchedulerMetrics(prometheus::Registry& registry, const std::string& model,
                                   const std::string& policy)
    : registry_(&registry), model_(model), policy_(policy) {
  const prometheus::Labels labels{{"model", model}, {"policy", policy}};
  auto histogram = [&](const char* name, const char* help, const Histogram::BucketBoundaries& b) {
    return &prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(labels, b);
  };
  auto gauge = [&](const char* name, const char* help) {
    return &prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
  };
  auto counter = [&](const char* name, const char* help) {
    return &prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
  };
  ttft_ = histogram("conveyor_time_to_first_token_seconds",
                    "Time from a request's arrival to its first streamed token.", LatencyBuckets());
  itl_ = histogram("conveyor_inter_token_latency_seconds",
                   "Gap between consecutive tokens of one request.", LatencyBuckets());
  e2e_ = histogram("conveyor_e2e_request_latency_seconds",
                   "Time from a request's arrival to its final message.", LatencyBuckets());
  queue_time_ =
      histogram("conveyor_request_queue_time_seconds",
                "Time from a request's arrival to its first scheduling.", LatencyBuckets());
  prompt_tokens_hist_ = histogram("conveyor_request_prompt_tokens",
                                  "Prompt length of finished requests.", TokenBuckets());
  generated_tokens_hist_ = histogram("conveyor_request_generated_tokens",
                                     "Tokens generated per finished request.", TokenBuckets());
  step_duration_ = histogram("conveyor_step_duration_seconds",
                             "One step as the scheduler loop sees it: planning (unless it "
                             "overlapped the step before), worker round trip, streaming.",
                             LatencyBuckets());
  step_tokens_ = histogram("conveyor_step_tokens", "Tokens computed per step.", TokenBuckets());
  running_ = gauge("conveyor_requests_running", "Requests holding KV blocks.");
  waiting_ = gauge("conveyor_requests_waiting", "Requests queued for admission.");
  kv_used_ = gauge("conveyor_kv_blocks_used", "KV blocks referenced by live requests.");
  kv_total_ = gauge("conveyor_kv_blocks_capacity", "KV blocks the workers hold.");
  kv_usage_ = gauge("conveyor_kv_cache_usage_ratio",
                    "KV blocks used / KV blocks held, 0 to 1 (the routers' KV utilisation).");
  cache_config_ = &prometheus::BuildGauge()
                       .Name("conveyor_cache_config_info")
                       .Help(
                           "1, labelled with the KV cache's block_size (tokens) and "
                           "num_gpu_blocks (blocks the workers hold; vLLM's label names).")
                       .Register(registry);
  kv_slots_used_ = gauge("conveyor_kv_slots_used",
                         "Token slots of KV blocks that hold computed tokens of running requests.");
  kv_slots_allocated_ =
      gauge("conveyor_kv_slots_allocated", "Token slots of the KV blocks running requests hold.");
  workers_ready_ = gauge("conveyor_workers_ready", "Worker ranks initialised and answering.");
  prompt_tokens_ = counter("conveyor_prompt_tokens_total", "Prompt tokens of admitted requests.");
  prefill_tokens_ = counter("conveyor_prefill_tokens_total",
                            "Prompt tokens computed (prefix-cache hits excluded).");
  generated_tokens_ = counter("conveyor_generated_tokens_total", "Tokens streamed to clients.");
  discarded_tokens_ = counter("conveyor_discarded_tokens_total",
                              "Tokens sampled for requests that had already ended when the "
                              "step's answer arrived (a step sent before the last one's answer).");
  preemptions_ =
      counter("conveyor_preemptions_total", "Requests preempted (KV freed, recomputed later).");
  draft_tokens_ = counter("conveyor_spec_draft_tokens_total",
                          "Speculative decoding: draft tokens proposed and verified.");
  accepted_draft_tokens_ =
      counter("conveyor_spec_accepted_tokens_total",
              "Speculative decoding: draft tokens kept (each one a step saved).");
  verifications_ = counter("conveyor_spec_verifications_total",
                           "Speculative decoding: sequences verified with drafts, per step "
                           "(accepted ÷ verifications is the mean accepted length).");
  position_drafts_ = &prometheus::BuildCounter()
                          .Name("conveyor_spec_position_drafts_total")
                          .Help(
                              "Speculative decoding: draft tokens proposed at each position "
                              "(0: the first after the last known token).")
                          .Register(registry);
  position_accepted_ = &prometheus::BuildCounter()
                            .Name("conveyor_spec_position_accepted_total")
                            .Help(
                                "Speculative decoding: draft tokens kept at each position "
                                "(÷ proposed: the acceptance rate per position).")
                            .Register(registry);
  worker_failures_ = counter("conveyor_worker_failures_total",
                             "Worker failures seen: failed or timed-out steps, failed liveness "
                             "checks (a rank that died, hung or restarted).");
  worker_recoveries_ = counter("conveyor_worker_recoveries_total",
                               "Times every worker rank was re-initialised after a failure.");
  resumed_requests_ = counter("conveyor_resumed_requests_total",
                              "Running requests kept through a worker failure, to be recomputed.");
  recomputed_tokens_ = counter("conveyor_recomputed_tokens_total",
                               "Tokens whose KV a worker failure lost (recomputed on resume).");
  recovery_seconds_ =
      histogram("conveyor_worker_recovery_seconds",
                "From a worker failure until every rank serves again.", LatencyBuckets());
  prefix_queries_ = counter("conveyor_prefix_cache_queries_total",
                            "Full prompt blocks looked up in the prefix cache.");
  prefix_hits_ =
      counter("conveyor_prefix_cache_hits_total", "Full prompt blocks found in the prefix cache.");
  slot_steps_ = counter("conveyor_batch_slot_steps_total", "Batch slots times steps run.");
  finished_ = &prometheus::BuildCounter()
                   .Name("conveyor_requests_finished_total")
                   .Help("Requests finished, by reason and client API.")
                   .Register(registry);
  rejected_ = &prometheus::BuildCounter()
                   .Name("conveyor_requests_rejected_total")
                   .Help("Requests refused before admission, by status code and client API.")
                   .Register(registry);
  for (FrontEnd api : {FrontEnd::kGrpc, FrontEnd::kHttp}) {
    const std::string api_label(FrontEndName(api));
    for (const char* reason : {"length", "eos", "stop", "cancelled", "deadline", "error"}) {
      finished_->Add(
          {{"model", model}, {"policy", policy}, {"reason", reason}, {"api", api_label}});
    }
    for (absl::StatusCode code :
         {absl::StatusCode::kInvalidArgument, absl::StatusCode::kNotFound,
          absl::StatusCode::kResourceExhausted, absl::StatusCode::kUnavailable,
          absl::StatusCode::kDeadlineExceeded}) {
      rejected_->Add(
          {{"model", model}, {"policy", policy}, {"code", CodeLabel(code)}, {"api", api_label}});
    }
  }
  http_connections_ =
      gauge("conveyor_http_connections", "Connections open on the OpenAI-compatible HTTP port.");
  http_refused_ = &prometheus::BuildCounter()
                       .Name("conveyor_http_refused_total")
                       .Help(
                           "Connections and requests the HTTP port refused before they "
                           "reached the API, by reason (docs/http-api.md).")
                       .Register(registry);
  for (const char* reason : kHttpRefusalReasons) {
    http_refused_->Add({{"model", model}, {"policy", policy}, {"reason", reason}});
  }
  wasted_slot_steps_ = counter("conveyor_batch_slot_steps_wasted_total",
                               "Batch slot-steps held by members whose answer was complete.");
}

void SchedulerMetrics::ObserveFirstToken(double s) { ttft_->Observe(s); }
void SchedulerMetrics::ObserveInterToken(double s) { itl_->Observe(s); }
void SchedulerMetrics::ObserveQueueTime(double s) { queue_time_->Observe(s); }

void SchedulerMetrics::ObserveFinished(std::string_view reason, double e2e_s, int prompt_tokens,
                                       int generated_tokens, FrontEnd api) {
  e2e_->Observe(e2e_s);
  prompt_tokens_hist_->Observe(prompt_tokens);
  generated_tokens_hist_->Observe(generated_tokens);
  finished_
      ->Add({{"model", model_},
             {"policy", policy_},
             {"reason", std::string(reason)},
             {"api", std::string(FrontEndName(api))}})
      .Increment();
}

void SchedulerMetrics::ObserveStep(double duration_s, int tokens, int batch_slots,
                                   int wasted_slots) {
  step_duration_->Observe(duration_s);
  step_tokens_->Observe(tokens);
  slot_steps_->Increment(batch_slots);
  wasted_slot_steps_->Increment(wasted_slots);
}

void SchedulerMetrics::AddPromptTokens(int n) { prompt_tokens_->Increment(n); }
void SchedulerMetrics::AddPrefillTokens(int n) { prefill_tokens_->Increment(n); }
void SchedulerMetrics::AddGeneratedTokens(int n) { generated_tokens_->Increment(n); }
void SchedulerMetrics::AddDiscardedTokens(int n) { discarded_tokens_->Increment(n); }
void SchedulerMetrics::AddPreemptions(int n) { preemptions_->Increment(n); }

void SchedulerMetrics::ObserveDrafts(int drafted, int kept) {
  draft_tokens_->Increment(drafted);
  accepted_draft_tokens_->Increment(kept);
  verifications_->Increment();
  for (int p = 0; p < drafted; ++p) {
    const prometheus::Labels labels{
        {"model", model_}, {"policy", policy_}, {"position", std::to_string(p)}};
    position_drafts_->Add(labels).Increment();
    if (p < kept) position_accepted_->Add(labels).Increment();
  }
}

void SchedulerMetrics::AddPrefixCacheLookups(uint64_t queries, uint64_t hits) {
  prefix_queries_->Increment(static_cast<double>(queries));
  prefix_hits_->Increment(static_cast<double>(hits));
}

void SchedulerMetrics::CountRejected(absl::StatusCode code, FrontEnd api) {
  rejected_
      ->Add({{"model", model_},
             {"policy", policy_},
             {"code", CodeLabel(code)},
             {"api", std::string(FrontEndName(api))}})
      .Increment();
}

void SchedulerMetrics::SetHttpConnections(int open) { http_connections_->Set(open); }

void SchedulerMetrics::CountHttpRefused(std::string_view reason) {
  const auto* known =
      std::find(std::begin(kHttpRefusalReasons), std::end(kHttpRefusalReasons), reason);
  http_refused_
      ->Add({{"model", model_},
             {"policy", policy_},
             {"reason", known != std::end(kHttpRefusalReasons) ? *known : "other"}})
      .Increment();
}

void SchedulerMetrics::SetPool(int running, int waiting, int kv_used, int kv_total,
                               int64_t kv_slots_used, int64_t kv_slots_allocated) {
  kv_slots_used_->Set(static_cast<double>(kv_slots_used));
  kv_slots_allocated_->Set(static_cast<double>(kv_slots_allocated));
  running_->Set(running);
  waiting_->Set(waiting);
  kv_used_->Set(kv_used);
  kv_total_->Set(kv_total);
  kv_usage_->Set(kv_total > 0 ? static_cast<double>(kv_used) / kv_total : 0.0);
}

SchedulerMetrics::Load SchedulerMetrics::CurrentLoad() const {
  return {static_cast<int>(running_->Value()), static_cast<int>(waiting_->Value()),
          static_cast<int64_t>(kv_slots_used_->Value())};
}

void SchedulerMetrics::SetCacheConfig(int block_size, int num_blocks) {
  if (block_size == cache_block_size_ && num_blocks == cache_num_blocks_) return;
  if (cache_config_now_ != nullptr) cache_config_->Remove(cache_config_now_);
  cache_block_size_ = block_size;
  cache_num_blocks_ = num_blocks;
  cache_config_now_ = &cache_config_->Add({{"model", model_},
                                           {"block_size", std::to_string(block_size)},
                                           {"num_gpu_blocks", std::to_string(num_blocks)}});
  cache_config_now_->Set(1);
}

std::string SchedulerMetrics::Page() const {
  std::ostringstream page;
  prometheus::TextSerializer().Serialize(page, registry_->Collect());
  return page.str();
}

void SchedulerMetrics::SetWorkersReady(int ready) { workers_ready_->Set(ready); }

void SchedulerMetrics::CountWorkerFailure() { worker_failures_->Increment(); }

void SchedulerMetrics::ObserveRecovery(double outage_s) {
  worker_recoveries_->Increment();
  recovery_seconds_->Observe(outage_s);
}

void SchedulerMetrics::AddResumed(int requests, int64_t recomputed_tokens) {
  resumed_requests_->Increment(requests);
  recomputed_tokens_->Increment(static_cast<double>(recomputed_tokens));
}

}  // namespace conveyor::scheduler
