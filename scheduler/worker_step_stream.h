// One worker rank's step stream (Worker.StepStream): steps go out as messages on one
// long-lived bidirectional call and their answers come back in the order sent, which
// saves a call's set-up per step (docs/step-protocol.md has the measurements). The stream
// is opened at the first step, and again at the first step after it ended (the worker
// restarted, a step timed out) once every step sent on the old one was received.
//
// Send and Receive are called from one thread (the engine's loop); ExpireOverdue from a
// watchdog thread, as a blocking read has no deadline of its own.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "grpcpp/client_context.h"
#include "grpcpp/support/sync_stream.h"
#include "worker.grpc.pb.h"

namespace conveyor::scheduler {

class WorkerStepStream {
 public:
  // Every stream carries `scheduler_id` (the worker's binding); a step whose answer has
  // not come within `step_timeout` of its sending ends the stream.
  WorkerStepStream(worker::v1::Worker::Stub* stub, std::string scheduler_id,
                   std::chrono::milliseconds step_timeout);
  ~WorkerStepStream();
  WorkerStepStream(const WorkerStepStream&) = delete;
  WorkerStepStream& operator=(const WorkerStepStream&) = delete;

  // Sends `request`, whose answer Receive returns. Never blocks for the answer; a step
  // that cannot be sent (the stream ended) fails in Receive.
  void Send(const worker::v1::StepRequest& request);
  // Blocks until the answer to step `step_id` (sent and not yet received): the rank's
  // response, or the step's error (the worker's refusal, or why the stream ended).
  // Answers to earlier steps not received yet are read and dropped.
  absl::StatusOr<worker::v1::StepResponse> Receive(uint64_t step_id);
  // Ends the stream if its oldest unanswered step was sent more than the step timeout
  // before `now`: that step and those after it fail with DEADLINE_EXCEEDED.
  void ExpireOverdue(std::chrono::steady_clock::time_point now);

 private:
  using Stream = grpc::ClientReaderWriter<worker::v1::StepRequest, worker::v1::StepStreamResponse>;
  struct Sent {
    uint64_t step_id;
    std::chrono::steady_clock::time_point deadline;
  };

  // Opens a stream (none is open; the step being sent is the only one outstanding).
  void Open();
  // Records why the stream ended, after a Read or Write failed; `cancel` first cancels
  // the call (a failed Write, or an answer that does not fit).
  void End(bool cancel, absl::Status why = absl::OkStatus());
  // Drops the ended stream once no step sent on it is outstanding.
  void ForgetIfDrained();

  worker::v1::Worker::Stub* const stub_;
  const std::string scheduler_id_;
  const std::chrono::milliseconds step_timeout_;
  std::unique_ptr<Stream> stream_;  // Null: none open.
  absl::Status ended_;              // OK while stream_ is open or none is; else why it ended.

  std::mutex mu_;  // Guards what follows (ExpireOverdue reads them from its thread).
  std::unique_ptr<grpc::ClientContext> context_;  // The open stream's.
  std::deque<Sent> sent_;                         // Sent, not received, oldest first.
  bool expired_ = false;                          // ExpireOverdue cancelled the stream.
};

}  // namespace conveyor::scheduler
