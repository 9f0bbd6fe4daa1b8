#include "scheduler/continuous_policy.h"

#include <algorithm>

namespace conveyor::scheduler {

StepPlan ContinuousPolicy::Plan(RequestPool& pool, Clock::time_point) {
  StepPlan plan;
  BlockManager& blocks = pool.blocks();
  int budget = limits_.max_step_tokens;
  int scored_left = limits_.max_scored_tokens;

  // Running requests, highest priority and oldest first; victims come from the back.
  std::vector<Request*> running = pool.running();
  size_t end = running.size();  // running[end..] were preempted in this step.
  for (size_t i = 0;
       i < end && budget > 0 && static_cast<int>(plan.sequences.size()) < limits_.max_num_seqs;
       ++i) {
    Request* r = running[i];
    if (r->last_token_in_flight()) continue;  // Holds its blocks until the answer comes.
    const int n = WithinScoringBudget(*r, std::min(r->num_uncomputed(), budget), &scored_left);
    if (n == 0) continue;  // Scores its prompt, and this step's scoring budget is spent.
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
           TryAdmit(pool, &budget, &scored_left, &plan)) {
    }
  }
  plan.batch_slots = static_cast<int>(plan.sequences.size());
  return plan;
}

bool ContinuousPolicy::TryAdmit(RequestPool& pool, int* budget, int* scored_left, StepPlan* plan) {
  Request* r = pool.NextToAdmit();
  if (r == nullptr) return false;
  BlockManager& blocks = pool.blocks();
  BlockManager::PrefixMatch match = pool.AcquirePrefix(*r);
  // The scoring budget counts from r's first uncached token: a request that scores its
  // prompt takes no cached tokens (RequestPool::AcquirePrefix), and has computed none.
  int scored = *scored_left;
  const int n = WithinScoringBudget(
      *r, std::min(r->num_tokens() - match.num_cached_tokens, *budget), &scored);
  // Nothing fits (it scores its prompt and the step's scoring budget is spent), or its
  // blocks do not: it waits for a later step.
  if (n == 0 || !blocks.EnsureCapacity(match.table, match.num_cached_tokens + n)) return false;
  *scored_left = scored;
  r->blocks = std::move(match.table);
  r->num_computed = match.num_cached_tokens;
  if (!r->scheduled_once) r->num_cached_prompt_tokens = match.num_cached_tokens;
  pool.AdmitFront();
  plan->sequences.emplace_back(r, n);
  *budget -= n;
  return true;
}

}  // namespace conveyor::scheduler
