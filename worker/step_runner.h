// Executes StepRequests on one rank: validates the step's deltas against the sequences
// this rank holds, applies them, runs one forward pass over the flattened batch and
// samples a token for every sequence that reached the end of its known tokens.
//
// A step that fails validation returns INVALID_ARGUMENT naming the offending field and
// changes nothing, so the worker keeps serving. Validation trusts nothing the step says
// about memory: every block id is within the cache, and a step writes K/V only into
// blocks referenced once, by the writing sequence alone (blocks a new sequence shares as
// a cached prefix are read, never written).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/token_mask.h"
#include "model/device_sampler.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "model/sampler.h"
#include "worker.pb.h"

namespace conveyor::worker {

// Receives the logits a step samples from on the host (StepRunner::set_logits_tap).
class LogitsTap {
 public:
  virtual ~LogitsTap() = default;
  // `logits` (vocab_size entries) produced `seq_id`'s token in step `step_id`.
  virtual void OnLogits(uint64_t step_id, uint64_t seq_id, std::span<const float> logits) = 0;
};

class StepRunner {
 public:
  struct Options {
    int max_step_tokens = 8192;
    int max_num_seqs = 256;
    int tp_rank = 0;  // Only rank 0 reports sampled tokens.
    int max_logprobs = 20;
  };

  // `model` and `cache` must outlive the runner.
  StepRunner(model::LlamaModel* model, model::KvCache* cache, const Options& options);

  // Runs one step. On error nothing changed. A step that names a previous_step_id runs
  // only right after that step ran (ABORTED otherwise), and one whose id is below the
  // last step's arrived too late (ABORTED): the scheduler may have two steps in flight.
  absl::Status Step(const v1::StepRequest& request, v1::StepResponse* response);

  // Samples where the logits are from now on (steps of more rows than it takes copy
  // their logits to the host and sample there).
  void set_device_sampler(std::unique_ptr<model::DeviceSampler> sampler) {
    device_sampler_ = std::move(sampler);
  }

  // The bytes of each token, which constrained sequences (NewSequence.grammar) are matched
  // with; without it such sequences are refused. Set once, before the first step.
  void set_vocabulary(std::unique_ptr<grammar::Vocabulary> vocabulary) {
    vocabulary_ = std::move(vocabulary);
  }

  // Speculative decoding: the draft model that answers num_tokens_to_propose, and its KV
  // cache (as many blocks as the model's, indexed by the same block ids). Both must
  // outlive the runner. Without one, steps asking for proposals are refused.
  void set_draft(model::LlamaModel* draft, model::KvCache* draft_cache) {
    draft_ = draft;
    draft_cache_ = draft_cache;
  }

  // Forgets every sequence and step (a restarted scheduler starts from a clean slate).
  void Reset() {
    ClearSequences();
    last_step_id_ = 0;
    last_step_ok_ = false;
  }

  // The highest step id handled since the runner was made or Reset (0: none), whether the
  // step that brought it ran or was refused. A step built on it may run once it is here.
  uint64_t last_step_id() const { return last_step_id_; }

  // Whether a step failed on the device (INTERNAL, naming the operation) or lost a
  // tensor-parallel peer (UNAVAILABLE). Either is sticky (a faulted backend, a broken
  // communicator), so every later step would fail too: the model must be rebuilt.
  bool device_failed() const { return device_failed_; }

  // Sees the logits of every row sampled on the host, before any sampling transform
  // (tests compare them across batch shapes and tensor-parallel layouts). Null: none.
  // `tap` must outlive the runner.
  void set_logits_tap(LogitsTap* tap) { logits_tap_ = tap; }

  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  uint64_t steps_executed() const { return steps_executed_; }
  const Options& options() const { return options_; }

 private:
  struct Sequence {
    std::vector<int32_t> tokens;  // Prompt, then generated tokens.
    int num_prompt_tokens = 0;
    int num_computed = 0;  // Tokens whose K/V are in the cache.
    // During a step: draft tokens appended to `tokens` for verification (computed with
    // the last token, then kept or cut back once sampled).
    int num_drafts = 0;
    // The draft model's K/V (set_draft): valid for the first num_draft_computed tokens,
    // and written for draft_tail (its last proposals but the final one) at the positions
    // after them, valid as far as the tokens kept there equal it.
    int num_draft_computed = 0;
    std::vector<int32_t> draft_tail;
    // Proposals asked for in the step that runs (num_tokens_to_propose).
    int num_to_propose = 0;
    // NewSequence.prompt_logprobs (-1: the prompt is not scored).
    int prompt_logprobs = -1;
    std::vector<int32_t> block_table;
    model::SamplingParams sampling;
    // Structured output: where the output stands in its grammar, and the grammar's
    // contexts computed so far (shared by its sequences). Null: unconstrained.
    std::unique_ptr<grammar::Matcher> matcher;
    std::shared_ptr<grammar::MaskCache> masks;
  };
  // One sequence scheduled in the step being validated.
  struct Scheduled {
    uint64_t seq_id = 0;
    const v1::NewSequence* new_seq = nullptr;  // Null for running sequences.
    const v1::RunningSequence* running = nullptr;
    int num_tokens = 0;  // Draft tokens included.
    // A new constrained sequence's matcher, its output so far accepted, and its masks.
    std::unique_ptr<grammar::Matcher> matcher;
    std::shared_ptr<grammar::MaskCache> masks;
  };

