// Benchmarks what the scheduler adds to every generation step, next to the step itself:
//
//   engine_iteration/N   One iteration of the real scheduler loop (scheduler/engine.cc)
//                        with N sequences decoding under the continuous policy: take the
//                        inbox, plan (BatchPolicy::Plan over RequestPool + BlockManager),
//                        build the delta-encoded StepRequest, then apply the StepResponse
//                        (append tokens, commit blocks to the prefix cache, detokenize,
//                        stop checks, stream into a sink that discards, publish stats and
//                        metrics). Everything the loop does per step except the worker.
//                        The executor answers at once with one token per sequence that
//                        reached its end; the time measured is from the moment Step
//                        returned to the engine until the engine calls Step again, so the
//                        executor's own work and the benchmark's hand-off are excluded.
//   plan/N               BatchPolicy::Plan alone on a pool of N decoding sequences.
//   step_rpc/empty       WorkerGroup::Step round trip to a real conveyor-worker process on
//   step_rpc/decode64    loopback: an empty StepRequest, and a batch-64 decode step (64
//                        running sequences x 1 token) on the tiny test model. The worker's
//                        own time (StepResponse.timings.total_ms) is reported too, so the
//                        RPC overhead is round trip - worker total.
//   step_rpc/empty_idle3ms  An empty step sent 3 ms after the previous one returned (as
//                        when a real step keeps the channel idle): shows how much of the
//                        decode64 overhead is waking idle threads rather than payload.
//
// Each benchmark reports mean time per iteration (manual time) and p50/p99 counters in µs.
// At the end a summary compares scheduling + RPC overhead at batch 64 with the step time
// of the `small` model at batch 64 (--small_step_ms, from bench/run_worker_bench.sh).
//
// Usage: scheduler_bench [--model=DIR] [--worker=PATH] [--worker_threads=N]
//                        [--small_step_ms=X] [--steps=N] [--rpc_steps=N] [--quick]
//                        [--no_rpc] [--no_metrics] [--benchmark_* flags]
//   --model   the tiny test model (tokenizer + weights); generated into a temporary
//             folder with tests/model_gen/make_test_model.py if not given.
// bench/run_scheduler_bench.sh builds and runs it.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "benchmark/benchmark.h"
#include "prometheus/registry.h"
#include "scheduler/continuous_policy.h"
#include "scheduler/engine.h"
#include "scheduler/metrics.h"
#include "scheduler/policy.h"
#include "scheduler/request_builder.h"
#include "scheduler/request_pool.h"
#include "scheduler/worker_group.h"
#include "spdlog/spdlog.h"
#include "testing/subprocess.h"
#include "text/tokenizer.h"
#include "worker.pb.h"

#ifndef CONVEYOR_SOURCE_DIR
#define CONVEYOR_SOURCE_DIR "."
#endif
#ifndef CONVEYOR_WORKER_BIN_DEFAULT
#define CONVEYOR_WORKER_BIN_DEFAULT "conveyor-worker"
#endif

namespace conveyor::bench {
namespace {

namespace wv1 = ::conveyor::worker::v1;
using scheduler::Clock;
using namespace std::chrono_literals;

constexpr int kBlockSize = 16;
constexpr int kSequenceCounts[] = {64, 256, 1024};
constexpr int kWarmupSteps = 50;

struct Flags {
  std::string model_dir;
  std::string worker_bin = CONVEYOR_WORKER_BIN_DEFAULT;
  int worker_threads = 1;
  double small_step_ms = 0;
  int steps = 2000;      // Measured engine iterations per sequence count.
  int rpc_steps = 2000;  // Measured round trips per RPC shape.
  bool rpc = true;
  bool metrics = true;
};
Flags g_flags;

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "scheduler_bench: %s\n", what.c_str());
  std::exit(1);
}

double Micros(Clock::duration d) { return std::chrono::duration<double, std::micro>(d).count(); }

// Summary statistics of samples in µs.
struct Dist {
  double mean = 0, p50 = 0, p99 = 0, max = 0;
  size_t n = 0;
};
Dist Summarize(std::vector<double> v) {
  Dist d;
  d.n = v.size();
  if (v.empty()) return d;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  d.mean = sum / v.size();
  auto pct = [&](double p) { return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))]; };
  d.p50 = pct(0.50);
  d.p99 = pct(0.99);
  d.max = v.back();
  return d;
}

