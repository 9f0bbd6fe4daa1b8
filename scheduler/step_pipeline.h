// The steps sent to the workers and not yet answered, oldest first: the engine's
// pipeline. With two in flight the scheduler plans and sends step N+1 while the workers
// run step N, so the workers never wait for it (docs/design.md, "The scheduler loop").
//
// Launching a step advances its requests as if it had run: their computed tokens, and a
// placeholder (kPendingToken) for each token it will sample. The answer fills the
// placeholders in (the engine's job); a failure takes back what the failed step and every
// step after it had advanced (Abandon), so that what the scheduler believes matches what
// the workers hold again.
//
// Owned and touched only by the scheduler loop's thread.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/policy.h"
#include "scheduler/request.h"
#include "scheduler/step_executor.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

// The engine's live requests by id.
using RequestTable = std::unordered_map<uint64_t, std::unique_ptr<Request>>;

class StepPipeline {
 public:
  // A step sent and not yet answered: what the engine needs of its plan then. Requests
  // are named by id, as one may end while the step runs.
  struct Step {
    struct Sequence {
      uint64_t id = 0;
      int num_tokens = 0;          // Computed by this step.
      int num_computed_after = 0;  // The request's computed tokens once this step ran.
      uint32_t residency = 0;      // Request::residency when planned.
      int num_drafts = 0;          // Draft tokens it verifies (beyond num_tokens).
    };
    std::vector<Sequence> sequences;
    std::unique_ptr<StepCall> call;
    Clock::time_point planned;  // When its planning began.
    int num_tokens = 0;
    int num_drafts = 0;      // Draft tokens of all its sequences.
    int prefill_tokens = 0;  // Prompt tokens among num_tokens.
    int batch_slots = 0;
    int wasted_slots = 0;

    bool Includes(uint64_t id) const;
  };

  // `executor` must outlive the pipeline. `max_in_flight`: 1 (each step's answer is in
  // before the next is planned; the executor's blocking call) or 2; other values count as
  // the nearer of these.
  StepPipeline(StepExecutor* executor, int max_in_flight);

  int max_in_flight() const { return max_in_flight_; }
  bool empty() const { return steps_.empty(); }
  bool full() const { return static_cast<int>(steps_.size()) >= max_in_flight_; }

  // Sends `request`, the encoding of `plan`, to the workers, and advances the plan's
  // requests as if it had run.
  void Launch(const StepPlan& plan, const worker::v1::StepRequest& request,
              Clock::time_point planned);

  // Takes the oldest step off the pipeline and waits for its answer.
  struct Answer {
    Step step;
    absl::StatusOr<worker::v1::StepResponse> response;
  };
  Answer WaitOldest();

  // After `failed` (the oldest step, taken off) failed, or when the engine stops: tells
  // the workers that no step still in flight is wanted, waits them out, and takes back
  // what they and `failed` had advanced: the computed tokens of each request still
  // resident as planned, and every request's pending tokens (a request recomputed later
  // samples them again, the same ones: randomness depends on seed, sequence, position).
  void Abandon(const Step& failed, RequestTable& requests) { TakeBack(&failed, requests); }
  // The same for every step in flight (the engine stops).
  void AbandonAll(RequestTable& requests) { TakeBack(nullptr, requests); }

 private:
  void TakeBack(const Step* failed, RequestTable& requests);

  StepExecutor* const executor_;
  const int max_in_flight_;
  std::deque<Step> steps_;  // Oldest first.
};

}  // namespace conveyor::scheduler
