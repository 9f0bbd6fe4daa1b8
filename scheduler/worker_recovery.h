// Bringing the model workers back after they failed: the engine's outage state.
//
// A worker failure (a step lost in transport, timed out or refused by a worker that
// restarted; an idle check that finds one gone) begins an outage: a thread of its own
// asks the executor to reconnect and initialise every rank again, until
// `timeout` has passed. The engine keeps the requests it had meanwhile and polls for the
// answer each time it wakes (the thread wakes it). If the workers are not back in time,
// the engine fails what it kept, new requests are refused at once (exceeded()), and the
// recovery starts over: the server serves again as soon as the workers are back.
//
// Begin, Poll, active and Stop are called on the loop thread; has_result and exceeded
// from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "scheduler/request.h"
#include "scheduler/step_executor.h"

namespace conveyor::scheduler {

class WorkerRecovery {
 public:
  // `executor` must outlive this. `wake` is called (on the recovery thread) once a result
  // is in: the engine's loop then calls Poll.
  WorkerRecovery(StepExecutor* executor, std::chrono::milliseconds timeout,
                 std::function<void()> wake);
  ~WorkerRecovery();
  WorkerRecovery(const WorkerRecovery&) = delete;
  WorkerRecovery& operator=(const WorkerRecovery&) = delete;

  // Begins an outage caused by `cause`, unless one is under way; true if it began one.
  bool Begin(const absl::Status& cause);
  // An outage is under way (from Begin until a Poll finds the workers back).
  bool active() const { return active_; }

  // What a Poll found.
  struct Outcome {
    double outage_s = 0;  // Since the outage began.
    // Back: what the workers offer now (their KV caches are empty).
    std::optional<RecoveredWorkers> recovered;
    // Not back within the timeout: the status for every request kept through the outage
    // (UNAVAILABLE, saying why). The recovery has started over.
    absl::Status failure;
  };
  // The recovery's result, if it is in. Workers whose KV blocks hold other than
  // `block_size` tokens count as not back (the scheduler's blocks could not address them).
  std::optional<Outcome> Poll(int block_size);

  // A result is waiting for Poll (for the loop's wait predicate).
  bool has_result() const;
  // The current outage outlasted the timeout: new requests are refused at once.
  bool exceeded() const { return exceeded_.load(); }
  // The failure that began the current outage.
  const absl::Status& cause() const { return cause_; }

  // Makes a running recovery return promptly, waits for its thread and forgets the
  // outage (the server stops).
  void Stop();

 private:
  void StartThread();

  StepExecutor* const executor_;
  const std::chrono::milliseconds timeout_;
  const std::function<void()> wake_;

  // Loop-thread state.
  bool active_ = false;
  Clock::time_point started_;
  absl::Status cause_;
  std::thread thread_;

  std::atomic<bool> exceeded_{false};
  mutable std::mutex mu_;
  std::optional<absl::StatusOr<RecoveredWorkers>> result_;  // The thread's answer.
};

}  // namespace conveyor::scheduler
