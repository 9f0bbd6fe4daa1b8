// Runs a step on the workers: the seam between the scheduler loop and the processes
// that hold the model (WorkerGroup over gRPC; a scripted fake in unit tests).
#pragma once

#include "absl/status/statusor.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

class StepExecutor {
 public:
  virtual ~StepExecutor() = default;
  // Sends `request` to every rank and returns rank 0's response once all ranks answered,
  // or the first error.
  virtual absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& request) = 0;
};

}  // namespace conveyor::scheduler
