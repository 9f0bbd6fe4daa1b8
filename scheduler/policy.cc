#include "scheduler/policy.h"

#include "scheduler/continuous_policy.h"
#include "scheduler/run_to_completion_policy.h"

namespace conveyor::scheduler {

int StepPlan::num_tokens() const {
  int total = 0;
  for (const ScheduledSequence& s : sequences) total += s.num_tokens;
  return total;
}

absl::StatusOr<std::unique_ptr<BatchPolicy>> MakePolicy(const PolicyOptions& o) {
  if (o.limits.max_num_seqs < 1 || o.limits.max_step_tokens < 1) {
    return absl::InvalidArgumentError("max_num_seqs and max_step_tokens must be >= 1");
  }
  if (o.name == "continuous") return std::make_unique<ContinuousPolicy>(o.limits);
  if (o.name == "static") {
    if (o.batch_size < 1 || o.batch_timeout_ms < 0) {
      return absl::InvalidArgumentError("batch_size must be >= 1 and batch_timeout_ms >= 0");
    }
    return std::make_unique<StaticPolicy>(o.limits, o.batch_size, o.batch_timeout_ms);
  }
  if (o.name == "dynamic") {
    if (o.batch_window_ms < 0) return absl::InvalidArgumentError("batch_window_ms must be >= 0");
    return std::make_unique<DynamicPolicy>(o.limits, o.batch_window_ms);
  }
  return absl::InvalidArgumentError("policy must be one of continuous, static, dynamic; got \"" +
                                    o.name + "\"");
}

}  // namespace conveyor::scheduler
