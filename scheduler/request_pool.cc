#include "scheduler/request_pool.h"

#include <algorithm>

namespace conveyor::scheduler {

bool RequestPool::RunsBefore(const Request* a, const Request* b) {
  if (a->priority != b->priority) return a->priority > b->priority;
  if (a->arrival != b->arrival) return a->arrival < b->arrival;
  return a->id < b->id;
}

void RequestPool::AddWaiting(Request* r) {
  auto it = std::find_if(waiting_.begin(), waiting_.end(),
                         [&](const Request* w) { return RunsBefore(r, w); });
  waiting_.insert(it, r);
}

Request* RequestPool::NextToAdmit() const {
  if (waiting_.empty() || waiting_.front()->num_pending_tokens > 0) return nullptr;
  return waiting_.front();
}

void RequestPool::AdmitFront() {
  Request* r = waiting_.front();
  waiting_.pop_front();
  running_.insert(std::upper_bound(running_.begin(), running_.end(), r, RunsBefore), r);
}

void RequestPool::Preempt(Request* r) {
  Requeue(r);
  ++r->preemptions;
}

void RequestPool::Requeue(Request* r) {
  running_.erase(std::find(running_.begin(), running_.end(), r));
  r->blocks.Release();
  r->num_computed = 0;
  ++r->residency;
  AddWaiting(r);
}

BlockManager::PrefixMatch RequestPool::AcquirePrefix(const Request& r) {
  // A scored prompt is computed whole: cached tokens have no logits.
  if (r.prompt_logprobs >= 0 && r.num_output_tokens() == 0) return blocks_->AcquirePrefix({});
  BlockManager::PrefixMatch match = blocks_->AcquirePrefix(r.tokens);
  const SharedPrompt* shared = r.shared_prompt.get();
  if (shared != nullptr &&
      shared->table.num_blocks() * blocks_->block_size() > match.num_cached_tokens) {
    match.table = blocks_->Share(shared->table, shared->table.num_blocks());
    match.num_cached_tokens = shared->num_tokens;
  }
  return match;
}

void RequestPool::Remove(Request* r) {
  if (auto it = std::find(running_.begin(), running_.end(), r); it != running_.end()) {
    running_.erase(it);
  } else {
    waiting_.remove(r);
  }
  r->blocks.Release();
}

}  // namespace conveyor::scheduler
