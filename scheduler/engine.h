// The scheduler loop. One thread owns every request and every KV block: each iteration
// it takes in arrivals and cancellations, asks the batching policy for a plan, sends one
// delta-encoded Step to the workers (StepEncoder), then appends the sampled tokens,
// checks stop conditions (StopChecker), retires finished requests and queues what each
// client is owed; a thread of its own writes that to the clients while the next step
// runs (ResponseDispatcher).
//
// By default the next step is planned and sent while the last one runs, so the workers
// never wait for the scheduler: the tokens a step in flight will sample are placeholders
// (Request::kPendingToken) until its answer arrives, and a request that stops at step N
// is computed once more in step N+1, its token discarded (docs/design.md).
//
// Other threads (the gRPC API) only Submit and Cancel; both are cheap and never block
// on a step.
//
// The engine composes parts that each keep one kind of state: the steps in flight
// (StepPipeline), an outage of the workers (WorkerRecovery), what the workers hold
// (StepEncoder), the KV blocks (BlockManager), the waiting and running requests
// (RequestPool), the messages owed to clients (ResponseDispatcher, stream_messages.h).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/block_manager.h"
#include "scheduler/metrics.h"
#include "scheduler/ngram_proposer.h"
#include "scheduler/policy.h"
#include "scheduler/request.h"
#include "scheduler/request_pool.h"
#include "scheduler/response_dispatcher.h"
#include "scheduler/step_encoder.h"
#include "scheduler/step_executor.h"
#include "scheduler/step_pipeline.h"
#include "scheduler/stop_checker.h"
#include "scheduler/worker_recovery.h"
#include "text/tokenizer.h"

namespace conveyor::scheduler {

class Engine {
 public:
  struct Options {
    int num_kv_blocks = 0;
    int block_size = 16;
    bool enable_prefix_caching = true;
    // Requests waiting for admission before RESOURCE_EXHAUSTED.
    int max_queue = 1024;
    int max_context_tokens = 1 << 30;  // The model's context (requests end at it).

