#include "scheduler/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/stream_messages.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

Engine::Engine(const Options& options, std::unique_ptr<BatchPolicy> policy, StepExecutor* executor,
               const Tokenizer* tokenizer, SchedulerMetrics* metrics)
    : options_(options),
      policy_(std::move(policy)),
      executor_(executor),
      tokenizer_(tokenizer),
      metrics_(metrics),
      stop_checker_(options.max_context_tokens),
      blocks_(options.num_kv_blocks, options.block_size, options.enable_prefix_caching),
      pool_(&blocks_),
      pipeline_(executor, options.speculative.enabled() ? 1 : options.max_steps_in_flight),
      recovery_(executor, options.worker_recovery_timeout, [this] {
        std::lock_guard<std::mutex> lock(mu_);
        wake_.notify_one();
      }) {
  counters_.kv_blocks_total = options.num_kv_blocks;
  stats_ = counters_;
}

Engine::~Engine() { Stop(absl::UnavailableError("the server is shutting down")); }

void Engine::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<uint64_t> Engine::Submit(std::unique_ptr<Request> request) {
  std::vector<std::unique_ptr<Request>> one;
  one.push_back(std::move(request));
  ASSIGN_OR_RETURN(std::vector<uint64_t> ids, SubmitChoices(std::move(one)));
  return ids.front();
}

absl::StatusOr<std::vector<uint64_t>> Engine::SubmitChoices(
    std::vector<std::unique_ptr<Request>> choices) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || draining_) {
    return absl::UnavailableError("the server is shutting down and accepts no new requests");
  }
  if (recovery_.exceeded()) {
    return absl::UnavailableError(absl::StrCat(
        "the model workers are down and have not come back within ",
        std::chrono::duration_cast<std::chrono::seconds>(options_.worker_recovery_timeout).count(),
        " s; retry later"));
  }
  const int n = static_cast<int>(choices.size());
  if (live_requests_ - stats_.running + n > options_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", options_.max_queue, " requests",
                     n > 1 ? ", each choice one" : "", "); retry later"));
  }
  const Clock::time_point arrival = Clock::now();
  std::shared_ptr<SharedPrompt> shared;
  const int prompt_blocks = (choices.front()->num_prompt_tokens - 1) / options_.block_size;
  if (n > 1 && prompt_blocks > 0 && choices.front()->prompt_logprobs < 0) {
    shared = std::make_shared<SharedPrompt>();
    shared->leader_id = next_request_id_;
    shared->num_tokens = prompt_blocks * options_.block_size;
  }
  std::vector<uint64_t> ids;
  for (int i = 0; i < n; ++i) {
    Request& r = *choices[i];
    r.id = next_request_id_++;
    if (r.request_id.empty()) r.request_id = absl::StrCat("req-", r.id);
    r.arrival = arrival;
    r.choice_index = i;
    r.shared_prompt = shared;
    ids.push_back(r.id);
    inbox_.push_back(std::move(choices[i]));
  }
  live_requests_ += n;
  wake_.notify_one();
  return ids;
}

void Engine::Cancel(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  cancels_.push_back(id);
  wake_.notify_one();
}

void Engine::StartDrain() {
  std::lock_guard<std::mutex> lock(mu_);
  draining_ = true;
}

int Engine::num_live_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return live_requests_;
}

void Engine::Stop(const absl::Status& status) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stopping_) {
      stopping_ = true;
      stop_status_ = status;
    }
    wake_.notify_one();
  }
  if (thread_.joinable() && thread_.get_id() != std::this_thread::get_id()) thread_.join();
}

Engine::Stats Engine::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return stats_;
}

bool Engine::TakeInbox(bool wait, Clock::time_point wake_at) {
  std::vector<std::unique_ptr<Request>> arrivals;
  std::vector<uint64_t> cancels;
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (wait) {
      wake_.wait_until(lock, wake_at, [&] {
        return stopping_ || !inbox_.empty() || !cancels_.empty() || recovery_.has_result();
      });
    }
    if (stopping_) return false;
    arrivals.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (std::unique_ptr<Request>& r : arrivals) {
    Request* raw = r.get();
    requests_[raw->id] = std::move(r);
    if (raw->shared_prompt != nullptr && raw->shared_prompt->leader_id != raw->id) {
      parked_.push_back(raw);
    } else {
      pool_.AddWaiting(raw);
    }
  }
  for (uint64_t id : cancels) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second->done) continue;
    Finish(it->second.get(), absl::CancelledError("the client cancelled the request"),
           FinishReason::kCancelled, nullptr);
  }
  return true;
}

