// Runs a step on the workers: the seam between the scheduler loop and the processes
// that hold the model (WorkerGroup over gRPC; a scripted fake in unit tests), and the
// way back after they failed.
#pragma once

#include <chrono>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

// A step sent to the workers whose answer may still be on its way (StartStep).
class StepCall {
 public:
  virtual ~StepCall() = default;
  // Blocks until every rank answered; returns rank 0's response or the first error.
  // Called once.
  virtual absl::StatusOr<worker::v1::StepResponse> Wait() = 0;
  // Tells the ranks the answer is no longer wanted (the step before it failed); Wait
  // still returns, soon.
  virtual void Cancel() {}
};

// A StepCall whose answer is already in (an executor that steps synchronously).
class FinishedStepCall final : public StepCall {
 public:
  explicit FinishedStepCall(absl::StatusOr<worker::v1::StepResponse> result)
      : result_(std::move(result)) {}
  absl::StatusOr<worker::v1::StepResponse> Wait() override { return std::move(result_); }

 private:
  absl::StatusOr<worker::v1::StepResponse> result_;
};

// What the workers offer after a recovery (their KV cache is empty again).
struct RecoveredWorkers {
  int num_kv_blocks = 0;
  int block_size = 0;
};

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Sends `request` to every rank and returns rank 0's response once all ranks answered,
  // or the first error.
  virtual absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& request) = 0;

  // Sends `request` to every rank and returns without waiting for the answer, so that
  // the scheduler can plan and send the next step while this one runs; the workers run
  // steps in the order their previous_step_id chains them. The default steps at once.
  virtual std::unique_ptr<StepCall> StartStep(const worker::v1::StepRequest& request) {
    return std::make_unique<FinishedStepCall>(Step(request));
  }

  // Reconnects to every rank and initialises them all again (a new tensor-parallel
  // group), trying until `deadline`. Executors that cannot recover say UNIMPLEMENTED,
  // and the engine then fails what a failure touched instead of resuming it.
  virtual absl::StatusOr<RecoveredWorkers> Recover(std::chrono::system_clock::time_point) {
    return absl::UnimplementedError("this step executor cannot recover its workers");
  }
  virtual bool can_recover() const { return false; }
  // Makes a running Recover return promptly (the server is stopping).
  virtual void CancelRecovery() {}

  // OK if every rank answers within `timeout` and still holds the model; called while
  // the engine is idle, so that a worker that died or restarted is noticed before the
  // next request needs it.
  virtual absl::Status CheckAlive(std::chrono::milliseconds) { return absl::OkStatus(); }
};

}  // namespace conveyor::scheduler
