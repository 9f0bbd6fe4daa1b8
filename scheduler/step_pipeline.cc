#include "scheduler/step_pipeline.h"

#include <algorithm>
#include <utility>

namespace conveyor::scheduler {

bool StepPipeline::Step::Includes(uint64_t id) const {
  return std::any_of(sequences.begin(), sequences.end(),
                     [&](const Sequence& s) { return s.id == id; });
}

StepPipeline::StepPipeline(StepExecutor* executor, int max_in_flight)
    : executor_(executor), max_in_flight_(std::clamp(max_in_flight, 1, 2)) {}

void StepPipeline::Launch(const StepPlan& plan, const worker::v1::StepRequest& request,
                          Clock::time_point planned) {
  Step step;
  step.planned = planned;
  step.num_tokens = plan.num_tokens();
  step.batch_slots = plan.batch_slots;
  step.wasted_slots = plan.wasted_slots;
  step.sequences.reserve(plan.sequences.size());
  for (const ScheduledSequence& s : plan.sequences) {
    Request* r = s.request;
    step.prefill_tokens +=
        std::max(0, std::min(r->num_computed + s.num_tokens, r->num_prompt_tokens) -
                        std::min(r->num_computed, r->num_prompt_tokens));
    r->num_computed += s.num_tokens;
    // It samples once its known tokens are computed (as the worker decides); the token
    // is known when the answer comes.
    if (r->num_computed == r->num_tokens()) {
      r->tokens.push_back(kPendingToken);
      ++r->num_pending_tokens;
    }
    r->num_drafts_in_flight = static_cast<int>(s.draft.size());
    step.num_drafts += r->num_drafts_in_flight;
    step.sequences.push_back(
        {r->id, s.num_tokens, r->num_computed, r->residency, r->num_drafts_in_flight});
  }
  // One step at a time, the executor's plain call (for one rank a blocking gRPC call,
  // the cheapest round trip); else the call returns before the answer.
  step.call = max_in_flight_ > 1 ? executor_->StartStep(request)
                                 : std::make_unique<FinishedStepCall>(executor_->Step(request));
  steps_.push_back(std::move(step));
}

StepPipeline::Answer StepPipeline::WaitOldest() {
  Step step = std::move(steps_.front());
  steps_.pop_front();
  absl::StatusOr<worker::v1::StepResponse> response = step.call->Wait();
  return {std::move(step), std::move(response)};
}

void StepPipeline::TakeBack(const Step* failed, RequestTable& requests) {
  for (Step& step : steps_) step.call->Cancel();
  std::vector<const Step*> abandoned;
  if (failed != nullptr) abandoned.push_back(failed);
  for (Step& step : steps_) {
    step.call->Wait().IgnoreError();  // Refused by the workers, or its answer unwanted.
    abandoned.push_back(&step);
  }
  for (const Step* step : abandoned) {
    for (const Step::Sequence& s : step->sequences) {
      auto it = requests.find(s.id);
      if (it != requests.end() && it->second->residency == s.residency) {
        it->second->num_computed -= s.num_tokens;
      }
    }
  }
  steps_.clear();
  for (auto& [id, r] : requests) {
    r->tokens.resize(r->num_known_tokens());
    r->num_pending_tokens = 0;
    r->num_drafts_in_flight = 0;
  }
}

}  // namespace conveyor::scheduler