void Engine::ExpireDeadlines(Clock::time_point now) {
  std::vector<Request*> expired;
  for (auto& [id, r] : requests_) {
    if (!r->done && r->deadline <= now) expired.push_back(r.get());
  }
  for (Request* r : expired) {
    Finish(
        r,
        absl::DeadlineExceededError(absl::StrCat(
            "the deadline passed after ", r->num_output_tokens(), " generated tokens",
            recovery_.active() ? " (while the model workers were recovering from a failure)" : "")),
        FinishReason::kDeadline, nullptr);
  }
}

void Engine::ReleaseParked() {
  std::erase_if(parked_, [&](Request* r) {
    SharedPrompt& shared = *r->shared_prompt;
    if (shared.table.num_blocks() == 0) {
      const auto it = requests_.find(shared.leader_id);
      const Request* leader = it == requests_.end() ? nullptr : it->second.get();
      if (leader != nullptr && leader->num_computed < shared.num_tokens) {
        // Waiting or computing: unless it ended, wait for it.
        if (!leader->done) return false;
      } else if (leader != nullptr) {
        // Computed (or in a step in flight, which the workers run before any step that
        // could use them).
        shared.table = blocks_.Share(leader->blocks, shared.num_tokens / options_.block_size);
      }
    }
    pool_.AddWaiting(r);
    return true;
  });
}

void Engine::DropSharedPrompts() {
  for (auto& [id, r] : requests_) {
    if (r->shared_prompt != nullptr) r->shared_prompt->table.Release();
  }
}

Clock::time_point Engine::NextWake() const {
  // Recovering, only the recovery's answer (it wakes the loop) and deadlines matter;
  // idle, also the next liveness check.
  Clock::time_point wake =
      recovery_.active() ? Clock::time_point::max()
                         : std::min(policy_->NextWakeup(pool_).value_or(Clock::time_point::max()),
                                    last_worker_contact_ + options_.idle_check_interval);
  for (const auto& [id, r] : requests_) {
    if (!r->done) wake = std::min(wake, r->deadline);
  }
  return wake;
}

void Engine::Loop() {
  bool idle = false;
  last_worker_contact_ = Clock::now();
  for (;;) {
    dispatcher_.Post();  // What the last iteration streamed goes out while this one runs.
    const bool wait = (idle && pipeline_.empty()) || recovery_.active();
    if (!TakeInbox(wait, wait ? NextWake() : Clock::time_point())) break;
    const Clock::time_point start = Clock::now();
    ExpireDeadlines(start);
    if (recovery_.active()) {
      PollRecovery();
      if (recovery_.active()) {
        PublishStats();
        continue;
      }
    }
    ReleaseParked();
    bool launched = false;
    if (!pipeline_.full()) {
      StepPlan plan = policy_->Plan(pool_, start);
      for (Request* r : plan.released) Retire(r);
      for (Request* r : plan.preempted) {
        encoder_.Drop(r->id);
        ++counters_.preemptions;
      }
      if (metrics_ != nullptr && !plan.preempted.empty()) {
        metrics_->AddPreemptions(static_cast<int>(plan.preempted.size()));
      }
      if (!plan.empty()) {
        AttachDrafts(plan);
        Launch(plan, start);
        launched = true;
      }
    }
    // The oldest step's answer is next once the pipeline is full, or when nothing new
    // could be sent (its answer may free blocks or make a preempted request admissible).
    const bool had_in_flight = !pipeline_.empty();
    if (had_in_flight && (!launched || pipeline_.full())) {
      CompleteOldestStep();
    }
    idle = !launched && !had_in_flight;
    if (idle && start - last_worker_contact_ >= options_.idle_check_interval) {
      last_worker_contact_ = start;
      if (absl::Status alive = executor_->CheckAlive(std::chrono::seconds(1)); !alive.ok()) {
        OnWorkerFailure(alive, nullptr);
      }
    }
    PublishStats();
  }
  pipeline_.AbandonAll(requests_);  // Stopping: what the workers still compute is not wanted.
  recovery_.Stop();
  // Stopping: every live request gets its terminal status.
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = stop_status_;
    for (std::unique_ptr<Request>& r : inbox_) {
      dispatcher_.Finish(std::move(r->sink), status);
      --live_requests_;
    }
    inbox_.clear();
  }
  std::vector<Request*> live;
  for (auto& [id, r] : requests_) live.push_back(r.get());
  for (Request* r : live) {
    if (!r->done) Finish(r, status, FinishReason::kError, nullptr);
  }
  // Stop returns once every request's answer has reached its client's stream.
  dispatcher_.Flush();
}

