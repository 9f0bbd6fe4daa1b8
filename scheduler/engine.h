// The scheduler loop. One thread owns every request and every KV block: each iteration
// it takes in arrivals and cancellations, asks the batching policy for a plan, sends one
// delta-encoded Step to the workers, then appends the sampled tokens, streams them,
// checks stop conditions and retires finished requests.
//
// Other threads (the gRPC API) only Submit and Cancel; both are cheap and never block
// on a step.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "common/tokenizer.h"
#include "scheduler/block_manager.h"
#include "scheduler/metrics.h"
#include "scheduler/policy.h"
#include "scheduler/request.h"
#include "scheduler/request_pool.h"
#include "scheduler/step_executor.h"

namespace conveyor::scheduler {

class Engine {
 public:
  struct Options {
    int num_kv_blocks = 0;
    int block_size = 16;
    bool enable_prefix_caching = true;
    int max_queue = 1024;  // Requests waiting for admission before RESOURCE_EXHAUSTED.
    int max_context_tokens = 1 << 30;  // The model's context (requests end at it).
  };

  // Counters for tests and logs (the Prometheus view is SchedulerMetrics).
  struct Stats {
    uint64_t steps = 0;
    uint64_t prefill_tokens = 0;    // Prompt tokens computed (cache hits excluded).
    uint64_t generated_tokens = 0;  // Tokens streamed.
    uint64_t preemptions = 0;
    uint64_t finished = 0;
    uint64_t batch_slot_steps = 0;
    uint64_t wasted_slot_steps = 0;
    int running = 0;
    int waiting = 0;
    int kv_blocks_used = 0;
    int kv_blocks_total = 0;
  };

  // `executor`, `tokenizer` and `metrics` (nullable) must outlive the engine.
  Engine(const Options& options, std::unique_ptr<BatchPolicy> policy, StepExecutor* executor,
         const Tokenizer* tokenizer, SchedulerMetrics* metrics);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Starts the loop thread.
  void Start();

  // Queues a built request (see request_builder.h). Sets its id and arrival; from then
  // on the request's sink gets exactly one Finish. Returns RESOURCE_EXHAUSTED if the
  // queue is full and UNAVAILABLE once draining or stopped; the sink is then untouched.
  absl::StatusOr<uint64_t> Submit(std::unique_ptr<Request> request);

  // Ends request `id` with CANCELLED at the next iteration and frees its blocks.
  void Cancel(uint64_t id);

  // Stops admitting new requests (Submit returns UNAVAILABLE); running and queued ones
  // go on to completion.
  void StartDrain();
  // Requests submitted and not yet finished.
  int num_live_requests() const;
  // Ends every live request with `status` and stops the loop. Idempotent.
  void Stop(const absl::Status& status);

  Stats stats() const;
  const char* policy_name() const { return policy_->name(); }

 private:
  void Loop();
  // Takes arrivals and cancellations; returns false when the loop must exit.
  bool TakeInbox(bool wait, Clock::time_point wake_at);
  void ExpireDeadlines(Clock::time_point now);
  // Builds the wire step for `plan` (dropping pending sequences first).
  worker::v1::StepRequest BuildStep(const StepPlan& plan);
  void ApplyStep(const StepPlan& plan, const worker::v1::StepResponse& response);
  void FailStep(const StepPlan& plan, const absl::Status& status);
  // Streams one sampled token; ends the request if it stops here.
  void OnToken(Request* r, const worker::v1::SampledToken& token, Clock::time_point now);
  // Ends r's answer with `status` (and for OK, the final message `last`).
  void Finish(Request* r, const absl::Status& status, std::string_view reason,
              v1::GenerateResponse* last);
  // Removes r from the pool and tells the workers to drop it.
  void Retire(Request* r);
  Clock::time_point NextWake() const;
  void PublishStats();

  const Options options_;
  std::unique_ptr<BatchPolicy> policy_;
  StepExecutor* executor_;
  const Tokenizer* tokenizer_;
  SchedulerMetrics* metrics_;

  // Loop-thread state.
  BlockManager blocks_;
  RequestPool pool_;
  std::unordered_map<uint64_t, std::unique_ptr<Request>> requests_;
  std::vector<uint64_t> pending_drops_;  // Sequences the workers must forget.
  bool reset_workers_ = false;           // The next step clears the workers' state.
  Stats counters_;                       // Published to stats_ after each iteration.
  uint64_t next_step_id_ = 1;
  uint64_t prefix_queries_seen_ = 0;
  uint64_t prefix_hits_seen_ = 0;

  // Shared with Submit/Cancel/Stop.
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::vector<std::unique_ptr<Request>> inbox_;
  std::vector<uint64_t> cancels_;
  uint64_t next_request_id_ = 1;
  int live_requests_ = 0;
  bool draining_ = false;
  bool stopping_ = false;
  absl::Status stop_status_;
  Stats stats_;  // A copy of counters_, published by the loop.

  std::thread thread_;
};

}  // namespace conveyor::scheduler
