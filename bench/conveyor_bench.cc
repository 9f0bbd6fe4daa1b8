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
#include <arpa/inet.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

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
#include "bench/sse_client.h"
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
using Clock = std::chrono::steady_clock;
using json = nlohmann::json;

double SecondsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}
double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// ---------------------------------------------------------------- workload

struct RequestSpec {
  int index = 0;
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;
  uint64_t seed = 0;
};

bool ParseRange(const std::string& s, int* lo, int* hi) {
  std::vector<std::string> parts = absl::StrSplit(s, ':');
  if (parts.size() != 2 || !absl::SimpleAtoi(parts[0], lo) || !absl::SimpleAtoi(parts[1], hi)) {
    return false;
  }
  return *lo >= 1 && *hi >= *lo;
}

// Draws every request up front from one seeded generator, so a workload is the same
// whatever the server does.
std::vector<RequestSpec> MakeWorkload(int vocab_size, int max_context, std::string* error) {
  const std::string kind = absl::GetFlag(FLAGS_workload);
  const int n = absl::GetFlag(FLAGS_num_requests);
  std::mt19937_64 rng(absl::GetFlag(FLAGS_seed));
  std::vector<RequestSpec> specs;
  int in_lo = 0, in_hi = 0, out_lo = 0, out_hi = 0;
  if (kind == "uniform" && (!ParseRange(absl::GetFlag(FLAGS_input_len_range), &in_lo, &in_hi) ||
                            !ParseRange(absl::GetFlag(FLAGS_output_len_range), &out_lo, &out_hi))) {
    *error = "--input_len_range and --output_len_range must be MIN:MAX with 1 <= MIN <= MAX";
    return {};
  }
  if (kind != "fixed" && kind != "uniform" && kind != "exponential" && kind != "chat") {
    *error = "--workload must be fixed, uniform, exponential or chat";
    return {};
  }
  std::exponential_distribution<double> expo(1.0 / absl::GetFlag(FLAGS_output_mean));
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_int_distribution<int32_t> token(3, std::max(3, vocab_size - 1));
  int clamped = 0;
  for (int i = 0; i < n; ++i) {
    int in = 0, out = 0;
    if (kind == "fixed") {
      in = absl::GetFlag(FLAGS_input_len);
      out = absl::GetFlag(FLAGS_output_len);
    } else if (kind == "uniform") {
      in = std::uniform_int_distribution<int>(in_lo, in_hi)(rng);
      out = std::uniform_int_distribution<int>(out_lo, out_hi)(rng);
    } else if (kind == "exponential") {
      in = absl::GetFlag(FLAGS_input_len);
      out = static_cast<int>(std::ceil(expo(rng)));
      out = std::clamp(out, 1, absl::GetFlag(FLAGS_output_cap));
    } else {
      const double li = absl::GetFlag(FLAGS_chat_input_median) *
                        std::exp(absl::GetFlag(FLAGS_chat_input_sigma) * normal(rng));
      const double lo = absl::GetFlag(FLAGS_chat_output_median) *
                        std::exp(absl::GetFlag(FLAGS_chat_output_sigma) * normal(rng));
      in = std::clamp(static_cast<int>(std::lround(li)), 4, absl::GetFlag(FLAGS_chat_max_input));
      out = std::clamp(static_cast<int>(std::lround(lo)), 1, absl::GetFlag(FLAGS_chat_max_output));
    }
    if (in < 1) in = 1;
    if (in + out > max_context) {
      ++clamped;
      in = std::min(in, max_context - 1);
      out = max_context - in;
    }
    RequestSpec spec;
    spec.index = i;
    spec.max_new_tokens = out;
    spec.seed = rng();
    spec.prompt.resize(in);
    for (int32_t& id : spec.prompt) id = token(rng);
    specs.push_back(std::move(spec));
  }
  if (clamped > 0) {
    std::fprintf(stderr, "conveyor-bench: %d request(s) shortened to the model's context (%d)\n",
                 clamped, max_context);
  }
  return specs;
}

// Arrival offsets (seconds from the start) for the open loop.
std::vector<double> MakeArrivals(int n, double rate, double burstiness, uint64_t seed) {
  std::vector<double> t(n, 0.0);
  if (!std::isfinite(rate)) return t;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);
  // Gamma(shape k, scale 1/(k*rate)) has mean 1/rate; k = 1 is the exponential (Poisson).
  std::gamma_distribution<double> gap(burstiness, 1.0 / (burstiness * rate));
  double now = 0;
  for (int i = 0; i < n; ++i) {
    if (i > 0) now += gap(rng);
    t[i] = now;
  }
  return t;
}

