// Batching policies: each iteration, a policy decides which requests run and how many
// tokens each computes (a StepPlan), admitting, preempting or holding requests in the
// pool. One class per policy, chosen once from the configuration.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/request_pool.h"

namespace conveyor::scheduler {

struct ScheduledSequence {
  ScheduledSequence() = default;
  ScheduledSequence(Request* request, int num_tokens) : request(request), num_tokens(num_tokens) {}

  Request* request = nullptr;
  int num_tokens = 0;  // Tokens to compute this step (a prefill chunk, or 1 to decode).
  // Speculative decoding (a decode only): tokens proposed to follow the last one, which
  // the workers compute in the same pass and keep where they match what is sampled.
  std::vector<int32_t> draft;
  // --speculative_method=draft: proposals the workers' draft model makes for the next
  // step once this one has sampled (RunningSequence.num_tokens_to_propose).
  int num_tokens_to_propose = 0;
};

struct StepPlan {
  std::vector<ScheduledSequence> sequences;
  // Requests preempted while planning (the engine tells the workers to drop them).
  std::vector<Request*> preempted;
  // Done requests the policy no longer keeps (a finished batch's padding): the engine
  // retires them.
  std::vector<Request*> released;
  // Batch slots this step occupies and, of those, slots held by requests whose answer
  // is already complete (run-to-completion padding: the bubble).
  int batch_slots = 0;
  int wasted_slots = 0;

  bool empty() const { return sequences.empty(); }
  int num_tokens() const;
};

struct PolicyLimits {
  int max_num_seqs = 64;             // Sequences in one step.
  int max_step_tokens = 2048;        // Tokens in one step (the budget).
  int max_context_tokens = 1 << 30;  // The model's context: no sequence grows past it.
  // Prompt positions scored in one step (requests with prompt_logprobs): each keeps a
  // vocabulary-wide row of logits on the worker until it is scored. ScoredTokensFor
  // sizes it from the vocabulary.
  int max_scored_tokens = 1 << 30;
};

// The bytes of logits one step may keep for scored prompt positions (4 per vocabulary
// entry each), and the positions that makes for a vocabulary of `vocab_size` (at least 1).
inline constexpr int64_t kScoredLogitsBytesPerStep = int64_t{256} << 20;
int ScoredTokensFor(int vocab_size);

// Of the `n` tokens `r` would compute next, those it may compute within what is left of
// the step's scoring budget (`*scored_left`, reduced by the prompt positions it scores):
// `n` for a request that scores none of them, else fewer, 0 when nothing is left.
int WithinScoringBudget(const Request& r, int n, int* scored_left);

class BatchPolicy {
 public:
  virtual ~BatchPolicy() = default;
  virtual const char* name() const = 0;

  // Plans the next step. May admit waiting requests and preempt running ones.
  virtual StepPlan Plan(RequestPool& pool, Clock::time_point now) = 0;

  // Called when a request's answer is complete. Returns true if the policy keeps it in
  // the running batch (as padding, until the batch ends), false if it can go.
  virtual bool KeepAfterDone(Request* r) { return false; }

  // The engine retires `r` (failed, or released by the policy): forget any reference.
  virtual void Forget(Request* r) {}

  // When the policy wants to plan again even if nothing arrives (e.g. a batch timeout);
  // nullopt if only an arrival can change its mind.
  virtual std::optional<Clock::time_point> NextWakeup(const RequestPool& pool) const {
    return std::nullopt;
  }
};

struct PolicyOptions {
  std::string name = "continuous";  // continuous, static or dynamic.
  PolicyLimits limits;
  int batch_size = 8;             // static: requests per batch.
  double batch_timeout_ms = 100;  // static: longest wait for a full batch.
  double batch_window_ms = 10;    // dynamic: collection window after the first arrival.
};

absl::StatusOr<std::unique_ptr<BatchPolicy>> MakePolicy(const PolicyOptions& options);

}  // namespace conveyor::scheduler
