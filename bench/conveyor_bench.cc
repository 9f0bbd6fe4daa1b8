// conveyor-bench: load generator and latency/throughput report for a conveyor-scheduler.
//
// Many concurrent Generate streams are driven from a few threads with gRPC's callback
// API. Arrivals are either a closed loop (--concurrency N clients, each sending its next
// request when the previous one ends) or an open loop (--request_rate R req/s, gaps drawn
// from a Gamma distribution of shape --burstiness; 1 = Poisson; inf = all at once).
// Prompts are random token ids in [3, vocab) and generation ignores EOS, so every
// request's prompt and output lengths are exactly what the (seeded) workload says.
//
//   conveyor-bench --server=127.0.0.1:50051 --metrics_port=9400
//       --workload=exponential --num_requests=200 --request_rate=2 --out=run.json
//
// Per request it records the queue time (from the final usage), TTFT, every inter-token
// gap, E2E and the token counts; it reports request/s, output and total tok/s,
// mean/p50/p90/p99 of TTFT, TPOT, ITL and E2E, goodput under --slo_* and, when the
// scheduler's metrics endpoint is given, the server counters of the run: the bubble
// (wasted / total batch slot-steps), mean tokens per step, KV slots used / allocated
// (sampled during the run; steady-state mean) and preemptions.
//
// The parts are in bench/load/: the workload (workload.h), the load generator over
// either API (load_generator.h), the metrics endpoint (server_metrics.h) and the
// statistics (stats.h). This file holds the flags and the report.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "bench/load/load_generator.h"
#include "bench/load/server_metrics.h"
#include "bench/load/stats.h"
#include "bench/load/workload.h"
#include "conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

ABSL_FLAG(std::string, server, "127.0.0.1:50051", "host:port of the conveyor-scheduler.");
ABSL_FLAG(std::string, api, "grpc",
          "grpc: Generate streams; http: streamed /v1/completions on --http_server (the "
          "OpenAI-compatible API; --server still answers model info and the warm-up).");
ABSL_FLAG(std::string, http_server, "", "--api=http: host:port of the scheduler's HTTP API.");
ABSL_FLAG(std::string, metrics_url, "",
          "The scheduler's Prometheus endpoint, e.g. http://127.0.0.1:9400/metrics (empty: "
          "from --metrics_port; neither: no server counters).");
ABSL_FLAG(int, metrics_port, 0, "The scheduler's metrics port on --server's host (0: none).");
ABSL_FLAG(double, metrics_interval_s, 0.5, "How often gauges are sampled during the run.");
ABSL_FLAG(double, steady_state_trim, 0.15,
          "Fraction of the run ignored at each end when averaging sampled gauges.");

ABSL_FLAG(std::string, workload, "exponential",
          "fixed | uniform | exponential | chat. fixed: --input_len/--output_len; uniform: "
          "--input_len_range/--output_len_range; exponential: --input_len prompts and "
          "exponential outputs of mean --output_mean capped at --output_cap; chat: log-normal "
          "prompt and output lengths (--chat_*).");
ABSL_FLAG(int, num_requests, 100, "Requests in the run.");
ABSL_FLAG(uint64_t, seed, 1, "Seeds the workload (lengths, prompt ids, arrivals, sampling).");
ABSL_FLAG(int, input_len, 512, "fixed/exponential: prompt tokens.");
ABSL_FLAG(std::string, prompts_file, "",
          "Prompts to send instead of random ids: one per line, token ids separated by "
          "spaces; request i sends line i mod lines (output lengths still from --workload). "
          "bench/make_grounded_prompts.py writes such a file.");
