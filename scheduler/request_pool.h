// The requests the scheduler holds: those waiting for admission, ordered by priority
// (higher first) then arrival, and those running (holding KV blocks), in the same order.
// Admission, preemption and removal keep the block accounting right; policies decide
// when to call them.
#pragma once

#include <cstddef>
#include <list>
#include <vector>

#include "scheduler/block_manager.h"
#include "scheduler/request.h"

namespace conveyor::scheduler {

class RequestPool {
 public:
  explicit RequestPool(BlockManager* blocks) : blocks_(blocks) {}

  // Queues `r` in priority order (ties: after every request that arrived earlier).
  void AddWaiting(Request* r);
  // The head of the waiting queue if it can be admitted now, else null: a request
  // preempted while a step that samples for it was in flight waits until that token is
  // known, as a worker must never be sent a kPendingToken. (With at most two steps in
  // flight the engine applies that answer before it plans again; this keeps the
  // invariant whatever the loop does.)
  Request* NextToAdmit() const;
  // The KV blocks `r` can start from: its choices' shared prompt blocks (SharedPrompt), or
  // the prefix cache's longest match, whichever holds more.
  BlockManager::PrefixMatch AcquirePrefix(const Request& r);
  // Moves the head of the waiting queue to running. Its blocks must already be set.
  void AdmitFront();
  // Frees r's blocks and puts it back at the front of its priority among the waiting:
  // it will be recomputed (its prompt and output so far) when admitted again.
  void Preempt(Request* r);
  // As Preempt, without counting a preemption: after a worker failure, every running
  // request goes back this way to be recomputed on the re-initialised workers.
  void Requeue(Request* r);
  // Forgets `r` (waiting or running) and frees its blocks.
  void Remove(Request* r);

  const std::list<Request*>& waiting() const { return waiting_; }
  const std::vector<Request*>& running() const { return running_; }
  size_t size() const { return waiting_.size() + running_.size(); }
  BlockManager& blocks() { return *blocks_; }

 private:
  // Whether `a` goes before `b` in either queue.
  static bool RunsBefore(const Request* a, const Request* b);

  BlockManager* blocks_;
  std::list<Request*> waiting_;
  std::vector<Request*> running_;  // Sorted with RunsBefore.
};

}  // namespace conveyor::scheduler