// ---------------------------------------------------------------- metrics endpoint

struct MetricsUrl {
  std::string host;
  std::string port;
  std::string path = "/metrics";
  bool valid() const { return !host.empty(); }
};

MetricsUrl ParseMetricsUrl(const std::string& url, const std::string& server, int port) {
  MetricsUrl m;
  if (!url.empty()) {
    std::string rest = url;
    if (rest.rfind("http://", 0) == 0) rest = rest.substr(7);
    const size_t slash = rest.find('/');
    std::string hostport = rest.substr(0, slash);
    if (slash != std::string::npos) m.path = rest.substr(slash);
    const size_t colon = hostport.rfind(':');
    m.host = hostport.substr(0, colon);
    m.port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  } else if (port > 0) {
    const size_t colon = server.rfind(':');
    m.host = server.substr(0, colon);
    m.port = std::to_string(port);
  }
  if (m.host == "localhost") m.host = "127.0.0.1";
  return m;
}

// GET the endpoint over plain HTTP/1.0; nullopt on any failure.
std::optional<std::string> HttpGet(const MetricsUrl& url, double timeout_s = 2.0) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(url.host.c_str(), url.port.c_str(), &hints, &res) != 0) return std::nullopt;
  int fd = -1;
  for (addrinfo* a = res; a != nullptr; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{};
    tv.tv_sec = static_cast<long>(timeout_s);
    tv.tv_usec = static_cast<long>((timeout_s - tv.tv_sec) * 1e6);
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) == 0) break;
    close(fd);
    fd = -1;
  }
  freeaddrinfo(res);
  if (fd < 0) return std::nullopt;
  const std::string req =
      "GET " + url.path + " HTTP/1.0\r\nHost: " + url.host + "\r\nConnection: close\r\n\r\n";
  if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return std::nullopt;
  }
  std::string response;
  char buf[16384];
  for (;;) {
    const ssize_t got = recv(fd, buf, sizeof(buf), 0);
    if (got < 0) {
      close(fd);
      return std::nullopt;
    }
    if (got == 0) break;
    response.append(buf, got);
  }
  close(fd);
  const size_t body = response.find("\r\n\r\n");
  if (response.rfind("HTTP/1.", 0) != 0 || body == std::string::npos ||
      response.find(" 200") > response.find("\r\n")) {
    return std::nullopt;
  }
  return response.substr(body + 4);
}

// Prometheus text -> metric name (series name without labels) -> value summed over its
// label sets (e.g. requests_finished_total over every reason).
using MetricMap = std::map<std::string, double>;

MetricMap ParseMetrics(const std::string& text) {
  MetricMap m;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (line.empty() || line[0] == '#') continue;
    const size_t brace = line.find('{');
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    const size_t name_end = std::min(brace, line.find(' '));
    std::string name(line.substr(0, name_end));
    if (brace != absl::string_view::npos) {
      // Skip histogram buckets: their sum over `le` means nothing.
      if (line.substr(brace).find("le=\"") != absl::string_view::npos) continue;
    }
    absl::string_view value = line.substr(space + 1);
    double v = 0;
    if (!absl::SimpleAtod(value, &v)) {
      // A timestamp may follow the value.
      std::vector<absl::string_view> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() < 2 || !absl::SimpleAtod(parts[parts.size() - 2], &v)) continue;
    }
    m[name] += v;
  }
  return m;
}

double Get(const MetricMap& m, const std::string& name) {
  auto it = m.find(name);
  return it == m.end() ? 0.0 : it->second;
}

struct GaugeSample {
  double t = 0;  // Seconds since the run's start.
  double running = 0, waiting = 0;
  double kv_blocks_used = 0, kv_blocks_total = 0;
  double kv_slots_used = 0, kv_slots_allocated = 0;
};

// ---------------------------------------------------------------- the client

