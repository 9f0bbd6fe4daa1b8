// Static and dynamic batching: a batch forms from waiting requests, then runs until its
// longest member finishes; nobody joins mid-way. A member whose answer is complete keeps
// its slot and keeps computing (discarded tokens), as padding would on an accelerator,
// until the batch ends. The two differ only in when a batch forms:
//   static:  batch_size requests are waiting, or the oldest waited batch_timeout;
//   dynamic: batch_window after the first arrival, or the cap is reached.
// Each member is padded to the batch's longest generation: its KV blocks (prompt + the
// largest max_new_tokens in the batch) are reserved when the batch forms, as a
// static-shape engine allocates [batch, max length], so these policies never preempt.
#pragma once

#include <chrono>
#include <vector>

#include "scheduler/policy.h"

namespace conveyor::scheduler {

class RunToCompletionPolicy : public BatchPolicy {
 public:
  StepPlan Plan(RequestPool& pool, Clock::time_point now) override;
  bool KeepAfterDone(Request* r) override;
  void Forget(Request* r) override;
  std::optional<Clock::time_point> NextWakeup(const RequestPool& pool) const override;

 protected:
  explicit RunToCompletionPolicy(const PolicyLimits& limits) : limits_(limits) {}
  // When a batch may form from the current waiting queue (time_point::min(): now).
  virtual Clock::time_point FormationTime(const RequestPool& pool) const = 0;
  // Most members a batch takes.
  virtual int BatchCap() const = 0;

  const PolicyLimits limits_;

 private:
  void FormBatch(RequestPool& pool);

  std::vector<Request*> batch_;
};

class StaticPolicy final : public RunToCompletionPolicy {
 public:
  StaticPolicy(const PolicyLimits& limits, int batch_size, double timeout_ms)
      : RunToCompletionPolicy(limits), batch_size_(batch_size), timeout_(timeout_ms) {}
  const char* name() const override { return "static"; }

 protected:
  Clock::time_point FormationTime(const RequestPool& pool) const override;
  int BatchCap() const override;

 private:
  int batch_size_;
  std::chrono::duration<double, std::milli> timeout_;
};

class DynamicPolicy final : public RunToCompletionPolicy {
 public:
  DynamicPolicy(const PolicyLimits& limits, double window_ms)
      : RunToCompletionPolicy(limits), window_(window_ms) {}
  const char* name() const override { return "dynamic"; }

 protected:
  Clock::time_point FormationTime(const RequestPool& pool) const override;
  int BatchCap() const override { return limits_.max_num_seqs; }

 private:
  std::chrono::duration<double, std::milli> window_;
};

}  // namespace conveyor::scheduler