void Engine::MarkScheduled(const StepPlan& plan) {
  const Clock::time_point now = Clock::now();
  for (const ScheduledSequence& s : plan.sequences) {
    Request* r = s.request;
    if (r->scheduled_once) continue;
    r->scheduled_once = true;
    r->first_scheduled = now;
    if (metrics_ != nullptr) {
      metrics_->ObserveQueueTime(Seconds(now - r->arrival));
      metrics_->AddPromptTokens(r->num_prompt_tokens);
    }
  }
}

void Engine::Launch(const StepPlan& plan, Clock::time_point planned) {
  MarkScheduled(plan);
  const worker::v1::StepRequest step = encoder_.Encode(plan);
  encoder_.Committed(plan);  // Before any of its requests can finish and be dropped.
  dispatcher_.Post();        // Cancellations and deadlines taken this iteration.
  pipeline_.Launch(plan, step, planned);
  // A leader's prompt may be computed now (once this step runs): its choices can share
  // it, even if it ends with this step's answer.
  ReleaseParked();
}

void Engine::AttachDrafts(StepPlan& plan) {
  const Options::Speculative& spec = options_.speculative;
  if (!spec.enabled()) return;
  const auto is_decode = [&](const ScheduledSequence& s) {
    const Request* r = s.request;
    return s.num_tokens == 1 && r->num_uncomputed() == 1 && r->num_pending_tokens == 0 &&
           !r->done && encoder_.OnWorkers(r->id);
  };
  const int decodes =
      static_cast<int>(std::count_if(plan.sequences.begin(), plan.sequences.end(), is_decode));
  if (decodes == 0 || decodes > spec.max_batch) return;
  int budget = spec.max_step_tokens - plan.num_tokens();
  for (ScheduledSequence& s : plan.sequences) {
    if (budget <= 0) break;
    if (!is_decode(s)) continue;
    Request* r = s.request;
    if (r->draft_length == 0) r->draft_length = spec.num_tokens;
    // The last token the request may produce is never a draft, and the drafts stay within
    // the model's context.
    const int k = std::min({r->draft_length, budget, r->max_new_tokens - r->num_output_tokens() - 1,
                            options_.max_context_tokens - r->num_tokens() - 1});
    if (k <= 0) continue;
    std::vector<int32_t> draft;
    if (spec.method == "draft") {
      // What the draft model proposed after the last step, while it still follows the
      // request's tokens; and proposals for the step after this one.
      if (r->proposal_at == r->num_tokens()) {
        draft.assign(r->proposal.begin(),
                     r->proposal.begin() + std::min<size_t>(k, r->proposal.size()));
      }
      r->proposal.clear();
      r->proposal_at = -1;
      s.num_tokens_to_propose = std::min(r->draft_length + 1, spec.num_tokens);
    } else if (spec.method == "suffix") {
      if (r->suffix_index == nullptr) r->suffix_index = std::make_unique<SuffixIndex>();
      r->suffix_index->Extend(r->tokens);  // Every token is known: none is pending.
      draft = r->suffix_index->Propose(r->tokens, spec.ngram.min_n, k);
    } else {
      draft = ProposeNgram(r->tokens, spec.ngram, k);
    }
    if (draft.empty() && s.num_tokens_to_propose == 0) continue;
    // Their KV slots, from free blocks only (a draft never preempts anyone).
    const int need = r->num_computed + 1 + static_cast<int>(draft.size());
    if (!blocks_.EnsureCapacity(r->blocks, need)) {
      const int room = r->blocks.num_blocks() * options_.block_size - r->num_computed - 1;
      draft.resize(std::max(0, std::min(room, static_cast<int>(draft.size()))));
    }
    // The draft model's K/V for its proposals, written after this step's tokens (however
    // many are kept): where there are no free blocks for it, it proposes fewer.
    if (s.num_tokens_to_propose > 0) {
      blocks_.EnsureCapacity(r->blocks, need + s.num_tokens_to_propose);
    }
    budget -= static_cast<int>(draft.size());
    s.draft = std::move(draft);
  }
}