struct RequestResult {
  int index = 0;
  int prompt_tokens = 0;
  int requested_tokens = 0;
  bool ok = false;
  bool finished_normally = false;  // Got a final message with usage.
  std::string error;
  std::string finish_reason;
  double start_s = 0;  // Send time, seconds since the run's start.
  double ttft_ms = -1;
  double e2e_ms = -1;
  double tpot_ms = -1;
  int output_tokens = 0;
  double server_queue_ms = -1;
  double server_ttft_ms = -1;
  double server_e2e_ms = -1;
  int preemptions = 0;
  int cached_prompt_tokens = 0;
  std::vector<float> itl_ms;
};

class Bench;

// One request in flight, over either API.
class Call {
 public:
  virtual ~Call() = default;
  virtual void Cancel() = 0;
  virtual const RequestResult& result() const = 0;
};

class GenerateCall final : public Call, public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(Bench* bench, const RequestSpec& spec) : bench_(bench) {
    result_.index = spec.index;
    result_.prompt_tokens = static_cast<int>(spec.prompt.size());
    result_.requested_tokens = spec.max_new_tokens;
    request_.mutable_token_ids()->mutable_ids()->Add(spec.prompt.begin(), spec.prompt.end());
    request_.set_max_new_tokens(spec.max_new_tokens);
    request_.set_ignore_eos(absl::GetFlag(FLAGS_ignore_eos));
    request_.set_temperature(static_cast<float>(absl::GetFlag(FLAGS_temperature)));
    request_.set_seed(spec.seed);
    request_.set_request_id("bench-" + std::to_string(spec.index));
  }

  void Start(v1::Conveyor::Stub* stub, Clock::time_point run_start);
  void Cancel() override {
    if (!done_.load()) context_.TryCancel();
  }
  bool done() const { return done_.load(); }
  const RequestResult& result() const override { return result_; }

  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

 private:
  Bench* bench_;
  grpc::ClientContext context_;
  v1::GenerateRequest request_;
  v1::GenerateResponse response_;
  RequestResult result_;
  Clock::time_point sent_, last_token_;
  std::atomic<bool> done_{false};
};

// One request over the OpenAI-compatible HTTP API (--api=http): a streamed /v1/completions
// on a connection and thread of its own. Chunks carry no token counts: each chunk with
// text counts as one token for TTFT and the gaps (the server sends a chunk per token
// unless text is held back for a stop string), and the final usage gives the total.
class HttpCall final : public Call {
 public:
  HttpCall(Bench* bench, const RequestSpec& spec);
  ~HttpCall() override {
    if (thread_.joinable()) thread_.join();
  }
  void Start(const std::string& host, const std::string& port, Clock::time_point run_start);
  void Cancel() override { stream_.Cancel(); }
  const RequestResult& result() const override { return result_; }

 private:
  void OnEvent(std::string_view data);

  Bench* bench_;
  std::string body_;
  RequestResult result_;
  Clock::time_point sent_, last_token_;
  int chunks_ = 0;
  conveyor::bench::SseStream stream_;
  std::thread thread_;
};

class Bench {
 public:
  // `http_server`: host:port of the HTTP API, for --api=http (empty: gRPC streams).
  Bench(const std::vector<std::shared_ptr<grpc::Channel>>& channels,
        const std::string& http_server) {
    for (const auto& c : channels) stubs_.push_back(v1::Conveyor::NewStub(c));
    if (!http_server.empty()) {
      const size_t colon = http_server.rfind(':');
      http_host_ = http_server.substr(0, colon);
      http_port_ = colon == std::string::npos ? "80" : http_server.substr(colon + 1);
    }
  }

  // Runs every spec; returns the results in spec order.
  std::vector<RequestResult> Run(const std::vector<RequestSpec>& specs, Clock::time_point start);

  void OnTokens(int n) { tokens_received_.fetch_add(n, std::memory_order_relaxed); }
  void OnFinished(Call* call) {
    std::lock_guard<std::mutex> lock(mu_);
    ++finished_;
    if (!call->result().ok) ++failed_;
    --in_flight_;
    cv_.notify_all();
  }
  int64_t tokens_received() const { return tokens_received_.load(std::memory_order_relaxed); }
  void Counts(int* sent, int* finished, int* failed, int* in_flight) {
    std::lock_guard<std::mutex> lock(mu_);
    *sent = sent_;
    *finished = finished_;
    *failed = failed_;
    *in_flight = in_flight_;
  }

 private:
  void Launch(const RequestSpec& spec, Clock::time_point start);