ABSL_FLAG(int, output_len, 128, "fixed: output tokens.");
ABSL_FLAG(std::string, input_len_range, "128:1024", "uniform: prompt tokens MIN:MAX.");
ABSL_FLAG(std::string, output_len_range, "16:256", "uniform: output tokens MIN:MAX.");
ABSL_FLAG(double, output_mean, 128, "exponential: mean output tokens (before the cap).");
ABSL_FLAG(int, output_cap, 1024, "exponential: most output tokens.");
ABSL_FLAG(double, chat_input_median, 256, "chat: median prompt tokens.");
ABSL_FLAG(double, chat_input_sigma, 0.8, "chat: sigma of log(prompt tokens).");
ABSL_FLAG(double, chat_output_median, 128, "chat: median output tokens.");
ABSL_FLAG(double, chat_output_sigma, 0.8, "chat: sigma of log(output tokens).");
ABSL_FLAG(int, chat_max_input, 2048, "chat: most prompt tokens.");
ABSL_FLAG(int, chat_max_output, 1024, "chat: most output tokens.");
ABSL_FLAG(bool, ignore_eos, true, "Generate exactly the drawn output length.");
ABSL_FLAG(double, temperature, 0, "Sampling temperature (0: greedy).");
ABSL_FLAG(std::string, json_schema, "",
          "Constrain every output to this JSON Schema (JSON text; structured output). "
          "Turns ignore_eos off: choose a schema longer than the outputs.");

ABSL_FLAG(int, concurrency, 0, "Closed loop: this many clients (0: open loop).");
ABSL_FLAG(std::string, request_rate, "inf",
          "Open loop: requests per second, or inf (all at once).");
ABSL_FLAG(double, burstiness, 1.0,
          "Open loop: shape of the Gamma inter-arrival distribution (1 = Poisson, <1 burstier).");
ABSL_FLAG(int, max_concurrency, 0, "Open loop: most requests in flight (0: no limit).");
ABSL_FLAG(double, timeout_s, 0,
          "Stop the run after this many seconds: unfinished requests are cancelled and "
          "reported as incomplete (0: no limit).");
ABSL_FLAG(int, warmup_requests, 2, "Short requests sent one by one before the run.");
ABSL_FLAG(double, wait_for_server_s, 120, "How long to wait for the server to become ready.");
ABSL_FLAG(int, channels, 4, "gRPC connections the streams are spread over.");

ABSL_FLAG(double, slo_ttft_ms, 0, "Goodput SLO on TTFT (0: none).");
ABSL_FLAG(double, slo_tpot_ms, 0, "Goodput SLO on TPOT (0: none).");
ABSL_FLAG(double, slo_e2e_ms, 0, "Goodput SLO on E2E latency (0: none).");

ABSL_FLAG(std::string, out, "", "Write the results as JSON to this file.");
ABSL_FLAG(std::string, label, "", "Free text stored in the JSON (e.g. the policy).");
ABSL_FLAG(bool, save_requests, true, "Store per-request records in the JSON.");
ABSL_FLAG(bool, save_itl, false, "Store every inter-token gap in the per-request records.");
ABSL_FLAG(bool, quiet, false, "No progress lines.");

namespace {

namespace v1 = conveyor::v1;
using conveyor::bench::Clock;
using json = nlohmann::json;
using namespace conveyor::bench;  // NOLINT(google-build-using-namespace): the bench's own parts.

WorkloadOptions WorkloadFromFlags() {
  WorkloadOptions o;
  o.kind = absl::GetFlag(FLAGS_workload);
  o.num_requests = absl::GetFlag(FLAGS_num_requests);
  o.seed = absl::GetFlag(FLAGS_seed);
  o.input_len = absl::GetFlag(FLAGS_input_len);
  o.output_len = absl::GetFlag(FLAGS_output_len);
  o.input_len_range = absl::GetFlag(FLAGS_input_len_range);
  o.output_len_range = absl::GetFlag(FLAGS_output_len_range);
  o.output_mean = absl::GetFlag(FLAGS_output_mean);
  o.output_cap = absl::GetFlag(FLAGS_output_cap);
  o.chat_input_median = absl::GetFlag(FLAGS_chat_input_median);
  o.chat_input_sigma = absl::GetFlag(FLAGS_chat_input_sigma);
  o.chat_output_median = absl::GetFlag(FLAGS_chat_output_median);
  o.chat_output_sigma = absl::GetFlag(FLAGS_chat_output_sigma);
  o.chat_max_input = absl::GetFlag(FLAGS_chat_max_input);
  o.chat_max_output = absl::GetFlag(FLAGS_chat_max_output);
  return o;
}

// --prompts_file: one prompt a line, token ids separated by spaces, each id below
// `vocab_size`. False, with `*error` naming the line, for anything else.
bool ReadPrompts(const std::string& path, int vocab_size,
                 std::vector<std::vector<int32_t>>* prompts, std::string* error) {
  std::ifstream in(path);
  if (!in) {
    *error = "cannot read the file";
    return false;
  }
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    std::vector<int32_t> ids;
    for (absl::string_view word : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
      int32_t id = 0;
      if (!absl::SimpleAtoi(word, &id) || id < 0 || id >= vocab_size) {
        *error = "line " + std::to_string(number) + ": '" + std::string(word) +
                 "' is not a token id below the vocabulary size " + std::to_string(vocab_size);
        return false;
      }
      ids.push_back(id);
    }
    if (!ids.empty()) prompts->push_back(std::move(ids));
  }
  if (prompts->empty()) *error = "no prompt in the file";
  return !prompts->empty();
}