void Engine::AccountDrafts(const StepPipeline::Step& step,
                           const std::unordered_map<uint64_t, int>& answered) {
  for (const StepPipeline::Step::Sequence& s : step.sequences) {
    if (s.num_drafts == 0) continue;
    const auto got = answered.find(s.id);
    const int kept = got == answered.end() ? 0 : std::clamp(got->second - 1, 0, s.num_drafts);
    counters_.draft_tokens += s.num_drafts;
    counters_.accepted_draft_tokens += kept;
    if (metrics_ != nullptr) metrics_->ObserveDrafts(s.num_drafts, kept);
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;
    Request* r = it->second.get();
    r->num_drafts_in_flight = 0;
    // Longer after a draft kept whole, else one past what was kept.
    r->draft_length = kept == s.num_drafts
                          ? std::min(r->draft_length + 1, options_.speculative.num_tokens)
                          : kept + 1;
  }
}

void Engine::CompleteOldestStep() {
  const StepPipeline::Answer answer = pipeline_.WaitOldest();
  const StepPipeline::Step& step = answer.step;
  last_worker_contact_ = Clock::now();
  if (answer.response.ok()) {
    ApplyStep(step, *answer.response);
  } else {
    pipeline_.Abandon(step, requests_);
    if (IsWorkerFailure(answer.response.status())) {
      OnWorkerFailure(answer.response.status(), &step);
    } else {
      FailStep(answer.response.status());
    }
  }
  const Clock::time_point done = Clock::now();
  if (metrics_ != nullptr) {
    // Pipelined, a step's planning overlaps the step before it: its duration counts from
    // that step's end, so that the durations add up to the loop's time.
    metrics_->ObserveStep(Seconds(done - std::max(step.planned, last_step_done_)), step.num_tokens,
                          step.batch_slots, step.wasted_slots);
  }
  last_step_done_ = done;
}

void Engine::ApplyStep(const StepPipeline::Step& step, const worker::v1::StepResponse& response) {
  ++counters_.steps;
  counters_.batch_slot_steps += step.batch_slots;
  counters_.wasted_slot_steps += step.wasted_slots;
  for (const StepPipeline::Step::Sequence& s : step.sequences) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;  // Ended while the step ran.
    Request* r = it->second.get();
    // Preempted since it was planned, its blocks are gone; else its tokens up to this
    // step's are known now, and their full blocks can be cached.
    if (r->residency == s.residency) {
      blocks_.CommitComputed(r->blocks, r->tokens, s.num_computed_after);
    }
  }
  // Before the tokens: the first one carries the scored prompt.
  for (const worker::v1::PromptLogprob& scored : response.prompt_logprobs()) {
    auto it = requests_.find(scored.seq_id());
    if (it != requests_.end() && !it->second->done) {
      AddPromptLogprob(*tokenizer_, *it->second, scored);
    }
  }
  counters_.prefill_tokens += step.prefill_tokens;
  if (metrics_ != nullptr) {
    metrics_->AddPrefillTokens(step.prefill_tokens);
    metrics_->AddPrefixCacheLookups(blocks_.prefix_queries() - prefix_queries_seen_,
                                    blocks_.prefix_hits() - prefix_hits_seen_);
  }
  prefix_queries_seen_ = blocks_.prefix_queries();
  prefix_hits_seen_ = blocks_.prefix_hits();

  const Clock::time_point now = Clock::now();
  int discarded = 0;
  std::unordered_map<uint64_t, int> answered;  // Tokens per request, with drafts.
  for (const worker::v1::SampledToken& token : response.tokens()) {
    if (step.num_drafts > 0) ++answered[token.seq_id()];
    auto it = requests_.find(token.seq_id());
    if (it == requests_.end()) {
      ++discarded;  // It stopped or was cancelled after this step was sent.
      continue;
    }
    Request* r = it->second.get();
    if (r->num_pending_tokens > 0) {
      r->tokens[r->num_known_tokens()] = token.token_id();
      --r->num_pending_tokens;
    } else if (r->num_drafts_in_flight > 0) {
      // A second token or later: the one before it was a draft the workers kept, so its
      // K/V is computed, and this one follows it.
      --r->num_drafts_in_flight;
      ++r->num_computed;
      r->tokens.push_back(token.token_id());
    } else {
      continue;  // Cannot happen: each sampler got one, and drafts are bounded.
    }
    // Padding members of a run-to-completion batch compute, but nobody listens.
    if (!r->done) OnToken(r, token, now);
  }
  if (step.num_drafts > 0) AccountDrafts(step, answered);
  for (const worker::v1::DraftProposal& proposal : response.proposals()) {
    auto it = requests_.find(proposal.seq_id());
    if (it == requests_.end() || it->second->done) continue;
    Request* r = it->second.get();
    r->proposal.assign(proposal.token_ids().begin(), proposal.token_ids().end());
    r->proposal_at = r->num_tokens();
  }
  counters_.discarded_tokens += discarded;
  if (metrics_ != nullptr && discarded > 0) metrics_->AddDiscardedTokens(discarded);
}