  std::vector<std::unique_ptr<v1::Conveyor::Stub>> stubs_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::string http_host_, http_port_;
  std::atomic<int64_t> tokens_received_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int sent_ = 0, finished_ = 0, failed_ = 0, in_flight_ = 0;
};

void GenerateCall::Start(v1::Conveyor::Stub* stub, Clock::time_point run_start) {
  sent_ = Clock::now();
  result_.start_s = SecondsSince(run_start, sent_);
  stub->async()->Generate(&context_, &request_, this);
  StartRead(&response_);
  StartCall();
}

void GenerateCall::OnReadDone(bool ok) {
  if (!ok) return;  // OnDone follows.
  const Clock::time_point now = Clock::now();
  const int k = response_.token_ids_size();
  if (k > 0) {
    if (result_.output_tokens == 0) {
      result_.ttft_ms = Ms(now - sent_);
    } else {
      // Several tokens in one message share the gap since the previous message.
      const float gap = static_cast<float>(Ms(now - last_token_) / k);
      for (int i = 0; i < k; ++i) result_.itl_ms.push_back(gap);
    }
    last_token_ = now;
    result_.output_tokens += k;
    bench_->OnTokens(k);
  }
  if (response_.finish_reason() != v1::FINISH_REASON_UNSPECIFIED) {
    result_.finished_normally = true;
    result_.finish_reason = v1::FinishReason_Name(response_.finish_reason());
    const v1::Usage& u = response_.usage();
    result_.server_queue_ms = u.queue_time_ms();
    result_.server_ttft_ms = u.time_to_first_token_ms();
    result_.server_e2e_ms = u.e2e_latency_ms();
    result_.preemptions = u.preemptions();
    result_.cached_prompt_tokens = u.cached_prompt_tokens();
  }
  response_.Clear();
  StartRead(&response_);
}

void GenerateCall::OnDone(const grpc::Status& status) {
  result_.e2e_ms = Ms(Clock::now() - sent_);
  result_.ok = status.ok() && result_.finished_normally;
  if (!status.ok()) {
    result_.error = std::to_string(status.error_code()) + ": " + status.error_message();
  }
  if (result_.output_tokens > 1 && result_.ttft_ms >= 0) {
    result_.tpot_ms = (result_.e2e_ms - result_.ttft_ms) / (result_.output_tokens - 1);
  }
  done_ = true;
  bench_->OnFinished(this);
}

HttpCall::HttpCall(Bench* bench, const RequestSpec& spec) : bench_(bench) {
  result_.index = spec.index;
  result_.prompt_tokens = static_cast<int>(spec.prompt.size());
  result_.requested_tokens = spec.max_new_tokens;
  const json body = {{"prompt", spec.prompt},
                     {"max_tokens", spec.max_new_tokens},
                     {"temperature", absl::GetFlag(FLAGS_temperature)},
                     {"seed", spec.seed},
                     {"ignore_eos", absl::GetFlag(FLAGS_ignore_eos)},
                     {"stream", true},
                     {"stream_options", {{"include_usage", true}}}};
  body_ = body.dump();
}

void HttpCall::Start(const std::string& host, const std::string& port,
                     Clock::time_point run_start) {
  sent_ = Clock::now();
  result_.start_s = SecondsSince(run_start, sent_);
  thread_ = std::thread([this, host, port] {
    const std::string error = stream_.Run(host, port, "/v1/completions", body_,
                                          [this](std::string_view data) { OnEvent(data); });
    result_.e2e_ms = Ms(Clock::now() - sent_);
    if (result_.error.empty()) result_.error = error;
    result_.ok = result_.error.empty() && result_.finished_normally;
    if (result_.output_tokens > 1 && result_.ttft_ms >= 0) {
      result_.tpot_ms = (result_.e2e_ms - result_.ttft_ms) / (result_.output_tokens - 1);
    }
    bench_->OnFinished(this);
  });
}

