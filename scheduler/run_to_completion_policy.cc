#include "scheduler/run_to_completion_policy.h"

#include <algorithm>

namespace conveyor::scheduler {
namespace {

// The earliest arrival among the waiting (they are in priority order, not arrival).
Clock::time_point OldestArrival(const RequestPool& pool) {
  Clock::time_point oldest = Clock::time_point::max();
  for (const Request* r : pool.waiting()) oldest = std::min(oldest, r->arrival);
  return oldest;
}

}  // namespace

void RunToCompletionPolicy::FormBatch(RequestPool& pool) {
  BlockManager& blocks = pool.blocks();
  // Every member is padded to the batch's longest generation, as a static-shape engine
  // pads its [batch, length] tensors: members that finish early keep computing until
  // the longest is done, so their KV reservation covers that too.
  int batch_max_new = 0;
  int candidates = 0;
  for (const Request* r : pool.waiting()) {
    if (candidates++ == BatchCap()) break;
    batch_max_new = std::max(batch_max_new, r->max_new_tokens);
  }
  Request* r = nullptr;
  while (static_cast<int>(batch_.size()) < BatchCap() && (r = pool.NextToAdmit()) != nullptr) {
    BlockManager::PrefixMatch match = pool.AcquirePrefix(*r);
    const int padded = std::min(r->num_prompt_tokens + batch_max_new, limits_.max_context_tokens);
    // A batch's first member always fits unpadded (requests larger than the cache are
    // refused at admission), so a batch can always form.
    const bool fits = blocks.EnsureCapacity(match.table, padded) ||
                      (batch_.empty() && blocks.EnsureCapacity(match.table, r->num_prompt_tokens +
                                                                                r->max_new_tokens));
    if (!fits) break;
    r->blocks = std::move(match.table);
    r->num_computed = match.num_cached_tokens;
    r->num_cached_prompt_tokens = match.num_cached_tokens;
    pool.AdmitFront();
    batch_.push_back(r);
  }
}

StepPlan RunToCompletionPolicy::Plan(RequestPool& pool, Clock::time_point now) {
  StepPlan plan;
  if (!batch_.empty() &&
      std::all_of(batch_.begin(), batch_.end(), [](const Request* r) { return r->done; })) {
    plan.released = std::move(batch_);
    batch_.clear();
  }
  if (batch_.empty()) {
    if (pool.waiting().empty() || FormationTime(pool) > now) return plan;
    FormBatch(pool);
  }
  int budget = limits_.max_step_tokens;
  int scored_left = limits_.max_scored_tokens;
  const int block_size = pool.blocks().block_size();
  for (Request* r : batch_) {
    ++plan.batch_slots;
    if (r->done) ++plan.wasted_slots;
    const int capacity = r->blocks.num_blocks() * block_size;
    const int n = WithinScoringBudget(
        *r, std::min({r->num_uncomputed(), budget, capacity - r->num_computed}), &scored_left);
    // Out of budget (tokens, or scoring), or padding that filled its reservation.
    if (n <= 0) continue;
    plan.sequences.emplace_back(r, n);
    budget -= n;
  }
  return plan;
}

bool RunToCompletionPolicy::KeepAfterDone(Request* r) {
  return std::find(batch_.begin(), batch_.end(), r) != batch_.end();
}

void RunToCompletionPolicy::Forget(Request* r) {
  batch_.erase(std::remove(batch_.begin(), batch_.end(), r), batch_.end());
}

std::optional<Clock::time_point> RunToCompletionPolicy::NextWakeup(const RequestPool& pool) const {
  if (!batch_.empty() || pool.waiting().empty()) return std::nullopt;
  return FormationTime(pool);
}

Clock::time_point StaticPolicy::FormationTime(const RequestPool& pool) const {
  if (static_cast<int>(pool.waiting().size()) >= BatchCap()) return Clock::time_point::min();
  return OldestArrival(pool) + std::chrono::duration_cast<Clock::duration>(timeout_);
}

int StaticPolicy::BatchCap() const { return std::min(batch_size_, limits_.max_num_seqs); }

Clock::time_point DynamicPolicy::FormationTime(const RequestPool& pool) const {
  if (static_cast<int>(pool.waiting().size()) >= BatchCap()) return Clock::time_point::min();
  return OldestArrival(pool) + std::chrono::duration_cast<Clock::duration>(window_);
}

}  // namespace conveyor::scheduler