void Engine::FailStep(const absl::Status& status) {
  spdlog::error("step failed: {}", status.ToString());
  // What the workers hold is unknown now (a rejected step changed nothing, a crashed
  // worker forgot everything): end every running request, and make the next step start
  // the workers from a clean slate. Waiting requests keep their place.
  const absl::Status client_status =
      absl::Status(status.code() == absl::StatusCode::kInvalidArgument ? absl::StatusCode::kInternal
                                                                       : status.code(),
                   absl::StrCat("the model workers failed: ", status.message()));
  const std::vector<Request*> running = pool_.running();
  for (Request* r : running) {
    if (!r->done) Finish(r, client_status, FinishReason::kError, nullptr);
    if (requests_.contains(r->id)) Retire(r);
  }
  encoder_.ResetAll();
}

bool Engine::IsWorkerFailure(const absl::Status& status) const {
  // INVALID_ARGUMENT: the workers refused a step the scheduler built; retrying it on new
  // workers would fail the same way. Everything else is the workers' failure. Recovering
  // needs an executor that can (test executors cannot).
  return status.code() != absl::StatusCode::kInvalidArgument && executor_->can_recover();
}

void Engine::OnWorkerFailure(const absl::Status& status, const StepPipeline::Step* step) {
  spdlog::error(
      "the model workers failed: {}; keeping {} running and {} waiting request(s) "
      "and recovering",
      status.ToString(), pool_.running().size(), pool_.waiting().size());
  if (metrics_ != nullptr) metrics_->CountWorkerFailure();
  if (!recovery_.active()) SetWorkersReady(false);
  // A device error (INTERNAL) may come from what the step computed: its requests fail
  // rather than risk the fault again. The others are recomputed once the workers are back.
  const bool device_error = status.code() == absl::StatusCode::kInternal;
  auto in_plan = [&](const Request* r) { return step != nullptr && step->Includes(r->id); };
  int resumed = 0;
  int64_t recompute_tokens = 0;
  const std::vector<Request*> running = pool_.running();
  for (Request* r : running) {
    policy_->Forget(r);
    if (r->done) {
      Retire(r);
      continue;
    }
    if (device_error && in_plan(r)) {
      Finish(r, absl::InternalError(absl::StrCat("the model workers failed: ", status.message())),
             FinishReason::kError, nullptr);
      continue;
    }
    if (++r->worker_failures > options_.max_worker_failures_per_request) {
      Finish(r,
             absl::UnavailableError(absl::StrCat(
                 "the model workers failed ", r->worker_failures,
                 " times while serving this request; giving up (last: ", status.message(), ")")),
             FinishReason::kError, nullptr);
      continue;
    }
    recompute_tokens += r->num_computed;
    pool_.Requeue(r);
    ++resumed;
  }
  if (metrics_ != nullptr) metrics_->AddResumed(resumed, recompute_tokens);
  DropSharedPrompts();
  encoder_.ResetAll();
  recovery_.Begin(status);  // Unless a recovery is under way already.
}

void Engine::PollRecovery() {
  std::optional<WorkerRecovery::Outcome> outcome = recovery_.Poll(blocks_.block_size());
  if (!outcome.has_value()) return;
  if (outcome->recovered.has_value()) {
    // The workers' KV caches are new: nothing the prefix cache remembers is there.
    blocks_.Reset(outcome->recovered->num_kv_blocks);
    spdlog::info(
        "the model workers are back after {:.1f} s ({} KV blocks); resuming {} "
        "request(s)",
        outcome->outage_s, outcome->recovered->num_kv_blocks, pool_.waiting().size());
    if (metrics_ != nullptr) metrics_->ObserveRecovery(outcome->outage_s);
    last_worker_contact_ = Clock::now();
    SetWorkersReady(true);
    return;
  }
  std::vector<Request*> live;
  for (auto& [id, r] : requests_) {
    if (!r->done) live.push_back(r.get());
  }
  for (Request* r : live) Finish(r, outcome->failure, FinishReason::kError, nullptr);
}

void Engine::SetWorkersReady(bool ready) {
  workers_ready_.store(ready);
  if (options_.on_workers_ready) options_.on_workers_ready(ready);
}

