#include "scheduler/step_encoder.h"

#include <cassert>

namespace conveyor::scheduler {

worker::v1::StepRequest StepEncoder::Encode(const StepPlan& plan) {
  worker::v1::StepRequest step;
  step.set_step_id(next_step_id_++);
  if (reset_pending_) {
    // A reset forgets everything, so the drops queued since would be redundant, and it
    // depends on no earlier step.
    step.set_reset(true);
    reset_pending_ = false;
  } else {
    step.mutable_dropped_seq_ids()->Add(pending_drops_.begin(), pending_drops_.end());
    step.set_previous_step_id(step.step_id() - 1);
  }
  pending_drops_.clear();
  for (const ScheduledSequence& s : plan.sequences) {
    const Request* r = s.request;
    const std::vector<int32_t>& blocks = r->blocks.blocks();
    const auto held = num_blocks_on_workers_.find(r->id);
    if (held == num_blocks_on_workers_.end()) {
      assert(r->num_pending_tokens == 0);  // RequestPool::NextToAdmit keeps them waiting.
      worker::v1::NewSequence* seq = step.add_new_sequences();
      seq->set_seq_id(r->id);
      seq->mutable_token_ids()->Add(r->tokens.begin(), r->tokens.end());
      seq->set_num_output_tokens(r->num_output_tokens());
      seq->set_num_cached_tokens(r->num_computed);
      seq->set_num_tokens(s.num_tokens);
      seq->mutable_block_ids()->Add(blocks.begin(), blocks.end());
      *seq->mutable_sampling() = r->sampling;
      if (r->grammar != nullptr) seq->set_grammar(*r->grammar);
      // Scored until its first token is out (which carries the scores).
      if (r->prompt_logprobs >= 0 && r->num_output_tokens() == 0 && r->num_computed == 0) {
        seq->set_prompt_logprobs(r->prompt_logprobs);
      }
    } else {
      worker::v1::RunningSequence* seq = step.add_running();
      seq->set_seq_id(r->id);
      seq->set_num_tokens(s.num_tokens);
      seq->mutable_new_block_ids()->Add(blocks.begin() + held->second, blocks.end());
      seq->mutable_draft_token_ids()->Add(s.draft.begin(), s.draft.end());
      seq->set_num_tokens_to_propose(s.num_tokens_to_propose);
    }
  }
  return step;
}

void StepEncoder::Committed(const StepPlan& plan) {
  for (const ScheduledSequence& s : plan.sequences) {
    num_blocks_on_workers_.insert_or_assign(s.request->id, s.request->blocks.num_blocks());
  }
}

void StepEncoder::Drop(uint64_t seq_id) {
  if (num_blocks_on_workers_.erase(seq_id) > 0) pending_drops_.push_back(seq_id);
}

void StepEncoder::ResetAll() {
  num_blocks_on_workers_.clear();
  pending_drops_.clear();
  reset_pending_ = true;
}

}  // namespace conveyor::scheduler
