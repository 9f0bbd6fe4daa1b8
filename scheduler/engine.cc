#include "scheduler/engine.h"

#include <algorithm>
#include <optional>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"
#include "text/utf8.h"

namespace conveyor::scheduler {
namespace {

// How far back a logprob's text looks for a token of complete text to decode after.
constexpr size_t kLogprobAnchorTokens = 8;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// The reason a final message carries. Cancellations, deadlines and errors end with a
// non-OK status and no final message, so the wire needs no values of its own for them.
v1::FinishReason WireFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return v1::FINISH_REASON_LENGTH;
    case FinishReason::kEos:
      return v1::FINISH_REASON_EOS;
    case FinishReason::kStop:
      return v1::FINISH_REASON_STOP;
    case FinishReason::kCancelled:
    case FinishReason::kDeadline:
    case FinishReason::kError:
      return v1::FINISH_REASON_CANCELLED;
  }
  return v1::FINISH_REASON_CANCELLED;  // Unreachable: the switch covers every value.
}

}  // namespace

Engine::Engine(const Options& options, std::unique_ptr<BatchPolicy> policy, StepExecutor* executor,
               const Tokenizer* tokenizer, SchedulerMetrics* metrics)
    : options_(options),
      max_steps_in_flight_(std::clamp(options.max_steps_in_flight, 1, 2)),
      policy_(std::move(policy)),
      executor_(executor),
      tokenizer_(tokenizer),
      metrics_(metrics),
      stop_checker_(options.max_context_tokens),
      blocks_(options.num_kv_blocks, options.block_size, options.enable_prefix_caching),
      pool_(&blocks_) {
  counters_.kv_blocks_total = options.num_kv_blocks;
  stats_ = counters_;
}

Engine::~Engine() { Stop(absl::UnavailableError("the server is shutting down")); }

void Engine::Start() {
  thread_ = std::thread([this] { Loop(); });
}

absl::StatusOr<uint64_t> Engine::Submit(std::unique_ptr<Request> request) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopping_ || draining_) {
    return absl::UnavailableError("the server is shutting down and accepts no new requests");
  }
  if (outage_exceeded_) {
    return absl::UnavailableError(absl::StrCat(
        "the model workers are down and have not come back within ",
        std::chrono::duration_cast<std::chrono::seconds>(options_.worker_recovery_timeout).count(),
        " s; retry later"));
  }
  if (live_requests_ - stats_.running >= options_.max_queue) {
    return absl::ResourceExhaustedError(
        absl::StrCat("the waiting queue is full (", options_.max_queue, " requests); retry later"));
  }
  request->id = next_request_id_++;
  if (request->request_id.empty()) request->request_id = absl::StrCat("req-", request->id);
  request->arrival = Clock::now();
  const uint64_t id = request->id;
  inbox_.push_back(std::move(request));
  ++live_requests_;
  wake_.notify_one();
  return id;
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
        return stopping_ || !inbox_.empty() || !cancels_.empty() || recovery_result_.has_value();
      });
    }
    if (stopping_) return false;
    arrivals.swap(inbox_);
    cancels.swap(cancels_);
  }
  for (std::unique_ptr<Request>& r : arrivals) {
    Request* raw = r.get();
    requests_[raw->id] = std::move(r);
    pool_.AddWaiting(raw);
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
    Finish(r,
           absl::DeadlineExceededError(absl::StrCat(
               "the deadline passed after ", r->num_output_tokens(), " generated tokens",
               recovering_ ? " (while the model workers were recovering from a failure)" : "")),
           FinishReason::kDeadline, nullptr);
  }
}