void HttpCall::OnEvent(std::string_view data) {
  if (data == "[DONE]") return;
  const json event = json::parse(data, nullptr, /*allow_exceptions=*/false);
  if (!event.is_object()) {
    result_.error = "unreadable event: " + std::string(data.substr(0, 200));
    return;
  }
  if (const auto error = event.find("error"); error != event.end()) {
    result_.error = error->dump();
    return;
  }
  const Clock::time_point now = Clock::now();
  const auto choices = event.find("choices");
  if (choices != event.end() && choices->is_array() && !choices->empty()) {
    const json& choice = choices->front();
    const auto text = choice.find("text");
    if (text != choice.end() && text->is_string() && !text->get_ref<const std::string&>().empty()) {
      if (chunks_ == 0) {
        result_.ttft_ms = Ms(now - sent_);
      } else {
        result_.itl_ms.push_back(static_cast<float>(Ms(now - last_token_)));
      }
      last_token_ = now;
      ++chunks_;
      bench_->OnTokens(1);
    }
    const auto finish = choice.find("finish_reason");
    if (finish != choice.end() && finish->is_string()) {
      result_.finish_reason = finish->get<std::string>();
    }
  }
  const auto usage = event.find("usage");
  if (usage != event.end() && usage->is_object()) {
    result_.finished_normally = true;
    result_.output_tokens = usage->value("completion_tokens", chunks_);
    if (result_.output_tokens > chunks_) bench_->OnTokens(result_.output_tokens - chunks_);
    const json details = usage->value("prompt_tokens_details", json::object());
    result_.cached_prompt_tokens = details.value("cached_tokens", 0);
  }
}

void Bench::Launch(const RequestSpec& spec, Clock::time_point start) {
  Call* call;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (http_host_.empty()) {
      calls_.push_back(std::make_unique<GenerateCall>(this, spec));
    } else {
      calls_.push_back(std::make_unique<HttpCall>(this, spec));
    }
    call = calls_.back().get();
    ++sent_;
    ++in_flight_;
  }
  if (http_host_.empty()) {
    static_cast<GenerateCall*>(call)->Start(stubs_[spec.index % stubs_.size()].get(), start);
  } else {
    static_cast<HttpCall*>(call)->Start(http_host_, http_port_, start);
  }
}

std::vector<RequestResult> Bench::Run(const std::vector<RequestSpec>& specs,
                                      Clock::time_point start) {
  const int n = static_cast<int>(specs.size());
  const int concurrency = absl::GetFlag(FLAGS_concurrency);
  const double timeout_s = absl::GetFlag(FLAGS_timeout_s);
  const Clock::time_point deadline =
      timeout_s > 0 ? start + std::chrono::microseconds(static_cast<int64_t>(timeout_s * 1e6))
                    : Clock::time_point::max();
  bool timed_out = false;
  if (concurrency > 0) {
    for (int i = 0; i < n; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_until(lock, deadline, [&] { return in_flight_ < concurrency; })) {
          timed_out = true;
          break;
        }
      }
      Launch(specs[i], start);
    }
  } else {
    double rate = std::numeric_limits<double>::infinity();
    const std::string r = absl::GetFlag(FLAGS_request_rate);
    if (r != "inf" && (!absl::SimpleAtod(r, &rate) || rate <= 0)) {
      std::fprintf(stderr, "conveyor-bench: --request_rate must be > 0 or inf\n");
      std::exit(2);
    }
    const std::vector<double> arrivals =
        MakeArrivals(n, rate, absl::GetFlag(FLAGS_burstiness), absl::GetFlag(FLAGS_seed));
    const int cap = absl::GetFlag(FLAGS_max_concurrency);
    for (int i = 0; i < n; ++i) {
      const Clock::time_point at =
          start + std::chrono::microseconds(static_cast<int64_t>(arrivals[i] * 1e6));
      if (at > deadline) {
        timed_out = true;
        break;
      }
      std::this_thread::sleep_until(at);
      if (cap > 0) {
        std::unique_lock<std::mutex> lock(mu_);
        if (!cv_.wait_until(lock, deadline, [&] { return in_flight_ < cap; })) {
          timed_out = true;
          break;
        }
      }
      Launch(specs[i], start);
    }
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_until(lock, deadline, [&] { return in_flight_ == 0; })) timed_out = true;
  }
  if (timed_out) {
    std::fprintf(stderr, "conveyor-bench: --timeout_s reached; cancelling what is left\n");
    std::vector<Call*> live;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& c : calls_) live.push_back(c.get());
    }
    for (Call* c : live) c->Cancel();
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return in_flight_ == 0; });
  }
  std::vector<RequestResult> results(n);
  std::vector<bool> sent(n, false);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : calls_) {
      results[c->result().index] = c->result();
      sent[c->result().index] = true;
    }
  }
  for (int i = 0; i < n; ++i) {
    if (!sent[i]) {
      results[i].index = i;
      results[i].prompt_tokens = static_cast<int>(specs[i].prompt.size());
      results[i].requested_tokens = specs[i].max_new_tokens;
      results[i].start_s = -1;
      results[i].error = "not sent (timeout)";
    }
  }
  return results;
}