// The load's options; false, with a line, for a bad --request_rate.
bool LoadFromFlags(LoadOptions* o) {
  o->ignore_eos = absl::GetFlag(FLAGS_ignore_eos);
  o->temperature = absl::GetFlag(FLAGS_temperature);
  o->json_schema = absl::GetFlag(FLAGS_json_schema);
  o->concurrency = absl::GetFlag(FLAGS_concurrency);
  o->burstiness = absl::GetFlag(FLAGS_burstiness);
  o->seed = absl::GetFlag(FLAGS_seed);
  o->max_concurrency = absl::GetFlag(FLAGS_max_concurrency);
  o->timeout_s = absl::GetFlag(FLAGS_timeout_s);
  o->request_rate = std::numeric_limits<double>::infinity();
  const std::string r = absl::GetFlag(FLAGS_request_rate);
  if (r != "inf" && (!absl::SimpleAtod(r, &o->request_rate) || o->request_rate <= 0)) {
    std::fprintf(stderr, "conveyor-bench: --request_rate must be > 0 or inf\n");
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Benchmarks a conveyor-scheduler with many concurrent streaming requests.\n"
      "Usage: conveyor-bench --server=HOST:PORT [--metrics_port=P] [--workload=...] "
      "[--concurrency=N | --request_rate=R] [--out=FILE]");
  absl::ParseCommandLine(argc, argv);
  const std::string server = absl::GetFlag(FLAGS_server);

  std::vector<std::shared_ptr<grpc::Channel>> channels;
  for (int i = 0; i < std::max(1, absl::GetFlag(FLAGS_channels)); ++i) {
    grpc::ChannelArguments args;
    args.SetInt("conveyor.bench.channel", i);  // Distinct args: distinct connections.
    args.SetMaxReceiveMessageSize(64 << 20);
    channels.push_back(grpc::CreateCustomChannel(server, grpc::InsecureChannelCredentials(), args));
  }
  auto info_stub = v1::Conveyor::NewStub(channels[0]);
  std::optional<v1::ModelInfoResponse> info =
      WaitForServer(info_stub.get(), absl::GetFlag(FLAGS_wait_for_server_s));
  if (!info) return 1;
  std::fprintf(stderr,
               "conveyor-bench: %s on %s: policy %s, max_num_seqs %d, vocab %d, context %d, KV "
               "%d blocks x %d\n",
               info->model().c_str(), server.c_str(), info->policy().c_str(), info->max_num_seqs(),
               info->vocab_size(), info->max_context_tokens(), info->num_kv_blocks(),
               info->kv_block_size());
  if (!Warmup(info_stub.get(), absl::GetFlag(FLAGS_warmup_requests), info->vocab_size())) {
    return 1;
  }

  std::string error;
  WorkloadOptions workload = WorkloadFromFlags();
  if (const std::string path = absl::GetFlag(FLAGS_prompts_file); !path.empty()) {
    if (!ReadPrompts(path, info->vocab_size(), &workload.prompts, &error)) {
      std::fprintf(stderr, "conveyor-bench: --prompts_file=%s: %s\n", path.c_str(), error.c_str());
      return 2;
    }
  }
  const std::vector<RequestSpec> specs =
      MakeWorkload(workload, info->vocab_size(), info->max_context_tokens(), &error);
  if (!error.empty()) {
    std::fprintf(stderr, "conveyor-bench: %s\n", error.c_str());
    return 2;
  }
  int64_t requested_out = 0, prompt_total = 0;
  for (const RequestSpec& s : specs) {
    requested_out += s.max_new_tokens;
    prompt_total += static_cast<int64_t>(s.prompt.size());
  }

  const MetricsUrl murl =
      ParseMetricsUrl(absl::GetFlag(FLAGS_metrics_url), server, absl::GetFlag(FLAGS_metrics_port));
  std::optional<MetricMap> before;
  if (murl.valid()) {
    if (auto text = HttpGet(murl)) {
      before = ParseMetrics(*text);
    } else {
      std::fprintf(stderr, "conveyor-bench: cannot read http://%s:%s%s; no server counters\n",
                   murl.host.c_str(), murl.port.c_str(), murl.path.c_str());
    }
  }

  const std::string api = absl::GetFlag(FLAGS_api);
  if ((api != "grpc" && api != "http") ||
      (api == "http" && absl::GetFlag(FLAGS_http_server).empty())) {
    std::fprintf(stderr, "conveyor-bench: --api must be grpc or http (with --http_server)\n");
    return 2;
  }
  LoadOptions load;
  if (!LoadFromFlags(&load)) return 2;
  LoadGenerator bench(load, channels, api == "http" ? absl::GetFlag(FLAGS_http_server) : "");
  std::vector<GaugeSample> samples;
  std::mutex samples_mu;
  std::atomic<bool> stop_monitor{false};
  const Clock::time_point start = Clock::now();
  const bool quiet = absl::GetFlag(FLAGS_quiet);
  const int total = static_cast<int>(specs.size());

  // Samples the scheduler's gauges and prints one progress line a second.
  std::thread monitor([&] {
    const double interval = std::max(0.05, absl::GetFlag(FLAGS_metrics_interval_s));
    Clock::time_point next_sample = start, next_print = start + std::chrono::seconds(1);
    int64_t last_tokens = 0;
    GaugeSample last{};
    while (!stop_monitor.load()) {
      const Clock::time_point now = Clock::now();
      if (before && now >= next_sample) {
        if (auto text = HttpGet(murl, 1.0)) {
          const GaugeSample g = SampleGauges(ParseMetrics(*text), SecondsSince(start, now));
          last = g;
          std::lock_guard<std::mutex> lock(samples_mu);
          samples.push_back(g);
        }
        next_sample += std::chrono::microseconds(static_cast<int64_t>(interval * 1e6));
        if (next_sample < now) next_sample = now;
      }
      if (!quiet && now >= next_print) {
        int sent, finished, failed, in_flight;
        bench.Counts(&sent, &finished, &failed, &in_flight);
        const int64_t tokens = bench.tokens_received();
        const double elapsed = SecondsSince(start, now);
        char server_part[160] = "";
        if (before) {
          std::snprintf(
              server_part, sizeof(server_part), " | server: running %.0f waiting %.0f kv %.0f%%",
              last.running, last.waiting,
              last.kv_blocks_total > 0 ? 100.0 * last.kv_blocks_used / last.kv_blocks_total : 0.0);
        }
        std::fprintf(stderr,
                     "[%5.0fs] sent %d/%d done %d%s in flight %d | out %lld tok (%.1f tok/s, "
                     "last 1s %lld)%s\n",
                     elapsed, sent, total, finished,
                     failed > 0 ? (" (" + std::to_string(failed) + " failed)").c_str() : "",
                     in_flight, static_cast<long long>(tokens), tokens / std::max(1e-9, elapsed),
                     static_cast<long long>(tokens - last_tokens), server_part);
        last_tokens = tokens;
        next_print += std::chrono::seconds(1);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });

  std::vector<RequestResult> results = bench.Run(specs, start);
  const Clock::time_point end = Clock::now();
  stop_monitor = true;
  monitor.join();
  const double duration = SecondsSince(start, end);

  std::optional<MetricMap> after;
  if (before) {
    if (auto text = HttpGet(murl)) after = ParseMetrics(*text);
  }

  // ---- client-side statistics
  std::vector<double> ttft, tpot, itl, e2e, queue;
  int completed = 0, failed = 0, good = 0;
  int64_t out_tokens = 0, in_tokens = 0;
  std::map<std::string, int> errors;
  const double slo_ttft = absl::GetFlag(FLAGS_slo_ttft_ms);
  const double slo_tpot = absl::GetFlag(FLAGS_slo_tpot_ms);
  const double slo_e2e = absl::GetFlag(FLAGS_slo_e2e_ms);
  for (const RequestResult& r : results) {
    out_tokens += r.output_tokens;  // Streamed tokens count even if the request was cut.
    if (!r.ok) {
      ++failed;
      errors[r.error.empty() ? "no final message" : r.error.substr(0, 120)]++;
      continue;
    }
    ++completed;
    in_tokens += r.prompt_tokens;
    if (r.ttft_ms >= 0) ttft.push_back(r.ttft_ms);
    if (r.tpot_ms >= 0) tpot.push_back(r.tpot_ms);
    for (float g : r.itl_ms) itl.push_back(g);
    e2e.push_back(r.e2e_ms);
    queue.push_back(r.server_queue_ms);
    const double tp = r.tpot_ms >= 0 ? r.tpot_ms : 0;
    if ((slo_ttft <= 0 || r.ttft_ms <= slo_ttft) && (slo_tpot <= 0 || tp <= slo_tpot) &&
        (slo_e2e <= 0 || r.e2e_ms <= slo_e2e)) {
      ++good;
    }
  }
  const Stats s_ttft = Summarize(ttft), s_tpot = Summarize(tpot), s_itl = Summarize(itl),
              s_e2e = Summarize(e2e), s_queue = Summarize(queue);

  json out;
  out["label"] = absl::GetFlag(FLAGS_label);
  out["api"] = absl::GetFlag(FLAGS_api);
  out["server"] = {{"address", server},
                   {"model", info->model()},
                   {"policy", info->policy()},
                   {"max_num_seqs", info->max_num_seqs()},
                   {"num_kv_blocks", info->num_kv_blocks()},
                   {"kv_block_size", info->kv_block_size()},
                   {"vocab_size", info->vocab_size()},
                   {"max_context_tokens", info->max_context_tokens()}};
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  out["config"] = {{"workload", absl::GetFlag(FLAGS_workload)},
                   {"num_requests", total},
                   {"seed", absl::GetFlag(FLAGS_seed)},
                   {"arrivals", concurrency > 0 ? "closed" : "open"},
                   {"concurrency", concurrency},
                   {"request_rate", absl::GetFlag(FLAGS_request_rate)},
                   {"burstiness", absl::GetFlag(FLAGS_burstiness)},
                   {"max_concurrency", absl::GetFlag(FLAGS_max_concurrency)},
                   {"input_len", absl::GetFlag(FLAGS_input_len)},
                   {"output_len", absl::GetFlag(FLAGS_output_len)},
                   {"output_mean", absl::GetFlag(FLAGS_output_mean)},
                   {"output_cap", absl::GetFlag(FLAGS_output_cap)},
                   {"input_len_range", absl::GetFlag(FLAGS_input_len_range)},
                   {"output_len_range", absl::GetFlag(FLAGS_output_len_range)},
                   {"ignore_eos", absl::GetFlag(FLAGS_ignore_eos)},
                   {"temperature", absl::GetFlag(FLAGS_temperature)},
                   {"json_schema", absl::GetFlag(FLAGS_json_schema)},
                   {"timeout_s", absl::GetFlag(FLAGS_timeout_s)},
                   {"requested_prompt_tokens", prompt_total},
                   {"requested_output_tokens", requested_out},
                   {"slo_ttft_ms", slo_ttft},
                   {"slo_tpot_ms", slo_tpot},
                   {"slo_e2e_ms", slo_e2e}};
  json summary = {{"duration_s", duration},
                  {"completed", completed},
                  {"failed_or_incomplete", failed},
                  {"request_throughput", completed / duration},
                  {"output_throughput", out_tokens / duration},
                  {"total_throughput", (out_tokens + in_tokens) / duration},
                  {"output_tokens", out_tokens},
                  {"prompt_tokens", in_tokens},
                  {"goodput", good / duration},
                  {"good_requests", good},
                  {"good_fraction", total > 0 ? static_cast<double>(good) / total : 0.0},
                  {"ttft_ms", ToJson(s_ttft)},
                  {"tpot_ms", ToJson(s_tpot)},
                  {"itl_ms", ToJson(s_itl)},
                  {"e2e_ms", ToJson(s_e2e)},
                  {"queue_ms", ToJson(s_queue)}};
  if (!errors.empty()) summary["errors"] = errors;
  out["summary"] = summary;

  if (before && after) {
    std::lock_guard<std::mutex> lock(samples_mu);
    out["server_metrics"] =
        ServerMetricsReport(*before, *after, samples, duration,
                            std::clamp(absl::GetFlag(FLAGS_steady_state_trim), 0.0, 0.49));
  }

  if (absl::GetFlag(FLAGS_save_requests)) {
    json reqs = json::array();
    const bool save_itl = absl::GetFlag(FLAGS_save_itl);
    for (const RequestResult& r : results) {
      reqs.push_back(ToJson(r, save_itl));
    }
    out["requests"] = reqs;
  }

  // ---- report
  auto line = [](const char* name, const Stats& s) {
    std::printf("  %-14s mean %9.1f  p50 %9.1f  p90 %9.1f  p99 %9.1f  (n=%d)\n", name, s.mean,
                s.p50, s.p90, s.p99, s.n);
  };
  std::printf("== conveyor-bench %s: policy %s, workload %s, %s ==\n",
              absl::GetFlag(FLAGS_label).c_str(), info->policy().c_str(),
              absl::GetFlag(FLAGS_workload).c_str(),
              concurrency > 0
                  ? ("closed loop, concurrency " + std::to_string(concurrency)).c_str()
                  : ("open loop, rate " + absl::GetFlag(FLAGS_request_rate) + " req/s").c_str());
  std::printf("  duration %.1f s; %d completed, %d failed/incomplete\n", duration, completed,
              failed);
  for (const auto& [e, count] : errors) std::printf("    %dx %s\n", count, e.c_str());
  std::printf("  throughput     %.3f req/s, %.1f output tok/s, %.1f total tok/s\n",
              completed / duration, out_tokens / duration, (out_tokens + in_tokens) / duration);
  if (slo_ttft > 0 || slo_tpot > 0 || slo_e2e > 0) {
    std::printf("  goodput        %.3f req/s (%d/%d within SLO ttft<=%g tpot<=%g e2e<=%g ms)\n",
                good / duration, good, total, slo_ttft, slo_tpot, slo_e2e);
  }
  std::printf("  latency (ms):\n");
  line("TTFT", s_ttft);
  line("TPOT", s_tpot);
  line("ITL", s_itl);
  line("E2E", s_e2e);
  line("queue (server)", s_queue);
  if (out.contains("server_metrics")) {
    const json& sm = out["server_metrics"];
    std::printf(
        "  server: bubble %.1f%% (%.0f of %.0f slot-steps wasted), %.1f tokens/step, %.1f "
        "slots/step, %.1f ms/step, busy %.0f%%, preemptions %.0f\n",
        100 * sm["bubble"].get<double>(), sm["batch_slot_steps_wasted"].get<double>(),
        sm["batch_slot_steps"].get<double>(), sm["mean_tokens_per_step"].get<double>(),
        sm["mean_batch_slots_per_step"].get<double>(), sm["mean_step_ms"].get<double>(),
        100 * sm["busy_fraction"].get<double>(), sm["preemptions"].get<double>());
    const json& ss = sm["steady_state"];
    std::printf(
        "  steady state: KV slots used/allocated %.3f, KV blocks used %.0f%%, running %.1f, "
        "waiting %.1f (%d samples)\n",
        ss["kv_slots_used_over_allocated"].get<double>(),
        100 * ss["kv_blocks_used_fraction"].get<double>(), ss["requests_running"].get<double>(),
        ss["requests_waiting"].get<double>(), ss["samples"].get<int>());
  }
  std::fflush(stdout);

  const std::string path = absl::GetFlag(FLAGS_out);
  if (!path.empty()) {
    std::ofstream f(path);
    f << out.dump(1) << "\n";
    if (!f) {
      std::fprintf(stderr, "conveyor-bench: cannot write %s\n", path.c_str());
      return 1;
    }
  }
  return failed > 0 ? 3 : 0;
}