void ReportDist(benchmark::State& state, const Dist& d, const char* prefix = "") {
  state.counters[std::string(prefix) + "p50_us"] = d.p50;
  state.counters[std::string(prefix) + "p99_us"] = d.p99;
}

// What the summary needs from each benchmark (the last run of each name).
std::mutex g_results_mu;
std::map<std::string, std::map<std::string, double>> g_results;
void Record(const std::string& name, const std::map<std::string, double>& values) {
  std::lock_guard<std::mutex> lock(g_results_mu);
  g_results[name] = values;
}

// --- The tiny model and its tokenizer -------------------------------------------------

const Tokenizer& GetTokenizer() {
  static std::unique_ptr<Tokenizer> tokenizer = [] {
    auto t = Tokenizer::Load(g_flags.model_dir);
    if (!t.ok()) Die("loading the tokenizer: " + t.status().ToString());
    return std::move(*t);
  }();
  return *tokenizer;
}

// Token ids that decode alone to plain, valid text (no control or byte-fallback pieces),
// so the streamed output looks like text and the detokenizer takes its common path.
const std::vector<int32_t>& TextTokens() {
  static const std::vector<int32_t> ids = [] {
    const Tokenizer& t = GetTokenizer();
    std::vector<int32_t> out;
    for (int id = 3; id < t.vocab_size(); ++id) {
      const std::string s = t.Decode({id});
      if (s.empty() || s.find("\xEF\xBF\xBD") != std::string::npos) continue;
      bool ascii = std::all_of(s.begin(), s.end(), [](char c) {
        return static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f;
      });
      if (ascii) out.push_back(id);
    }
    if (out.size() < 16) Die("the tokenizer has too few plain-text pieces");
    return out;
  }();
  return ids;
}

// --- engine_iteration/N: the scheduler loop with an instant executor ------------------

// Discards the stream; counts requests that ended (none should in steady state).
class NullSink final : public scheduler::ResponseSink {
 public:
  explicit NullSink(std::atomic<int>* finished) : finished_(finished) {}
  void Send(v1::GenerateResponse message) override { benchmark::DoNotOptimize(message); }
  void Finish(const absl::Status&) override { finished_->fetch_add(1); }

 private:
  std::atomic<int>* finished_;
};

// Answers every step at once with a token for each sequence that reached the end of its
// known tokens (as a worker would), but only when the benchmark thread lets it: the
// engine thread parks inside Step, which lies outside the measured interval.
class InstantExecutor final : public scheduler::StepExecutor {
 public:
  struct Sample {
    double interval_us = 0;  // From the previous Step's return to this Step's call.
    int running = 0;
    int new_sequences = 0;
    bool all_decode = false;  // Only running sequences, one token each.
    size_t request_bytes = 0;
  };

  explicit InstantExecutor(std::vector<int32_t> vocabulary) : vocabulary_(std::move(vocabulary)) {}

