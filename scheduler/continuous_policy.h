// Continuous (iteration-level) batching: every step, running requests first (decodes
// and unfinished prefill chunks), then waiting requests' prefill chunks, all under a
// token budget and a sequence cap. When KV blocks run out, the lowest-priority, newest
// running request is preempted (its blocks freed; it is recomputed later).
#pragma once

#include "scheduler/policy.h"

namespace conveyor::scheduler {

class ContinuousPolicy final : public BatchPolicy {
 public:
  explicit ContinuousPolicy(const PolicyLimits& limits) : limits_(limits) {}
  const char* name() const override { return "continuous"; }
  StepPlan Plan(RequestPool& pool, Clock::time_point now) override;

 private:
  // Schedules the head of the waiting queue if the budget and blocks allow it.
  bool TryAdmit(RequestPool& pool, int* budget, int* scored_left, StepPlan* plan);

  PolicyLimits limits_;
};

}  // namespace conveyor::scheduler