  absl::Status Validate(const v1::StepRequest& request, std::vector<Scheduled>* scheduled);
  // num_tokens_to_propose's range, and a draft model to answer it.
  absl::Status CheckProposals(uint64_t seq_id, int32_t num_tokens_to_propose) const;
  // Forgets the scheduled sequences after the step failed on the device, and says why.
  absl::Status FailStep(uint64_t step_id, const std::vector<Scheduled>& scheduled,
                        const absl::Status& failure);
  // The matcher of a new sequence's grammar with its generated tokens accepted (into
  // `scheduled`).
  absl::Status MatcherFor(const v1::NewSequence& seq, Scheduled* scheduled);
  // The tokens `seq`'s grammar allows next, into mask_ (never none: where no token fits,
  // EOS ends the output).
  void ComputeMask(Sequence& seq);
  absl::Status ValidateBlocks(const google::protobuf::RepeatedField<int32_t>& blocks,
                              const char* field, uint64_t seq_id) const;
  // Checks that the blocks each scheduled sequence writes this step belong to it alone,
  // once the step's drops and new blocks are applied.
  absl::Status ValidateWrites(const v1::StepRequest& request,
                              const std::vector<Scheduled>& scheduled) const;
  // The only ways sequences_ changes, so block_refs_ stays in step with it.
  void AddSequence(uint64_t seq_id, Sequence seq);
  void AddBlocks(Sequence& seq, std::span<const int32_t> blocks);
  void EraseSequence(uint64_t seq_id);
  void ClearSequences();
  void BuildBatch(const std::vector<Scheduled>& scheduled);
  // Samples `seq`'s next token from `row` as a step without drafts would (grammar, logits
  // tap, draw index), appends it and reports it (rank 0).
  int32_t SampleInto(uint64_t step_id, uint64_t seq_id, Sequence& seq, std::vector<float>& row,
                     v1::StepResponse* response);
  // The draft model's proposals for every sequence of sampling_seqs_ that asked for them,
  // into `response` (rank 0).
  absl::Status Propose(v1::StepResponse* response);
  // Runs draft_batch_ through the draft model, into draft_logits_.
  absl::Status DraftForward();
  // Step without the ordering bookkeeping.
  absl::Status RunStep(const v1::StepRequest& request, v1::StepResponse* response);
  // ABORTED unless `request` may run now: after its previous_step_id, which ran; not
  // behind a later step.
  absl::Status CheckOrder(const v1::StepRequest& request) const;

  model::LlamaModel* model_;
  model::KvCache* cache_;
  model::LlamaModel* draft_ = nullptr;  // Null: no proposals.
  model::KvCache* draft_cache_ = nullptr;
  Options options_;
  model::Sampler sampler_;
  std::unique_ptr<model::DeviceSampler> device_sampler_;  // Null: sample on the host.
  std::unordered_map<uint64_t, Sequence> sequences_;
  std::vector<int32_t> block_refs_;  // [num_blocks]: live sequences whose table holds it.
  uint64_t steps_executed_ = 0;
  uint64_t last_step_id_ = 0;
  bool last_step_ok_ = false;  // Whether step last_step_id_ ran.
  bool device_failed_ = false;
  LogitsTap* logits_tap_ = nullptr;
  std::unique_ptr<grammar::Vocabulary> vocabulary_;  // Null: no constrained sequences.
  // Compiled grammars and their masks by the grammar's text: requests with one schema
  // share them. Bounded by kMaxCachedGrammars; emptied when full (sequences keep theirs).
  absl::flat_hash_map<std::string, std::shared_ptr<grammar::MaskCache>> grammars_;

  // Per-step scratch.
  model::ForwardBatch batch_;
  // Sequences that sample, in logit-row order: 1 + num_drafts rows each.
  std::vector<uint64_t> sampling_seqs_;
  // Prompt positions scored (NewSequence.prompt_logprobs), after the sampling rows in
  // logit-row order: the sequence and the position whose successor is scored.
  std::vector<std::pair<uint64_t, int>> scored_positions_;
  std::vector<float> logits_;  // [rows, vocab] when sampled on the host.
  std::vector<model::RowToSample> rows_to_sample_;
  std::vector<model::SampleResult> sampled_;
  grammar::Bitmask mask_;
  model::ForwardBatch draft_batch_;
  std::vector<float> draft_logits_;
};

}  // namespace conveyor::worker
