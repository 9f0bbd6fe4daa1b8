#include "scheduler/policy.h"

#include <algorithm>

#include "scheduler/continuous_policy.h"
#include "scheduler/run_to_completion_policy.h"

namespace conveyor::scheduler {

int StepPlan::num_tokens() const {
  int total = 0;
  for (const ScheduledSequence& s : sequences) total += s.num_tokens;
  return total;
}

int ScoredTokensFor(int vocab_size) {
  if (vocab_size <= 0) return 1 << 30;
  return static_cast<int>(
      std::clamp<int64_t>(kScoredLogitsBytesPerStep / (int64_t{4} * vocab_size), 1, 1 << 30));
}

int WithinScoringBudget(const Request& r, int n, int* scored_left) {
  // The worker scores position p (its logits give token p + 1) while p + 1 is a prompt
  // token: positions [num_computed, num_prompt_tokens - 1).
  if (r.prompt_logprobs < 0) return n;
  const int unscored = r.num_prompt_tokens - 1 - r.num_computed;
  if (unscored <= 0) return n;
  if (*scored_left <= 0) return 0;
  const int scored = std::min({n, unscored, *scored_left});
  *scored_left -= scored;
  // Past its budget a chunk stops where scoring does, unless it scores all that is left.
  return scored < std::min(n, unscored) ? scored : n;
}

absl::StatusOr<std::unique_ptr<BatchPolicy>> MakePolicy(const PolicyOptions& o) {
  if (o.limits.max_num_seqs < 1 || o.limits.max_step_tokens < 1 || o.limits.max_scored_tokens < 1) {
    return absl::InvalidArgumentError(
        "max_num_seqs, max_step_tokens and max_scored_tokens must be >= 1");
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
