// Runs a step on the workers: the seam between the scheduler loop and the processes
// that hold the model (WorkerGroup over gRPC; a scripted fake in unit tests), and the
// way back after they failed.
#pragma once

#include <chrono>

#include "absl/status/statusor.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

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
