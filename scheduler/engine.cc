#include "scheduler/engine.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {
namespace {

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
double Millis(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

Engine::Engine(const Options& options, std::unique_ptr<BatchPolicy> policy, StepExecutor* executor,
               const Tokenizer* tokenizer, SchedulerMetrics* metrics)
    : options_(options),
      policy_(std::move(policy)),
      executor_(executor),
      tokenizer_(tokenizer),
      metrics_(metrics),
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
      wake_.wait_until(lock, wake_at,
                       [&] { return stopping_ || !inbox_.empty() || !cancels_.empty(); });
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
    Finish(it->second.get(), absl::CancelledError("the client cancelled the request"), "cancelled",
           nullptr);
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
           absl::DeadlineExceededError(absl::StrCat("the deadline passed after ",
                                                    r->num_output_tokens(), " generated tokens")),
           "deadline", nullptr);
  }
}

Clock::time_point Engine::NextWake() const {
  Clock::time_point wake = policy_->NextWakeup(pool_).value_or(Clock::time_point::max());
  for (const auto& [id, r] : requests_) {
    if (!r->done) wake = std::min(wake, r->deadline);
  }
  return wake;
}

void Engine::Loop() {
  bool idle = false;
  for (;;) {
    if (!TakeInbox(idle, idle ? NextWake() : Clock::time_point())) break;
    const Clock::time_point start = Clock::now();
    ExpireDeadlines(start);
    StepPlan plan = policy_->Plan(pool_, start);
    for (Request* r : plan.released) Retire(r);
    for (Request* r : plan.preempted) {
      if (r->on_worker) pending_drops_.push_back(r->id);
      r->on_worker = false;
      ++counters_.preemptions;
    }
    if (metrics_ != nullptr && !plan.preempted.empty()) {
      metrics_->AddPreemptions(static_cast<int>(plan.preempted.size()));
    }
    idle = plan.empty();
    if (!idle) {
      const worker::v1::StepRequest step = BuildStep(plan);
      absl::StatusOr<worker::v1::StepResponse> response = executor_->Step(step);
      if (response.ok()) {
        ApplyStep(plan, *response);
      } else {
        FailStep(plan, response.status());
      }
      if (metrics_ != nullptr) {
        metrics_->ObserveStep(Seconds(Clock::now() - start), plan.num_tokens(), plan.batch_slots,
                              plan.wasted_slots);
      }
    }
    PublishStats();
  }
  // Stopping: every live request gets its terminal status.
  absl::Status status;
  {
    std::lock_guard<std::mutex> lock(mu_);
    status = stop_status_;
    for (std::unique_ptr<Request>& r : inbox_) {
      r->sink->Finish(status);
      --live_requests_;
    }
    inbox_.clear();
  }
  std::vector<Request*> live;
  for (auto& [id, r] : requests_) live.push_back(r.get());
  for (Request* r : live) {
    if (!r->done) Finish(r, status, "error", nullptr);
  }
}

worker::v1::StepRequest Engine::BuildStep(const StepPlan& plan) {
  worker::v1::StepRequest step;
  step.set_step_id(next_step_id_++);
  if (reset_workers_) {
    step.set_reset(true);
    reset_workers_ = false;
  } else {
    for (uint64_t id : pending_drops_) step.add_dropped_seq_ids(id);
  }
  pending_drops_.clear();
  const Clock::time_point now = Clock::now();
  for (const ScheduledSequence& s : plan.sequences) {
    Request* r = s.request;
    const std::vector<int32_t>& blocks = r->blocks.blocks();
    if (!r->on_worker) {
      worker::v1::NewSequence* seq = step.add_new_sequences();
      seq->set_seq_id(r->id);
      seq->mutable_token_ids()->Add(r->tokens.begin(), r->tokens.end());
      seq->set_num_output_tokens(r->num_output_tokens());
      seq->set_num_cached_tokens(r->num_computed);
      seq->set_num_tokens(s.num_tokens);
      seq->mutable_block_ids()->Add(blocks.begin(), blocks.end());
      *seq->mutable_sampling() = r->sampling;
    } else {
      worker::v1::RunningSequence* seq = step.add_running();
      seq->set_seq_id(r->id);
      seq->set_num_tokens(s.num_tokens);
      seq->mutable_new_block_ids()->Add(blocks.begin() + r->num_blocks_on_worker, blocks.end());
    }
    if (!r->scheduled_once) {
      r->scheduled_once = true;
      r->first_scheduled = now;
      if (metrics_ != nullptr) {
        metrics_->ObserveQueueTime(Seconds(now - r->arrival));
        metrics_->AddPromptTokens(r->num_prompt_tokens);
      }
    }
  }
  return step;
}