void Engine::OnToken(Request* r, const worker::v1::SampledToken& token, Clock::time_point now) {
  const bool first = r->num_output_tokens() == 1;
  if (first) {
    r->first_token = now;
    if (metrics_ != nullptr) metrics_->ObserveFirstToken(Seconds(now - r->arrival));
  } else if (metrics_ != nullptr) {
    metrics_->ObserveInterToken(Seconds(now - r->last_token));
  }
  r->last_token = now;
  ++counters_.generated_tokens;
  if (metrics_ != nullptr) metrics_->AddGeneratedTokens(1);

  v1::GenerateResponse message;
  message.set_request_id(r->request_id);
  message.add_token_ids(token.token_id());
  if (r->num_logprobs > 0) AddTokenLogprobs(*tokenizer_, *r, token, &message);
  if (first && r->prompt_logprobs >= 0) {
    for (v1::TokenLogprobs& scored : r->scored_prompt)
      *message.add_prompt_logprobs() = std::move(scored);
    r->scored_prompt.clear();
  }

  StopChecker::Verdict verdict = stop_checker_.Check(*r);
  message.set_text(std::move(verdict.text));
  if (!verdict.finish.has_value()) {
    dispatcher_.Send(r->sink, std::move(message));
    return;
  }
  if (!verdict.stop_string.empty()) {
    message.set_stop_string(std::move(verdict.stop_string));
  } else if (verdict.stop_token_id.has_value()) {
    message.set_stop_token_id(*verdict.stop_token_id);
  }
  Finish(r, absl::OkStatus(), *verdict.finish, &message);
}

void Engine::Finish(Request* r, const absl::Status& status, FinishReason reason,
                    v1::GenerateResponse* last) {
  r->done = true;
  const Clock::time_point now = Clock::now();
  if (status.ok()) {
    CompleteFinalMessage(*r, reason, now, last);
    dispatcher_.Send(r->sink, std::move(*last));
  }
  dispatcher_.Finish(r->sink, status);
  ++counters_.finished;
  if (metrics_ != nullptr) {
    metrics_->ObserveFinished(FinishReasonName(reason), Seconds(now - r->arrival),
                              r->num_prompt_tokens, r->num_output_tokens(), r->front_end);
  }
  spdlog::info(
      "request {} ({}) finished: reason={} status={} prompt_tokens={} cached_tokens={} "
      "generated_tokens={} queue_ms={:.1f} ttft_ms={:.1f} e2e_ms={:.1f} preemptions={}",
      r->id, r->request_id, FinishReasonName(reason), absl::StatusCodeToString(status.code()),
      r->num_prompt_tokens, r->num_cached_prompt_tokens, r->num_output_tokens(),
      r->scheduled_once ? Millis(r->first_scheduled - r->arrival) : -1.0,
      r->num_output_tokens() > 0 ? Millis(r->first_token - r->arrival) : -1.0,
      Millis(now - r->arrival), r->preemptions);
  {
    std::lock_guard<std::mutex> lock(mu_);
    --live_requests_;
  }
  if (!policy_->KeepAfterDone(r)) Retire(r);
}

void Engine::Retire(Request* r) {
  policy_->Forget(r);
  pool_.Remove(r);
  std::erase(parked_, r);
  encoder_.Drop(r->id);
  requests_.erase(r->id);
}

void Engine::PublishStats() {
  const int running = static_cast<int>(pool_.running().size());
  const int waiting = static_cast<int>(pool_.waiting().size() + parked_.size());
  counters_.running = running;
  counters_.waiting = waiting;
  counters_.kv_blocks_used = blocks_.num_used_blocks();
  counters_.kv_blocks_total = blocks_.num_blocks();
  {
    std::lock_guard<std::mutex> lock(mu_);
    stats_ = counters_;
  }
  if (metrics_ != nullptr) {
    int64_t slots_used = 0, slots_allocated = 0;
    for (const Request* r : pool_.running()) {
      if (r->done) continue;  // Padding holds blocks but no live tokens.
      slots_used += r->num_computed;
      slots_allocated += static_cast<int64_t>(r->blocks.num_blocks()) * blocks_.block_size();
    }
    metrics_->SetPool(running, waiting, blocks_.num_used_blocks(), blocks_.num_blocks(), slots_used,
                      slots_allocated);
    metrics_->SetCacheConfig(blocks_.block_size(), blocks_.num_blocks());
  }
}

}  // namespace conveyor::scheduler
