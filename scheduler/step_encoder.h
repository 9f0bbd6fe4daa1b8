// Turns the batching policy's StepPlans into the delta-encoded StepRequests the workers
// run (DESIGN.md, "The step protocol"), and remembers what every worker rank already
// holds of each sequence, so that a step carries only changes: whole new sequences,
// then for running ones the tokens to compute and the blocks appended since.
//
// All ranks get the same step and hold the same sequences, so one ledger serves them
// all. Its only inputs are the plans, what happened to each step (Committed or
// ResetAll) and the sequences that leave (Drop); it never looks at a worker. Not
// thread-safe: the scheduler loop owns it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "scheduler/policy.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

class StepEncoder {
 public:
  StepEncoder() = default;
  StepEncoder(const StepEncoder&) = delete;
  StepEncoder& operator=(const StepEncoder&) = delete;

  // Returns the step for `plan`, with the next step id. It starts with reset=true after
  // ResetAll, else with the sequences dropped since the last step. A scheduled sequence
  // the workers do not hold goes out as a NewSequence: all of its tokens (the prompt,
  // then after a preemption or a reset the tokens generated so far, counted in
  // num_output_tokens), num_computed as its cached tokens, all of its blocks and its
  // sampling parameters. One they hold goes out as a RunningSequence: its token count
  // and the blocks appended since its last committed step.
  //
  // Hands out the queued drops and reset: the step returned must be sent, and followed
  // by Committed. Every step but a reset one names the step before it as its
  // previous_step_id: it was built on that step's effects, so the workers run it only
  // after that one ran.
  worker::v1::StepRequest Encode(const StepPlan& plan);

  // The step Encode(plan) returned is sent: once it runs the workers hold every sequence
  // it scheduled, with all of its current blocks, and later steps are encoded on that
  // assumption (it may still be running). If it fails, ResetAll. Call it before any of
  // those sequences is dropped.
  void Committed(const StepPlan& plan);

  // Sequence `seq_id` leaves the workers' batch (finished, cancelled, failed or
  // preempted): the next step tells them to forget it, if they hold it. If it is
  // scheduled again it goes out as a NewSequence.
  void Drop(uint64_t seq_id);

  // What the workers hold is unknown (a step failed) or gone (they restarted): the next
  // step carries reset=true, so the workers forget every sequence, and from now on no
  // sequence counts as held. Each goes out again as a NewSequence with its prompt and
  // generated tokens when next scheduled; the caller makes its num_computed and blocks
  // match what the workers' KV memory still holds (RequestPool::Preempt: nothing).
  void ResetAll();

  // Whether the workers hold `seq_id` (once the committed steps have run).
  bool OnWorkers(uint64_t seq_id) const { return num_blocks_on_workers_.contains(seq_id); }
  size_t num_sequences_on_workers() const { return num_blocks_on_workers_.size(); }

 private:
  uint64_t next_step_id_ = 1;
  // Per sequence the workers hold: how many leading entries of its block table they know.
  absl::flat_hash_map<uint64_t, int> num_blocks_on_workers_;
  // Sequences they hold that the next step tells them to forget, in the order dropped.
  std::vector<uint64_t> pending_drops_;
  // The next step starts the workers from a clean slate.
  bool reset_pending_ = false;
};

}  // namespace conveyor::scheduler