  absl::StatusOr<wv1::StepResponse> Step(const wv1::StepRequest& request) override {
    const Clock::time_point enter = Clock::now();
    Sample sample;
    sample.interval_us = has_exit_ ? Micros(enter - last_exit_) : 0;
    sample.running = request.running_size();
    sample.new_sequences = request.new_sequences_size();
    sample.all_decode =
        sample.new_sequences == 0 && request.dropped_seq_ids_size() == 0 &&
        std::all_of(request.running().begin(), request.running().end(),
                    [](const wv1::RunningSequence& r) { return r.num_tokens() == 1; });
    sample.request_bytes = request.ByteSizeLong();
    {
      std::unique_lock<std::mutex> lock(mu_);
      last_sample_ = sample;
      ++arrived_;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_ >= arrived_ || stopped_; });
    }

    wv1::StepResponse response;
    response.set_step_id(request.step_id());
    if (request.reset()) seqs_.clear();
    for (uint64_t id : request.dropped_seq_ids()) seqs_.erase(id);
    for (const wv1::NewSequence& n : request.new_sequences()) {
      Seq& s = seqs_[n.seq_id()];
      s.known = n.token_ids_size();
      s.computed = n.num_cached_tokens() + n.num_tokens();
      Emit(n.seq_id(), s, &response);
    }
    for (const wv1::RunningSequence& r : request.running()) {
      Seq& s = seqs_[r.seq_id()];
      s.computed += r.num_tokens();
      Emit(r.seq_id(), s, &response);
    }
    response.mutable_timings();
    last_exit_ = Clock::now();
    has_exit_ = true;
    return response;
  }

  // Lets the parked step finish and waits until the engine calls Step again; returns
  // that call's sample, or nullopt if the engine did not come back within `timeout`.
  std::optional<Sample> Advance(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    ++released_;
    cv_.notify_all();
    if (!cv_.wait_for(lock, timeout, [&] { return arrived_ > released_; })) return std::nullopt;
    return last_sample_;
  }

  // Waits for the first step.
  std::optional<Sample> WaitFirst(std::chrono::milliseconds timeout = 10s) {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, timeout, [&] { return arrived_ > released_; })) return std::nullopt;
    return last_sample_;
  }

  // Releases every step from now on (for shutting the engine down).
  void StopGating() {
    std::lock_guard<std::mutex> lock(mu_);
    stopped_ = true;
    cv_.notify_all();
  }

 private:
  struct Seq {
    int known = 0;
    int computed = 0;
  };
  void Emit(uint64_t id, Seq& s, wv1::StepResponse* response) {
    if (s.computed != s.known) return;
    rng_ = rng_ * 6364136223846793005ULL + 1442695040888963407ULL;
    wv1::SampledToken* t = response->add_tokens();
    t->set_seq_id(id);
    t->set_token_id(vocabulary_[(rng_ >> 33) % vocabulary_.size()]);
    ++s.known;
  }

  const std::vector<int32_t> vocabulary_;
  std::unordered_map<uint64_t, Seq> seqs_;  // Engine thread only.
  uint64_t rng_ = 42;
  Clock::time_point last_exit_;
  bool has_exit_ = false;

  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t arrived_ = 0;
  uint64_t released_ = 0;
  bool stopped_ = false;
  Sample last_sample_;
};

void BM_EngineIteration(benchmark::State& state, int num_seqs) {
  const Tokenizer& tokenizer = GetTokenizer();
  const std::vector<int32_t>& text = TextTokens();
  std::mt19937 rng(num_seqs);

  // Room for every sequence to grow through setup, warm-up and the measured steps.
  const int max_prompt = 48;
  const int max_steps = static_cast<int>(state.max_iterations) + kWarmupSteps + 64;
  const int blocks_per_seq = (max_prompt + max_steps + kBlockSize - 1) / kBlockSize + 1;
  const int num_blocks = num_seqs * blocks_per_seq;

  scheduler::ServingLimits limits;
  limits.vocab_size = tokenizer.vocab_size();
  limits.max_context_tokens = 1 << 24;  // The scheduler side has no model limit here.
  limits.kv_capacity_tokens = num_blocks * kBlockSize;
  limits.eos_token_ids = {tokenizer.eos_id()};
  limits.bos_token_id = tokenizer.bos_id();

  scheduler::PolicyOptions policy_options;
  policy_options.name = "continuous";
  policy_options.limits.max_num_seqs = num_seqs;
  policy_options.limits.max_step_tokens = 8192;
  auto policy = scheduler::MakePolicy(policy_options);
  if (!policy.ok()) Die(policy.status().ToString());

  scheduler::Engine::Options engine_options;
  engine_options.num_kv_blocks = num_blocks;
  engine_options.block_size = kBlockSize;
  engine_options.enable_prefix_caching = true;
  engine_options.max_queue = num_seqs + 16;
  engine_options.max_context_tokens = limits.max_context_tokens;
  // Each Step returns before the next one is planned: the interval is the loop's own work.
  engine_options.max_steps_in_flight = 1;

  prometheus::Registry registry;
  std::unique_ptr<scheduler::SchedulerMetrics> metrics;
  if (g_flags.metrics) {
    metrics = std::make_unique<scheduler::SchedulerMetrics>(registry, "tiny", "continuous");
  }
  InstantExecutor executor(text);
  std::atomic<int> finished{0};
  auto engine = std::make_unique<scheduler::Engine>(engine_options, std::move(*policy), &executor,
                                                    &tokenizer, metrics.get());
  engine->Start();

  // Requests: plain-text prompts of 17..48 tokens (staggered block boundaries), sampling
  // parameters as a chat client sends them, two stop strings that cannot occur in this
  // vocabulary (so the matcher holds back and releases text every step), no EOS.
  for (int i = 0; i < num_seqs; ++i) {
    v1::GenerateRequest proto;
    const int len = 17 + static_cast<int>(rng() % (max_prompt - 16));
    for (int k = 0; k < len; ++k) {
      proto.mutable_token_ids()->add_ids(text[rng() % text.size()]);
    }
    proto.set_max_new_tokens(max_steps + 1000);
    proto.set_ignore_eos(true);
    proto.set_temperature(0.7f);
    proto.set_top_p(0.9f);
    proto.add_stop("<|end|>");
    proto.add_stop("###");
    auto built = scheduler::BuildRequest(proto, limits, tokenizer);
    if (!built.ok()) Die("BuildRequest: " + built.status().ToString());
    (*built)->sink = std::make_shared<NullSink>(&finished);
    auto id = engine->Submit(std::move(*built));
    if (!id.ok()) Die("Submit: " + id.status().ToString());
  }

  // Prefill until every sequence decodes, then warm up.
  std::optional<InstantExecutor::Sample> sample = executor.WaitFirst();
  int setup_steps = 0;
  while (sample && !(sample->all_decode && sample->running == num_seqs)) {
    if (++setup_steps > 1000) Die("the engine never reached steady decoding");
    sample = executor.Advance();
  }
  for (int i = 0; i < kWarmupSteps && sample; ++i) sample = executor.Advance();
  if (!sample) Die("the engine stopped stepping during setup");

  std::vector<double> intervals;
  intervals.reserve(state.max_iterations);
  int unsteady = 0;
  size_t request_bytes = 0;
  for (auto _ : state) {
    sample = executor.Advance();
    if (!sample) Die("the engine stopped stepping");
    if (!(sample->all_decode && sample->running == num_seqs)) ++unsteady;
    state.SetIterationTime(sample->interval_us * 1e-6);
    intervals.push_back(sample->interval_us);
    request_bytes = sample->request_bytes;
  }

  executor.StopGating();
  const scheduler::Engine::Stats stats = engine->stats();
  engine->Stop(absl::CancelledError("benchmark done"));
  engine.reset();

  const Dist d = Summarize(intervals);
  ReportDist(state, d);
  state.counters["us_per_seq"] = d.mean / num_seqs;
  state.counters["step_req_bytes"] = static_cast<double>(request_bytes);
  state.counters["preempt"] = static_cast<double>(stats.preemptions);
  if (unsteady > 0 || finished.load() > num_seqs || stats.preemptions > 0) {
    state.SkipWithError("left steady state (preemptions, finished requests or odd steps)");
  }
  Record("engine_iteration/" + std::to_string(num_seqs),
         {{"mean", d.mean}, {"p50", d.p50}, {"p99", d.p99}, {"bytes", double(request_bytes)}});
}