    // Worker failures (a step that fails in transport, times out or finds a worker that
    // restarted; an idle check that finds one gone). The engine keeps the requests and,
    // if the executor can, recovers the workers: for this long before it fails the
    // requests it kept with UNAVAILABLE (it goes on trying after that).
    std::chrono::milliseconds worker_recovery_timeout{120'000};
    // While idle, how often to check that the workers are alive.
    std::chrono::milliseconds idle_check_interval{2'000};
    // A request that has lived through this many worker failures fails with the next,
    // so that a request that crashes its worker cannot do so forever.
    int max_worker_failures_per_request = 8;
    // Called on the loop thread when the workers stop being ready (a failure) and when
    // they are ready again (health, metrics).
    std::function<void(bool ready)> on_workers_ready;
    // Steps sent and not yet answered, at most: 1 plans each step once the last one's
    // answer is in; 2 sends the next step while the last one runs (the executor's
    // workers must run steps in previous_step_id order). Other values count as the
    // nearer of these.
    int max_steps_in_flight = 2;
    // Speculative decoding (docs/speculative-decoding.md): proposed tokens verified by the
    // workers in the decode step, the outputs unchanged. Speculating, the engine plans
    // each step once the last one's answer is in (max_steps_in_flight counts as 1): how
    // many tokens a step keeps is known only then.
    struct Speculative {
      // off; ngram (prompt lookup, ngram_proposer.h); suffix (the longest repeat,
      // suffix_proposer.h; prompt_lookup_min is its shortest match); draft (a draft model
      // on the workers proposes, at the end of each step, the next step's drafts).
      std::string method = "off";
      // draft: the draft model's path as the workers see it (InitRequest.draft_model_path).
      std::string model;
      int num_tokens = 4;  // Most draft tokens per sequence and step.
      NgramOptions ngram;
      // Decodes in a step above which no draft is proposed: with many sequences a step
      // is no longer bound by reading the weights, and verifying drafts costs compute.
      int max_batch = 8;
      int max_step_tokens = 2048;  // The step's token budget (drafts count).
      bool enabled() const { return method != "off" && num_tokens > 0; }
    };
    Speculative speculative;
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
    // Tokens sampled for requests that had ended when the step's answer arrived.
    uint64_t discarded_tokens = 0;
    // Speculative decoding: tokens proposed, and of those kept.
    uint64_t draft_tokens = 0;
    uint64_t accepted_draft_tokens = 0;
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
  // Queues the n choices of one request (built alike but for their seeds), all or none,
  // as Submit does each; returns their ids in order. They share the prompt's KV blocks:
  // the first computes the prompt, the others start from its full blocks
  // (SharedPrompt).
  absl::StatusOr<std::vector<uint64_t>> SubmitChoices(
      std::vector<std::unique_ptr<Request>> choices);

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
  // False from a worker failure until the workers are back.
  bool workers_ready() const { return workers_ready_.load(); }
  const char* policy_name() const { return policy_->name(); }

 private:
  void Loop();
  // Takes arrivals and cancellations; returns false when the loop must exit.
  bool TakeInbox(bool wait, Clock::time_point wake_at);
  void ExpireDeadlines(Clock::time_point now);
  // Queues the choices that wait for their leader to compute the prompt they share, once
  // it has (they take references on its blocks then), or once it cannot (it ended).
  void ReleaseParked();
  // Drops every choice group's reference on its prompt blocks (the workers' KV is gone or
  // unknown); the choices start over like any request.
  void DropSharedPrompts();
  // Records when each of plan's requests is scheduled for the first time.
  void MarkScheduled(const StepPlan& plan);
  // Sends `plan` as the next step. Its requests advance as if it had run: their computed
  // tokens, and a pending token for each that samples.
  void Launch(const StepPlan& plan, Clock::time_point planned);
  // Speculative decoding: gives the plan's decodes the tokens the proposer expects next,
  // within the step's token budget and the KV blocks free now.
  void AttachDrafts(StepPlan& plan);
  // After a step's answer: the acceptance of its drafts (metrics, and each request's
  // next draft length). `answered` counts the response's tokens per request.
  void AccountDrafts(const StepPipeline::Step& step,
                     const std::unordered_map<uint64_t, int>& answered);
  // Waits for the oldest step in flight and applies its answer, or handles its failure.
  void CompleteOldestStep();
  void ApplyStep(const StepPipeline::Step& step, const worker::v1::StepResponse& response);
  void FailStep(const absl::Status& status);
  // Whether a failed step or check means the workers must be recovered (rather than that
  // the scheduler sent a step they rejected).
  bool IsWorkerFailure(const absl::Status& status) const;
  // Keeps every running request for recompute (failing those that cannot go on) and
  // starts recovering the workers. `step` is the step that failed, if any.
  void OnWorkerFailure(const absl::Status& status, const StepPipeline::Step* step);
  // Takes the recovery's result if it is in: resumes serving, or after the timeout fails
  // what was kept (the recovery goes on).
  void PollRecovery();
  void SetWorkersReady(bool ready);
  // Streams one sampled token; ends the request if it stops here.
  void OnToken(Request* r, const worker::v1::SampledToken& token, Clock::time_point now);
  // Ends r's answer with `status` (and for OK, the final message `last`, which gets the
  // reason and the usage).
  void Finish(Request* r, const absl::Status& status, FinishReason reason,
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
  const StopChecker stop_checker_;

  // Loop-thread state.
  BlockManager blocks_;
  RequestPool pool_;
  RequestTable requests_;
  std::vector<Request*> parked_;  // Choices waiting for their leader (ReleaseParked).
  StepEncoder encoder_;           // What the workers hold; every step goes through it.
  StepPipeline pipeline_;
  Clock::time_point last_step_done_;  // When the last step's answer was applied.
  ResponseDispatcher dispatcher_;     // Every message to a client goes through it.
  Stats counters_;                    // Published to stats_ after each iteration.
  uint64_t prefix_queries_seen_ = 0;
  uint64_t prefix_hits_seen_ = 0;
  Clock::time_point last_worker_contact_;  // For the idle liveness check.
  std::atomic<bool> workers_ready_{true};

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

  // After mu_ and wake_, which its thread's wake-up uses: destroyed before them.
  WorkerRecovery recovery_;

  std::thread thread_;
};

}  // namespace conveyor::scheduler