// ---------------------------------------------------------------- statistics

struct Stats {
  int n = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};

double Percentile(const std::vector<double>& sorted, double p) {
  if (sorted.empty()) return 0;
  const double pos = p / 100.0 * (sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo);
}

Stats Summarize(std::vector<double> v) {
  Stats s;
  s.n = static_cast<int>(v.size());
  if (v.empty()) return s;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / v.size();
  s.p50 = Percentile(v, 50);
  s.p90 = Percentile(v, 90);
  s.p99 = Percentile(v, 99);
  s.min = v.front();
  s.max = v.back();
  return s;
}

json ToJson(const Stats& s) {
  return {{"n", s.n},     {"mean", s.mean}, {"p50", s.p50}, {"p90", s.p90},
          {"p99", s.p99}, {"min", s.min},   {"max", s.max}};
}

// ---------------------------------------------------------------- server readiness

std::optional<v1::ModelInfoResponse> WaitForServer(v1::Conveyor::Stub* stub, double wait_s) {
  const Clock::time_point until =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(wait_s * 1000));
  std::string last_error = "no answer";
  for (;;) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    v1::ModelInfoRequest req;
    v1::ModelInfoResponse info;
    grpc::Status st = stub->GetModelInfo(&ctx, req, &info);
    // Until the workers are ready the info is empty.
    if (st.ok() && info.vocab_size() > 0) return info;
    if (!st.ok()) last_error = st.error_message();
    if (Clock::now() >= until) {
      std::fprintf(stderr, "conveyor-bench: the server is not ready (%s)\n", last_error.c_str());
      return std::nullopt;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
}