// --- plan/N: the continuous policy alone ----------------------------------------------

void BM_Plan(benchmark::State& state, int num_seqs) {
  const int max_steps = static_cast<int>(state.max_iterations) + kWarmupSteps + 64;
  const int blocks_per_seq = (48 + max_steps + kBlockSize - 1) / kBlockSize + 1;
  scheduler::BlockManager blocks(num_seqs * blocks_per_seq, kBlockSize, true);
  scheduler::RequestPool pool(&blocks);
  scheduler::ContinuousPolicy policy({num_seqs, 8192});
  std::mt19937 rng(num_seqs);
  std::vector<std::unique_ptr<scheduler::Request>> requests;
  const Clock::time_point t0 = Clock::now();
  for (int i = 0; i < num_seqs; ++i) {
    auto r = std::make_unique<scheduler::Request>();
    r->id = i + 1;
    r->arrival = t0 + std::chrono::microseconds(i);
    const int len = 17 + static_cast<int>(rng() % 32);
    for (int k = 0; k < len; ++k) r->tokens.push_back(3 + static_cast<int32_t>(rng() % 500));
    r->num_prompt_tokens = len;
    r->max_new_tokens = max_steps + 1000;
    pool.AddWaiting(r.get());
    requests.push_back(std::move(r));
  }
  // What Engine::ApplyStep does to the scheduling state.
  auto apply = [&](const scheduler::StepPlan& plan) {
    for (const scheduler::ScheduledSequence& s : plan.sequences) {
      scheduler::Request* r = s.request;
      r->num_computed += s.num_tokens;
      blocks.CommitComputed(r->blocks, r->tokens, r->num_computed);
      if (r->num_computed == r->num_tokens())
        r->tokens.push_back(3 + static_cast<int32_t>(rng() % 500));
    }
  };
  for (int i = 0; i < 1000; ++i) {
    scheduler::StepPlan plan = policy.Plan(pool, Clock::now());
    const bool steady =
        static_cast<int>(plan.sequences.size()) == num_seqs && plan.num_tokens() == num_seqs;
    apply(plan);
    if (steady) break;
  }
  for (int i = 0; i < kWarmupSteps; ++i) apply(policy.Plan(pool, Clock::now()));

  std::vector<double> times;
  times.reserve(state.max_iterations);
  int odd = 0;
  for (auto _ : state) {
    const Clock::time_point start = Clock::now();
    scheduler::StepPlan plan = policy.Plan(pool, start);
    const Clock::time_point end = Clock::now();
    benchmark::DoNotOptimize(plan);
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    times.push_back(Micros(end - start));
    if (plan.num_tokens() != num_seqs || !plan.preempted.empty()) ++odd;
    apply(plan);
  }
  const Dist d = Summarize(times);
  ReportDist(state, d);
  if (odd > 0) state.SkipWithError("plans left steady decoding");
  Record("plan/" + std::to_string(num_seqs), {{"mean", d.mean}, {"p50", d.p50}, {"p99", d.p99}});
}