Clock::time_point Engine::NextWake() const {
  // Recovering, only the recovery's answer (it wakes the loop) and deadlines matter;
  // idle, also the next liveness check.
  Clock::time_point wake =
      recovering_ ? Clock::time_point::max()
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
    const bool wait = (idle && in_flight_.empty()) || recovering_;
    if (!TakeInbox(wait, wait ? NextWake() : Clock::time_point())) break;
    const Clock::time_point start = Clock::now();
    ExpireDeadlines(start);
    if (recovering_) {
      PollRecovery();
      if (recovering_) {
        PublishStats();
        continue;
      }
    }
    bool launched = false;
    if (static_cast<int>(in_flight_.size()) < max_steps_in_flight_) {
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
        Launch(plan, start);
        launched = true;
      }
    }
    // The oldest step's answer is next once the pipeline is full, or when nothing new
    // could be sent (its answer may free blocks or make a preempted request admissible).
    const bool had_in_flight = !in_flight_.empty();
    if (had_in_flight &&
        (!launched || static_cast<int>(in_flight_.size()) >= max_steps_in_flight_)) {
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
  if (!in_flight_.empty()) {
    // Stopping: what the workers still compute is not wanted.
    const InFlightStep oldest = std::move(in_flight_.front());
    in_flight_.pop_front();
    oldest.call->Cancel();
    oldest.call->Wait().IgnoreError();
    AbandonInFlight(oldest);
  }
  if (recovery_thread_.joinable()) {
    executor_->CancelRecovery();
    recovery_thread_.join();
  }
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
  InFlightStep flight;
  flight.planned = planned;
  flight.num_tokens = plan.num_tokens();
  flight.batch_slots = plan.batch_slots;
  flight.wasted_slots = plan.wasted_slots;
  flight.sequences.reserve(plan.sequences.size());
  for (const ScheduledSequence& s : plan.sequences) {
    Request* r = s.request;
    flight.prefill_tokens +=
        std::max(0, std::min(r->num_computed + s.num_tokens, r->num_prompt_tokens) -
                        std::min(r->num_computed, r->num_prompt_tokens));
    r->num_computed += s.num_tokens;
    // It samples once its known tokens are computed (as the worker decides); the token
    // is known when the answer comes.
    if (r->num_computed == r->num_tokens()) {
      r->tokens.push_back(kPendingToken);
      ++r->num_pending_tokens;
    }
    flight.sequences.push_back({r->id, s.num_tokens, r->num_computed, r->residency});
  }
  dispatcher_.Post();  // Cancellations and deadlines taken this iteration.
  // One step at a time, the executor's plain call (for one rank a blocking gRPC call,
  // the cheapest round trip); else the call returns before the answer.
  flight.call = max_steps_in_flight_ > 1
                    ? executor_->StartStep(step)
                    : std::make_unique<FinishedStepCall>(executor_->Step(step));
  in_flight_.push_back(std::move(flight));
}