bool Warmup(v1::Conveyor::Stub* stub, int count, int vocab) {
  for (int i = 0; i < count; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(120));
    v1::GenerateRequest req;
    for (int j = 0; j < 16; ++j)
      req.mutable_token_ids()->add_ids(3 + (i * 131 + j * 17) % (vocab - 3));
    req.set_max_new_tokens(4);
    req.set_ignore_eos(true);
    req.set_temperature(0);
    req.set_request_id("bench-warmup-" + std::to_string(i));
    auto reader = stub->Generate(&ctx, req);
    v1::GenerateResponse resp;
    while (reader->Read(&resp)) {
    }
    grpc::Status st = reader->Finish();
    if (!st.ok()) {
      std::fprintf(stderr, "conveyor-bench: warm-up request failed: %s\n",
                   st.error_message().c_str());
      return false;
    }
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
  const std::vector<RequestSpec> specs =
      MakeWorkload(info->vocab_size(), info->max_context_tokens(), &error);
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
  Bench bench(channels, api == "http" ? absl::GetFlag(FLAGS_http_server) : "");
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
          const MetricMap m = ParseMetrics(*text);
          GaugeSample g;
          g.t = SecondsSince(start, now);
          g.running = Get(m, "conveyor_requests_running");
          g.waiting = Get(m, "conveyor_requests_waiting");
          g.kv_blocks_used = Get(m, "conveyor_kv_blocks_used");
          // Named conveyor_kv_blocks_total before it was renamed (promtool: no _total on gauges).
          g.kv_blocks_total = m.count("conveyor_kv_blocks_capacity")
                                  ? Get(m, "conveyor_kv_blocks_capacity")
                                  : Get(m, "conveyor_kv_blocks_total");
          g.kv_slots_used = Get(m, "conveyor_kv_slots_used");
          g.kv_slots_allocated = Get(m, "conveyor_kv_slots_allocated");
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
    auto delta = [&](const std::string& name) { return Get(*after, name) - Get(*before, name); };
    const double slot_steps = delta("conveyor_batch_slot_steps_total");
    const double wasted = delta("conveyor_batch_slot_steps_wasted_total");
    const double steps = delta("conveyor_step_tokens_count");
    const double step_tokens = delta("conveyor_step_tokens_sum");
    const double step_seconds = delta("conveyor_step_duration_seconds_sum");
    const double prefix_q = delta("conveyor_prefix_cache_queries_total");
    json sm = {{"steps", steps},
               {"batch_slot_steps", slot_steps},
               {"batch_slot_steps_wasted", wasted},
               {"bubble", slot_steps > 0 ? wasted / slot_steps : 0.0},
               {"mean_batch_slots_per_step", steps > 0 ? slot_steps / steps : 0.0},
               {"mean_tokens_per_step", steps > 0 ? step_tokens / steps : 0.0},
               {"mean_step_ms", steps > 0 ? 1000 * step_seconds / steps : 0.0},
               {"busy_fraction", duration > 0 ? step_seconds / duration : 0.0},
               {"preemptions", delta("conveyor_preemptions_total")},
               {"generated_tokens", delta("conveyor_generated_tokens_total")},
               {"prompt_tokens", delta("conveyor_prompt_tokens_total")},
               {"prefill_tokens", delta("conveyor_prefill_tokens_total")},
               {"prefix_cache_hit_rate",
                prefix_q > 0 ? delta("conveyor_prefix_cache_hits_total") / prefix_q : 0.0},
               {"requests_finished", delta("conveyor_requests_finished_total")},
               {"requests_rejected", delta("conveyor_requests_rejected_total")}};
    // Gauges: steady state = samples away from the run's ends, with live requests.
    const double trim = std::clamp(absl::GetFlag(FLAGS_steady_state_trim), 0.0, 0.49);
    double ratio_sum = 0, used_sum = 0, alloc_sum = 0, blocks_sum = 0, running_sum = 0,
           waiting_sum = 0;
    int n_ratio = 0, n_all = 0;
    json series = json::array();
    {
      std::lock_guard<std::mutex> lock(samples_mu);
      for (const GaugeSample& g : samples) {
        series.push_back({g.t, g.running, g.waiting, g.kv_blocks_used, g.kv_blocks_total,
                          g.kv_slots_used, g.kv_slots_allocated});
        if (g.t < trim * duration || g.t > (1 - trim) * duration) continue;
        ++n_all;
        running_sum += g.running;
        waiting_sum += g.waiting;
        blocks_sum += g.kv_blocks_total > 0 ? g.kv_blocks_used / g.kv_blocks_total : 0;
        if (g.kv_slots_allocated > 0) {
          ++n_ratio;
          ratio_sum += g.kv_slots_used / g.kv_slots_allocated;
          used_sum += g.kv_slots_used;
          alloc_sum += g.kv_slots_allocated;
        }
      }
    }
    sm["steady_state"] = {
        {"samples", n_all},
        {"kv_slot_samples", n_ratio},
        {"kv_slots_used_over_allocated", n_ratio > 0 ? ratio_sum / n_ratio : 0.0},
        {"kv_slots_used_over_allocated_pooled", alloc_sum > 0 ? used_sum / alloc_sum : 0.0},
        {"kv_blocks_used_fraction", n_all > 0 ? blocks_sum / n_all : 0.0},
        {"requests_running", n_all > 0 ? running_sum / n_all : 0.0},
        {"requests_waiting", n_all > 0 ? waiting_sum / n_all : 0.0}};
    sm["gauge_samples_columns"] = {
        "t_s",           "running",           "waiting", "kv_blocks_used", "kv_blocks_total",
        "kv_slots_used", "kv_slots_allocated"};
    sm["gauge_samples"] = series;
    out["server_metrics"] = sm;
  }

  if (absl::GetFlag(FLAGS_save_requests)) {
    json reqs = json::array();
    const bool save_itl = absl::GetFlag(FLAGS_save_itl);
    for (const RequestResult& r : results) {
      json j = {{"index", r.index},
                {"ok", r.ok},
                {"prompt_tokens", r.prompt_tokens},
                {"requested_tokens", r.requested_tokens},
                {"output_tokens", r.output_tokens},
                {"start_s", r.start_s},
                {"ttft_ms", r.ttft_ms},
                {"tpot_ms", r.tpot_ms},
                {"e2e_ms", r.e2e_ms},
                {"server_queue_ms", r.server_queue_ms},
                {"server_ttft_ms", r.server_ttft_ms},
                {"preemptions", r.preemptions},
                {"cached_prompt_tokens", r.cached_prompt_tokens},
                {"finish_reason", r.finish_reason}};
      if (!r.error.empty()) j["error"] = r.error;
      if (save_itl) j["itl_ms"] = r.itl_ms;
      reqs.push_back(j);
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