// --- step_rpc: WorkerGroup::Step to a real worker on loopback -------------------------

struct RpcFixture {
  std::optional<testing::Subprocess> process;  // The conveyor-worker.
  std::unique_ptr<scheduler::WorkerGroup> group;
  scheduler::WorkerGroup::Info info;
  uint64_t next_step_id = 1;
  uint64_t next_seq_id = 1;
};

std::unique_ptr<RpcFixture> g_rpc;

RpcFixture& GetRpc() {
  if (g_rpc == nullptr) {
    g_rpc = std::make_unique<RpcFixture>();  // Global at once, so that Die() reaps the child.
    RpcFixture* f = g_rpc.get();
    std::optional<testing::Subprocess> started = testing::Subprocess::Start(
        {g_flags.worker_bin, "--port=0", "--metrics_port=0", "--log_level=warn",
         "--threads=" + std::to_string(g_flags.worker_threads)});
    if (!started) Die("cannot start " + g_flags.worker_bin);
    f->process.emplace(std::move(*started));
    const std::optional<std::string> line = f->process->WaitForLine("listening on ", 30s);
    if (!line) Die("the worker printed no \"listening on\" line (" + g_flags.worker_bin + ")");
    f->process->DrainStdout();
    const int port = testing::PortFromListeningLine(*line);
    if (port < 0) Die("no port in the worker's line: " + *line);
    const std::string address = "127.0.0.1:" + std::to_string(port);
    scheduler::WorkerGroup::Options options;
    options.addresses = {address};
    // A worker serves only calls that name its scheduler.
    options.scheduler_id = "scheduler_bench";
    options.model_path = g_flags.model_dir;
    options.block_size = kBlockSize;
    options.kv_cache_bytes = 64ull << 20;
    options.max_num_seqs = 64;
    f->group = std::make_unique<scheduler::WorkerGroup>(options);
    auto info = f->group->Initialize(std::chrono::system_clock::now() + 60s);
    if (!info.ok()) Die("worker Init: " + info.status().ToString());
    f->info = *info;
  }
  return *g_rpc;
}

// Asks the worker to exit and reaps it (killed if it has not exited within 2 s).
void ShutdownRpc() {
  if (g_rpc == nullptr) return;
  g_rpc->group->ShutdownWorkers();
  g_rpc->process->Wait(2s);
  g_rpc.reset();
}

// Batch-64 decode on the worker: 64 sequences of 32-token prompts, 1 token each per
// step, a new block when a sequence crosses a block boundary. Every kRecycle decode steps
// the sequences are dropped and fresh ones prefilled (outside the timing), so the context
// (and the worker's attention time) stays small.
class DecodeBatch {
 public:
  static constexpr int kSeqs = 64;
  static constexpr int kPrompt = 32;
  static constexpr int kRecycle = 128;

  explicit DecodeBatch(RpcFixture* f) : f_(f) {
    const int need = kSeqs * ((kPrompt + kRecycle + 2 + kBlockSize - 1) / kBlockSize);
    if (f_->info.num_kv_blocks < need) Die("the worker has too few KV blocks");
  }

