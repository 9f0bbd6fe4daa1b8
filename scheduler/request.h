// One generation request as the scheduler sees it: what the client asked for, the
// tokens so far, where its KV lives, and its timings. Owned and touched only by the
// scheduler loop's thread.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "conveyor.pb.h"
#include "scheduler/block_manager.h"
#include "scheduler/detokenizer.h"
#include "scheduler/front_end.h"
#include "scheduler/stop_matcher.h"
#include "scheduler/suffix_proposer.h"
#include "worker.pb.h"

namespace conveyor::scheduler {

using Clock = std::chrono::steady_clock;

// Where a request's stream goes (the gRPC layer; tests record). Called on the engine's
// delivery thread (ResponseDispatcher), in order, Finish last; implementations must not
// block.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void Send(v1::GenerateResponse message) = 0;
  // The last call: OK after the final message, or the error that ended the request.
  virtual void Finish(const absl::Status& status) = 0;
};

// The prompt's KV blocks that the n choices of one request share (n > 1). The first
// choice (the leader) computes the prompt; the others wait, out of the queue, until it has
// computed the prompt's full blocks, take references on them (`table`) and compute only
// the rest: the prompt's last partial block is recomputed by each choice, not copied
// (docs/http-api.md, "n choices"). Owned by the choices; `table` is released on a worker
// failure, after which the choices start over like any request.
struct SharedPrompt {
  uint64_t leader_id = 0;
  int num_tokens = 0;  // The prompt's full blocks, leaving at least one token to compute.
  BlockTable table;    // Empty until the leader has computed them.
};

struct Request {
  // Assigned by the engine; also the sequence id on the workers.
  uint64_t id = 0;
  std::string request_id;  // The client's (or a generated) name, echoed back.

  // The prompt followed by the generated tokens. The last num_pending_tokens entries are
  // kPendingToken: tokens that steps still in flight sample, known once their answers
  // arrive (the scheduler plans the next step before the last one's answer is in).
  std::vector<int32_t> tokens;
  int num_prompt_tokens = 0;
  int num_pending_tokens = 0;

  worker::v1::SamplingParams sampling;
  // Structured output: the grammar (grammar/grammar.h) the output must follow, compiled
  // from the request's schema or regex; the workers apply it (NewSequence.grammar). Null:
  // unconstrained.
  std::shared_ptr<const std::string> grammar;
  int max_new_tokens = 0;
  // Token ids that end generation with reason EOS / STOP.
  std::vector<int32_t> eos_token_ids;
  std::vector<int32_t> stop_token_ids;
  int num_logprobs = 0;
  // Prompt scoring (GenerateRequest.prompt_logprobs; -1: off): the alternatives per
  // token, and the prompt tokens scored so far, sent with the first generated token.
  int prompt_logprobs = -1;
  std::vector<v1::TokenLogprobs> scored_prompt;
  int priority = 0;
  // Which of the request's n choices this is (GenerateResponse.index), and what it shares
  // with the others (null when n = 1).
  int choice_index = 0;
  std::shared_ptr<SharedPrompt> shared_prompt;
  FrontEnd front_end = FrontEnd::kGrpc;  // Where it came in (the metrics' `api` label).

  Clock::time_point arrival;
  Clock::time_point deadline = Clock::time_point::max();
  Clock::time_point first_scheduled;
  Clock::time_point first_token;
  Clock::time_point last_token;

  std::shared_ptr<ResponseSink> sink;
  std::unique_ptr<IncrementalDetokenizer> detokenizer;
  std::unique_ptr<StopMatcher> stop_matcher;

  // Scheduling state.
  BlockTable blocks;
  // Tokens whose K/V the workers hold once the steps in flight have run.
  int num_computed = 0;
  // Speculative decoding: draft tokens the step in flight verifies (answers beyond the
  // first token are kept drafts, at most this many), and how many to propose next time
  // (it follows the acceptance: up after a draft was kept whole, down after a miss).
  int num_drafts_in_flight = 0;
  int draft_length = 0;
  // --speculative_method=draft: the draft model's last proposal, made when the request
  // held proposal_at tokens (its next step's drafts only while it still holds that many).
  std::vector<int32_t> proposal;
  int proposal_at = -1;
  // --speculative_method=suffix: the index of its tokens, made at its first proposal.
  std::unique_ptr<SuffixIndex> suffix_index;
  // Counts the times the request lost its blocks (preempted, or kept through a worker
  // failure), so that the answer to a step planned before can tell.
  uint32_t residency = 0;
  bool scheduled_once = false;
  int num_cached_prompt_tokens = 0;
  int preemptions = 0;
  // Worker failures this request lived through (each one recomputes it); past a limit
  // the request fails rather than take the workers down again.
  int worker_failures = 0;
  // The client's answer is complete (finished, cancelled or failed). A run-to-completion
  // policy may keep such a request in its batch as padding until the batch ends.
  bool done = false;

  // Tokens, pending ones included: what the workers will hold once the steps in flight
  // have run, which is what planning goes by.
  int num_tokens() const { return static_cast<int>(tokens.size()); }
  // Tokens whose ids the scheduler has (the prompt and the tokens answered so far).
  int num_known_tokens() const { return num_tokens() - num_pending_tokens; }
  // Generated tokens the scheduler has (streamed, or judged and not streamed: EOS).
  int num_output_tokens() const { return num_known_tokens() - num_prompt_tokens; }
  // Tokens whose K/V are not computed yet (or scheduled in a step in flight).
  int num_uncomputed() const { return num_tokens() - num_computed; }
  // The token that ends the request by length is sampled in a step still in flight:
  // nothing is left to compute, the request ends when that answer arrives.
  bool last_token_in_flight() const {
    return num_pending_tokens > 0 && num_tokens() - num_prompt_tokens >= max_new_tokens;
  }
};

// The placeholder for a token sampled by a step whose answer has not arrived; never sent
// to a worker (a request with one is not admitted again until it is known).
inline constexpr int32_t kPendingToken = -1;

}  // namespace conveyor::scheduler
