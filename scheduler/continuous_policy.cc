#include "scheduler/continuous_policy.h"

#include <algorithm>

namespace conveyor::scheduler {

StepPlan ContinuousPolicy::Plan(RequestPool& pool, Clock::time_point) {
  StepPlan plan;
  BlockManager& blocks = pool.blocks();
  int budget = limits_.max_step_tokens;

  // Running requests, highest priority and oldest first; victims come from the back.
  std::vector<Request*> running = pool.running();
  size_t end = running.size();  // running[end..] were preempted in this step.
  for (size_t i = 0;
       i < end && budget > 0 && static_cast<int>(plan.sequences.size()) < limits_.max_num_seqs;
       ++i) {
    Request* r = running[i];
    if (r->last_token_in_flight()) continue;  // Holds its blocks until the answer comes.
    const int n = std::min(r->num_uncomputed(), budget);
    bool scheduled = true;
    while (!blocks.EnsureCapacity(r->blocks, r->num_computed + n)) {
      Request* victim = running[end - 1];
      pool.Preempt(victim);
      plan.preempted.push_back(victim);
      --end;
      if (victim == r) {
        scheduled = false;
        break;
      }
    }
    if (!scheduled) break;
    plan.sequences.emplace_back(r, n);
    budget -= n;
  }
  // Admitting while preempting would only thrash.
  if (plan.preempted.empty()) {
    while (budget > 0 && static_cast<int>(pool.running().size()) < limits_.max_num_seqs &&
           TryAdmit(pool, &budget, &plan)) {
    }
  }
  plan.batch_slots = static_cast<int>(plan.sequences.size());
  return plan;
}

bool ContinuousPolicy::TryAdmit(RequestPool& pool, int* budget, StepPlan* plan) {
  Request* r = pool.NextToAdmit();
  if (r == nullptr) return false;
  BlockManager& blocks = pool.blocks();
  BlockManager::PrefixMatch match = pool.AcquirePrefix(*r);
  const int n = std::min(r->num_tokens() - match.num_cached_tokens, *budget);
  if (!blocks.EnsureCapacity(match.table, match.num_cached_tokens + n)) return false;
  r->blocks = std::move(match.table);
  r->num_computed = match.num_cached_tokens;
  if (!r->scheduled_once) r->num_cached_prompt_tokens = match.num_cached_tokens;
  pool.AdmitFront();
  plan->sequences.emplace_back(r, n);
  *budget -= n;
  return true;
}

}  // namespace conveyor::scheduler