  // A prefill step that (re)starts the batch, dropping the previous one.
  wv1::StepRequest Recycle() {
    wv1::StepRequest step;
    step.set_step_id(f_->next_step_id++);
    for (const Seq& s : seqs_) step.add_dropped_seq_ids(s.id);
    seqs_.assign(kSeqs, Seq{});
    next_block_ = 0;
    std::mt19937 rng(static_cast<uint32_t>(f_->next_seq_id));
    const int vocab = f_->info.model.vocab_size();
    for (Seq& s : seqs_) {
      s.id = f_->next_seq_id++;
      wv1::NewSequence* n = step.add_new_sequences();
      n->set_seq_id(s.id);
      for (int k = 0; k < kPrompt; ++k)
        n->add_token_ids(3 + static_cast<int32_t>(rng() % (vocab - 3)));
      n->set_num_tokens(kPrompt);
      for (int b = 0; b < kPrompt / kBlockSize + 1; ++b) n->add_block_ids(next_block_++);
      s.blocks = kPrompt / kBlockSize + 1;
      s.computed = kPrompt;
      wv1::SamplingParams* p = n->mutable_sampling();
      p->set_temperature(0.7f);
      p->set_top_p(0.9f);
      p->set_seed(s.id);
    }
    decodes_ = 0;
    return step;
  }

  bool NeedsRecycle() const { return seqs_.empty() || decodes_ >= kRecycle; }

  wv1::StepRequest Decode() {
    wv1::StepRequest step;
    step.set_step_id(f_->next_step_id++);
    for (Seq& s : seqs_) {
      wv1::RunningSequence* r = step.add_running();
      r->set_seq_id(s.id);
      r->set_num_tokens(1);
      if (s.computed + 1 > s.blocks * kBlockSize) {
        r->add_new_block_ids(next_block_++);
        ++s.blocks;
      }
      ++s.computed;
    }
    ++decodes_;
    return step;
  }

 private:
  struct Seq {
    uint64_t id = 0;
    int computed = 0;
    int blocks = 0;
  };
  RpcFixture* f_;
  std::vector<Seq> seqs_;
  int32_t next_block_ = 0;
  int decodes_ = 0;
};

// decode64: the batch-64 decode shape; else an empty step. idle: wait `idle` between
// steps (as the scheduler does while a real step runs), to see whether the round trip
// grows when the channel's threads have gone idle.
void BM_StepRpc(benchmark::State& state, bool decode64, std::chrono::microseconds idle,
                const std::string& name) {
  RpcFixture& f = GetRpc();
  DecodeBatch batch(&f);
  auto run = [&](const wv1::StepRequest& step) {
    auto response = f.group->Step(step);
    if (!response.ok()) Die("step: " + response.status().ToString());
    return std::move(*response);
  };
  // Warm up the channel (and the worker's buffers for this shape).
  for (int i = 0; i < 20; ++i) {
    if (decode64) {
      if (batch.NeedsRecycle()) run(batch.Recycle());
      run(batch.Decode());
    } else {
      wv1::StepRequest empty;
      empty.set_step_id(f.next_step_id++);
      run(empty);
    }
  }

  std::vector<double> rtt, worker_total, forward, overhead;
  rtt.reserve(state.max_iterations);
  size_t request_bytes = 0, response_bytes = 0;
  for (auto _ : state) {
    wv1::StepRequest step;
    if (decode64) {
      if (batch.NeedsRecycle()) run(batch.Recycle());
      step = batch.Decode();
    } else {
      step.set_step_id(f.next_step_id++);
    }
    if (idle.count() > 0) std::this_thread::sleep_for(idle);
    const Clock::time_point start = Clock::now();
    auto response = f.group->Step(step);
    const Clock::time_point end = Clock::now();
    if (!response.ok()) Die("step: " + response.status().ToString());
    if (decode64 && response->tokens_size() != DecodeBatch::kSeqs) Die("odd decode response");
    state.SetIterationTime(std::chrono::duration<double>(end - start).count());
    const double rt = Micros(end - start);
    const double total = response->timings().total_ms() * 1000;
    rtt.push_back(rt);
    worker_total.push_back(total);
    forward.push_back(response->timings().forward_ms() * 1000);
    overhead.push_back(rt - total);
    request_bytes = step.ByteSizeLong();
    response_bytes = response->ByteSizeLong();
  }
  const Dist d = Summarize(rtt), w = Summarize(worker_total), fw = Summarize(forward),
             o = Summarize(overhead);
  ReportDist(state, d);
  state.counters["fwd_p50_us"] = fw.p50;
  state.counters["wrk_p50_us"] = w.p50;
  state.counters["ovh_p50_us"] = o.p50;
  state.counters["ovh_p99_us"] = o.p99;
  state.counters["req_B"] = static_cast<double>(request_bytes);
  state.counters["resp_B"] = static_cast<double>(response_bytes);
  Record(name, {{"p50", d.p50},
                {"p99", d.p99},
                {"mean", d.mean},
                {"worker_p50", w.p50},
                {"forward_p50", fw.p50},
                {"ovh_p50", o.p50},
                {"ovh_p99", o.p99},
                {"ovh_mean", o.mean}});
}