void Engine::ApplyStep(const StepPlan& plan, const worker::v1::StepResponse& response) {
  ++counters_.steps;
  counters_.batch_slot_steps += plan.batch_slots;
  counters_.wasted_slot_steps += plan.wasted_slots;
  int prefill = 0;
  for (const ScheduledSequence& s : plan.sequences) {
    Request* r = s.request;
    prefill += std::max(0, std::min(r->num_computed + s.num_tokens, r->num_prompt_tokens) -
                               std::min(r->num_computed, r->num_prompt_tokens));
    r->num_computed += s.num_tokens;
    r->on_worker = true;
    r->num_blocks_on_worker = r->blocks.num_blocks();
    blocks_.CommitComputed(r->blocks, r->tokens, r->num_computed);
  }
  counters_.prefill_tokens += prefill;
  if (metrics_ != nullptr) {
    metrics_->AddPrefillTokens(prefill);
    metrics_->AddPrefixCacheLookups(blocks_.prefix_queries() - prefix_queries_seen_,
                                    blocks_.prefix_hits() - prefix_hits_seen_);
  }
  prefix_queries_seen_ = blocks_.prefix_queries();
  prefix_hits_seen_ = blocks_.prefix_hits();

  const Clock::time_point now = Clock::now();
  for (const worker::v1::SampledToken& token : response.tokens()) {
    auto it = requests_.find(token.seq_id());
    if (it == requests_.end()) continue;  // Cannot happen: the worker echoes our ids.
    Request* r = it->second.get();
    r->tokens.push_back(token.token_id());
    // Padding members of a run-to-completion batch compute, but nobody listens.
    if (!r->done) OnToken(r, token, now);
  }
}

void Engine::FailStep(const StepPlan& plan, const absl::Status& status) {
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
    if (!r->done) Finish(r, client_status, "error", nullptr);
    if (requests_.contains(r->id)) Retire(r);
  }
  pending_drops_.clear();
  reset_workers_ = true;
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
    v1::TokenLogprobs* lp = message.add_logprobs();
    lp->mutable_token()->set_token_id(id);
    lp->mutable_token()->set_text(ValidUtf8(tokenizer_->Decode({id})));
    lp->mutable_token()->set_logprob(token.logprob());
    for (const worker::v1::TokenLogprob& alt : token.top_logprobs()) {
      v1::TokenLogprob* t = lp->add_top();
      t->set_token_id(alt.token_id());
      t->set_text(ValidUtf8(tokenizer_->Decode({alt.token_id()})));
      t->set_logprob(alt.logprob());
    }
  }

  const char* reason = nullptr;
  if (Contains(r->eos_token_ids, id)) {
    reason = "eos";
  } else if (Contains(r->stop_token_ids, id)) {
    reason = "stop";
  } else {
    StopMatcher::Result result = r->stop_matcher->Feed(r->detokenizer->Append(id));
    message.set_text(ValidUtf8(result.emit));
    if (result.stopped) reason = "stop";
  }
  if (reason == nullptr && (r->num_output_tokens() >= r->max_new_tokens ||
                            r->num_tokens() >= options_.max_context_tokens)) {
    reason = "length";
  }
  if (reason == nullptr) {
    r->sink->Send(std::move(message));
    return;
  }
  if (std::string_view(reason) != "stop") {
    // Text held back for a possible stop string or an incomplete character is final now.
    StopMatcher::Result tail = r->stop_matcher->Feed(r->detokenizer->Flush());
    message.mutable_text()->append(ValidUtf8(tail.emit));
    if (tail.stopped) {
      reason = "stop";
    } else {
      message.mutable_text()->append(ValidUtf8(r->stop_matcher->Flush()));
    }
  }
  Finish(r, absl::OkStatus(), reason, &message);
}

void Engine::Finish(Request* r, const absl::Status& status, std::string_view reason,
                    v1::GenerateResponse* last) {
  r->done = true;
  const Clock::time_point now = Clock::now();
  if (status.ok()) {
    const v1::FinishReason wire = reason == "eos"      ? v1::FINISH_REASON_EOS
                                  : reason == "stop"   ? v1::FINISH_REASON_STOP
                                  : reason == "length" ? v1::FINISH_REASON_LENGTH
                                                       : v1::FINISH_REASON_CANCELLED;
    last->set_finish_reason(wire);
    v1::Usage* usage = last->mutable_usage();
    usage->set_prompt_tokens(r->num_prompt_tokens);
    usage->set_generated_tokens(r->num_output_tokens());
    usage->set_cached_prompt_tokens(r->num_cached_prompt_tokens);
    usage->set_queue_time_ms(Millis(r->first_scheduled - r->arrival));
    usage->set_time_to_first_token_ms(Millis(r->first_token - r->arrival));
    usage->set_e2e_latency_ms(Millis(now - r->arrival));
    usage->set_preemptions(r->preemptions);
    r->sink->Send(std::move(*last));
  }
  r->sink->Finish(status);
  ++counters_.finished;
  if (metrics_ != nullptr) {
    metrics_->ObserveFinished(reason, Seconds(now - r->arrival), r->num_prompt_tokens,
                              r->num_output_tokens());
  }
  spdlog::info(
      "request {} ({}) finished: reason={} status={} prompt_tokens={} cached_tokens={} "
      "generated_tokens={} queue_ms={:.1f} ttft_ms={:.1f} e2e_ms={:.1f} preemptions={}",
      r->id, r->request_id, reason, absl::StatusCodeToString(status.code()), r->num_prompt_tokens,
      r->num_cached_prompt_tokens, r->num_output_tokens(),
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
  if (r->on_worker) pending_drops_.push_back(r->id);
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
    metrics_->SetPool(running, waiting, blocks_.num_used_blocks(), blocks_.num_blocks(),
                      slots_used, slots_allocated);
  }
}

}  // namespace conveyor::scheduler