void Engine::CompleteOldestStep() {
  const InFlightStep step = std::move(in_flight_.front());
  in_flight_.pop_front();
  absl::StatusOr<worker::v1::StepResponse> response = step.call->Wait();
  last_worker_contact_ = Clock::now();
  if (response.ok()) {
    ApplyStep(step, *response);
  } else {
    AbandonInFlight(step);
    if (IsWorkerFailure(response.status())) {
      OnWorkerFailure(response.status(), &step);
    } else {
      FailStep(response.status());
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

void Engine::AbandonInFlight(const InFlightStep& failed) {
  for (InFlightStep& step : in_flight_) step.call->Cancel();
  std::vector<const InFlightStep*> abandoned = {&failed};
  for (InFlightStep& step : in_flight_) {
    step.call->Wait().IgnoreError();  // Refused by the workers, or its answer unwanted.
    abandoned.push_back(&step);
  }
  for (const InFlightStep* step : abandoned) {
    for (const InFlightStep::Sequence& s : step->sequences) {
      auto it = requests_.find(s.id);
      if (it != requests_.end() && it->second->residency == s.residency) {
        it->second->num_computed -= s.num_tokens;
      }
    }
  }
  in_flight_.clear();
  // The tokens those steps were to sample will not come; a request recomputed later
  // samples them again (the same ones: randomness depends on seed, sequence, position).
  for (auto& [id, r] : requests_) {
    r->tokens.resize(r->num_known_tokens());
    r->num_pending_tokens = 0;
  }
}

void Engine::ApplyStep(const InFlightStep& step, const worker::v1::StepResponse& response) {
  ++counters_.steps;
  counters_.batch_slot_steps += step.batch_slots;
  counters_.wasted_slot_steps += step.wasted_slots;
  for (const InFlightStep::Sequence& s : step.sequences) {
    auto it = requests_.find(s.id);
    if (it == requests_.end()) continue;  // Ended while the step ran.
    Request* r = it->second.get();
    // Preempted since it was planned, its blocks are gone; else its tokens up to this
    // step's are known now, and their full blocks can be cached.
    if (r->residency == s.residency) {
      blocks_.CommitComputed(r->blocks, r->tokens, s.num_computed_after);
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
  for (const worker::v1::SampledToken& token : response.tokens()) {
    auto it = requests_.find(token.seq_id());
    if (it == requests_.end()) {
      ++discarded;  // It stopped or was cancelled after this step was sent.
      continue;
    }
    Request* r = it->second.get();
    if (r->num_pending_tokens == 0) continue;  // Cannot happen: each sampler got one.
    r->tokens[r->num_known_tokens()] = token.token_id();
    --r->num_pending_tokens;
    // Padding members of a run-to-completion batch compute, but nobody listens.
    if (!r->done) OnToken(r, token, now);
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

void Engine::OnWorkerFailure(const absl::Status& status, const InFlightStep* step) {
  const Clock::time_point now = Clock::now();
  spdlog::error(
      "the model workers failed: {}; keeping {} running and {} waiting request(s) "
      "and recovering",
      status.ToString(), pool_.running().size(), pool_.waiting().size());
  if (metrics_ != nullptr) metrics_->CountWorkerFailure();
  if (!recovering_) {
    outage_started_ = now;
    outage_cause_ = status;
    SetWorkersReady(false);
  }
  // A device error (INTERNAL) may come from what the step computed: its requests fail
  // rather than risk the fault again. The others are recomputed once the workers are back.
  const bool device_error = status.code() == absl::StatusCode::kInternal;
  auto in_plan = [&](const Request* r) {
    return step != nullptr &&
           std::any_of(step->sequences.begin(), step->sequences.end(),
                       [&](const InFlightStep::Sequence& s) { return s.id == r->id; });
  };
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
  encoder_.ResetAll();
  if (!recovering_) StartRecovery();
}

void Engine::StartRecovery() {
  recovering_ = true;
  if (recovery_thread_.joinable()) recovery_thread_.join();
  const auto deadline = std::chrono::system_clock::now() + options_.worker_recovery_timeout;
  recovery_thread_ = std::thread([this, deadline] {
    absl::StatusOr<RecoveredWorkers> result = executor_->Recover(deadline);
    std::lock_guard<std::mutex> lock(mu_);
    recovery_result_ = std::move(result);
    wake_.notify_one();
  });
}

void Engine::PollRecovery() {
  std::optional<absl::StatusOr<RecoveredWorkers>> result;
  {
    std::lock_guard<std::mutex> lock(mu_);
    result.swap(recovery_result_);
  }
  if (!result.has_value()) return;
  recovery_thread_.join();
  const double outage_s = Seconds(Clock::now() - outage_started_);
  if (result->ok() && (*result)->block_size == blocks_.block_size()) {
    // The workers' KV caches are new: nothing the prefix cache remembers is there.
    blocks_.Reset((*result)->num_kv_blocks);
    recovering_ = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      outage_exceeded_ = false;
    }
    spdlog::info(
        "the model workers are back after {:.1f} s ({} KV blocks); resuming {} "
        "request(s)",
        outage_s, (*result)->num_kv_blocks, pool_.waiting().size());
    if (metrics_ != nullptr) metrics_->ObserveRecovery(outage_s);
    last_worker_contact_ = Clock::now();
    SetWorkersReady(true);
    return;
  }
  const absl::Status why = result->ok()
                               ? absl::FailedPreconditionError(absl::StrCat(
                                     "the workers came back with block_size ",
                                     (*result)->block_size, ", not ", blocks_.block_size()))
                               : result->status();
  spdlog::error("the model workers are still down after {:.1f} s: {}", outage_s, why.ToString());
  const absl::Status client_status = absl::UnavailableError(absl::StrCat(
      "the model workers failed (", outage_cause_.message(), ") and were not back within ",
      std::chrono::duration_cast<std::chrono::seconds>(options_.worker_recovery_timeout).count(),
      " s (--worker_recovery_timeout_s): ", why.message()));
  std::vector<Request*> live;
  for (auto& [id, r] : requests_) {
    if (!r->done) live.push_back(r.get());
  }
  for (Request* r : live) Finish(r, client_status, FinishReason::kError, nullptr);
  {
    std::lock_guard<std::mutex> lock(mu_);
    outage_exceeded_ = true;
  }
  StartRecovery();  // Keep trying: serve again as soon as the workers are back.
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
  const int32_t id = token.token_id();
  message.add_token_ids(id);
  if (r->num_logprobs > 0) {
    // Each token's text as it would appear in the stream at this point: decoded after an
    // earlier token of complete text (the latest of the last few), so a sentencepiece
    // "▁f" reads " f" mid-text, as streamed.
    std::optional<int32_t> anchor;
    std::string before;
    const size_t known = r->num_known_tokens();
    for (size_t k = known - 1; k-- > 0 && known - k <= kLogprobAnchorTokens;) {
      before = tokenizer_->Decode({r->tokens[k]});
      if (!before.empty() && ValidUtf8(before) == before &&
          before.find("\xEF\xBF\xBD") == std::string::npos) {
        anchor = r->tokens[k];
        break;
      }
    }
    auto text_in_stream = [&](int32_t candidate) {
      if (!anchor.has_value()) return ValidUtf8(tokenizer_->Decode({candidate}));
      std::string both = tokenizer_->Decode({*anchor, candidate});
      if (both.compare(0, before.size(), before) == 0) both.erase(0, before.size());
      return ValidUtf8(both);
    };
    v1::TokenLogprobs* lp = message.add_logprobs();
    lp->mutable_token()->set_token_id(id);
    lp->mutable_token()->set_text(text_in_stream(id));
    lp->mutable_token()->set_logprob(token.logprob());
    for (const worker::v1::TokenLogprob& alt : token.top_logprobs()) {
      v1::TokenLogprob* t = lp->add_top();
      t->set_token_id(alt.token_id());
      t->set_text(text_in_stream(alt.token_id()));
      t->set_logprob(alt.logprob());
    }
  }

  StopChecker::Verdict verdict = stop_checker_.Check(*r);
  message.set_text(std::move(verdict.text));
  if (!verdict.finish.has_value()) {
    dispatcher_.Send(r->sink, std::move(message));
    return;
  }
  Finish(r, absl::OkStatus(), *verdict.finish, &message);
}

void Engine::Finish(Request* r, const absl::Status& status, FinishReason reason,
                    v1::GenerateResponse* last) {
  r->done = true;
  const Clock::time_point now = Clock::now();
  if (status.ok()) {
    last->set_finish_reason(WireFinishReason(reason));
    v1::Usage* usage = last->mutable_usage();
    usage->set_prompt_tokens(r->num_prompt_tokens);
    usage->set_generated_tokens(r->num_output_tokens());
    usage->set_cached_prompt_tokens(r->num_cached_prompt_tokens);
    usage->set_queue_time_ms(Millis(r->first_scheduled - r->arrival));
    usage->set_time_to_first_token_ms(Millis(r->first_token - r->arrival));
    usage->set_e2e_latency_ms(Millis(now - r->arrival));
    usage->set_preemptions(r->preemptions);
    dispatcher_.Send(r->sink, std::move(*last));
  }
  dispatcher_.Finish(r->sink, status);
  ++counters_.finished;
  if (metrics_ != nullptr) {
    metrics_->ObserveFinished(FinishReasonName(reason), Seconds(now - r->arrival),
                              r->num_prompt_tokens, r->num_output_tokens(), r->api);
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
  encoder_.Drop(r->id);
  requests_.erase(r->id);
}

void Engine::PublishStats() {
  const int running = static_cast<int>(pool_.running().size());
  const int waiting = static_cast<int>(pool_.waiting().size());
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
  }
}

}  // namespace conveyor::scheduler