// --- Flags, the tiny model, the summary -----------------------------------------------

// Takes this benchmark's flags out of argv (leaving Google Benchmark's).
void ParseFlags(int* argc, char** argv) {
  int out = 1;
  bool quick = false;
  for (int i = 1; i < *argc; ++i) {
    std::string arg = argv[i];
    std::string name = arg, value;
    if (const size_t eq = arg.find('='); eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
    }
    std::replace(name.begin() + std::min<size_t>(2, name.size()), name.end(), '-', '_');
    auto need_value = [&]() -> std::string {
      if (!value.empty() || arg.find('=') != std::string::npos) return value;
      if (i + 1 >= *argc) Die(name + " needs a value");
      return argv[++i];
    };
    auto as_int = [&](const std::string& v) {
      int x;
      if (!absl::SimpleAtoi(v, &x) || x < 1) {
        Die(absl::StrCat(name, " wants a positive integer, got ", v));
      }
      return x;
    };
    if (name == "--model") {
      g_flags.model_dir = need_value();
    } else if (name == "--worker") {
      g_flags.worker_bin = need_value();
    } else if (name == "--worker_threads") {
      g_flags.worker_threads = as_int(need_value());
    } else if (name == "--small_step_ms") {
      const std::string v = need_value();
      if (!absl::SimpleAtod(v, &g_flags.small_step_ms) || g_flags.small_step_ms <= 0) {
        Die("--small_step_ms wants a positive number, got " + v);
      }
    } else if (name == "--steps") {
      g_flags.steps = as_int(need_value());
    } else if (name == "--rpc_steps") {
      g_flags.rpc_steps = as_int(need_value());
    } else if (name == "--quick") {
      quick = true;
    } else if (name == "--no_rpc") {
      g_flags.rpc = false;
    } else if (name == "--no_metrics") {
      g_flags.metrics = false;
    } else {
      argv[out++] = argv[i];
    }
  }
  *argc = out;
  if (quick) {
    g_flags.steps = std::min(g_flags.steps, 300);
    g_flags.rpc_steps = std::min(g_flags.rpc_steps, 500);
  }
}

// Makes the tiny test model in a temporary folder when --model is not given.
void EnsureModel() {
  if (!g_flags.model_dir.empty()) {
    if (!std::filesystem::exists(g_flags.model_dir + "/tokenizer.model")) {
      Die("no tokenizer.model in --model=" + g_flags.model_dir);
    }
    return;
  }
  const std::string dir = (std::filesystem::temp_directory_path() /
                           ("conveyor_scheduler_bench_tiny_" + std::to_string(getpid())))
                              .string();
  const std::string command = "/usr/bin/python3 " CONVEYOR_SOURCE_DIR
                              "/tests/model_gen/make_test_model.py --preset tiny --out '" +
                              dir + "' >/dev/null";
  std::fprintf(stderr, "scheduler_bench: making the tiny model in %s\n", dir.c_str());
  if (std::system(command.c_str()) != 0) Die("making the tiny model failed: " + command);
  g_flags.model_dir = dir;
  std::atexit([] {
    std::error_code ignored;
    std::filesystem::remove_all(g_flags.model_dir, ignored);
  });
}

double Result(const std::string& name, const std::string& key) {
  auto it = g_results.find(name);
  if (it == g_results.end()) return -1;
  auto jt = it->second.find(key);
  return jt == it->second.end() ? -1 : jt->second;
}

void PrintSummary() {
  std::printf("\nSummary (µs; scheduler = one engine iteration without the worker)\n");
  for (int n : kSequenceCounts) {
    const std::string e = "engine_iteration/" + std::to_string(n), p = "plan/" + std::to_string(n);
    if (Result(e, "mean") < 0) continue;
    std::printf(
        "  %4d seqs: iteration mean %8.1f p50 %8.1f p99 %8.1f (%.2f/seq); plan alone "
        "mean %7.1f p50 %7.1f; StepRequest %.0f B\n",
        n, Result(e, "mean"), Result(e, "p50"), Result(e, "p99"), Result(e, "mean") / n,
        Result(p, "mean"), Result(p, "p50"), Result(e, "bytes"));
  }
  for (const char* name : {"step_rpc/empty", "step_rpc/empty_idle3ms", "step_rpc/decode64"}) {
    if (Result(name, "p50") < 0) continue;
    std::printf(
        "  %-17s round trip p50 %7.1f p99 %7.1f; worker total p50 %7.1f (forward "
        "%.1f); RPC overhead p50 %7.1f p99 %7.1f\n",
        name, Result(name, "p50"), Result(name, "p99"), Result(name, "worker_p50"),
        Result(name, "forward_p50"), Result(name, "ovh_p50"), Result(name, "ovh_p99"));
  }
  const double sched = Result("engine_iteration/64", "mean");
  const double rpc = Result("step_rpc/decode64", "ovh_mean");
  if (sched < 0 || rpc < 0) {
    std::printf("  (run engine_iteration/64 and step_rpc/decode64 for the overhead line)\n");
    return;
  }
  const double total_us = sched + rpc;
  const double total_p50_us =
      Result("engine_iteration/64", "p50") + Result("step_rpc/decode64", "ovh_p50");
  std::printf(
      "  batch 64 overhead per step: scheduler %.1f + RPC %.1f = %.1f µs (means; p50s: "
      "%.1f); 3 %% of a step needs a step of >= %.2f ms\n",
      sched, rpc, total_us, total_p50_us, total_us / 0.03 / 1000);
  if (g_flags.small_step_ms > 0) {
    const double pct = 100.0 * total_us / (g_flags.small_step_ms * 1000);
    const double pct_p50 = 100.0 * total_p50_us / (g_flags.small_step_ms * 1000);
    std::printf(
        "OVERHEAD: scheduling + RPC at batch 64 = %.1f µs = %.2f %% (p50s: %.2f %%) of the "
        "small model's batch-64 decode step (%.2f ms); target <= 3 %%: %s\n",
        total_us, pct, pct_p50, g_flags.small_step_ms, pct <= 3.0 ? "PASS" : "FAIL");
  } else {
    std::printf(
        "  (pass --small_step_ms=X, the small model's decode b=64 ms/step from "
        "bench/run_worker_bench.sh, for the percentage)\n");
  }
}

int Main(int argc, char** argv) {
  ParseFlags(&argc, argv);
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  spdlog::set_level(spdlog::level::warn);  // Finish logs each request at info.
  EnsureModel();

  for (int n : kSequenceCounts) {
    benchmark::RegisterBenchmark(("engine_iteration/" + std::to_string(n)).c_str(),
                                 [n](benchmark::State& s) { BM_EngineIteration(s, n); })
        ->UseManualTime()
        ->Iterations(g_flags.steps)
        ->Unit(benchmark::kMicrosecond);
  }
  for (int n : kSequenceCounts) {
    benchmark::RegisterBenchmark(("plan/" + std::to_string(n)).c_str(),
                                 [n](benchmark::State& s) { BM_Plan(s, n); })
        ->UseManualTime()
        ->Iterations(g_flags.steps)
        ->Unit(benchmark::kMicrosecond);
  }
  if (g_flags.rpc) {
    struct RpcCase {
      const char* name;
      bool decode64;
      std::chrono::microseconds idle;
    };
    for (const RpcCase& c :
         {RpcCase{"step_rpc/empty", false, 0us}, RpcCase{"step_rpc/empty_idle3ms", false, 3000us},
          RpcCase{"step_rpc/decode64", true, 0us}}) {
      const std::string name = c.name;
      benchmark::RegisterBenchmark(
          c.name, [c, name](benchmark::State& s) { BM_StepRpc(s, c.decode64, c.idle, name); })
          ->UseManualTime()
          ->Iterations(c.idle.count() > 0 ? std::max(1, g_flags.rpc_steps / 4) : g_flags.rpc_steps)
          ->Unit(benchmark::kMicrosecond);
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  ShutdownRpc();
  PrintSummary();
  benchmark::Shutdown();
  return 0;
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) { return conveyor::bench::Main(argc, argv); }
