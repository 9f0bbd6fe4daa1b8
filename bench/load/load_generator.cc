#include "bench/load/load_generator.h"

#include <cstdio>
#include <thread>

#include "bench/load/sse_client.h"

namespace conveyor::bench {
namespace {

using json = nlohmann::json;

double Ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

}  // namespace

// One request in flight, over either API.
class Call {
 public:
  virtual ~Call() = default;
  virtual void Cancel() = 0;
  virtual const RequestResult& result() const = 0;
};

class GenerateCall final : public Call, public grpc::ClientReadReactor<v1::GenerateResponse> {
 public:
  GenerateCall(LoadGenerator* bench, const RequestSpec& spec) : bench_(bench) {
    result_.index = spec.index;
    result_.prompt_tokens = static_cast<int>(spec.prompt.size());
    result_.requested_tokens = spec.max_new_tokens;
    request_.mutable_token_ids()->mutable_ids()->Add(spec.prompt.begin(), spec.prompt.end());
    request_.set_max_new_tokens(spec.max_new_tokens);
    request_.set_ignore_eos(bench->options().ignore_eos && bench->options().json_schema.empty());
    request_.set_temperature(static_cast<float>(bench->options().temperature));
    request_.set_seed(spec.seed);
    if (!bench->options().json_schema.empty()) {
      request_.mutable_constraint()->set_json_schema(bench->options().json_schema);
    }
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
  LoadGenerator* bench_;
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
  HttpCall(LoadGenerator* bench, const RequestSpec& spec);
  ~HttpCall() override {
    if (thread_.joinable()) thread_.join();
  }
  void Start(const std::string& host, const std::string& port, Clock::time_point run_start);
  void Cancel() override { stream_.Cancel(); }
  const RequestResult& result() const override { return result_; }

 private:
  void OnEvent(std::string_view data);

  LoadGenerator* bench_;
  std::string body_;
  RequestResult result_;
  Clock::time_point sent_, last_token_;
  int chunks_ = 0;
  conveyor::bench::SseStream stream_;
  std::thread thread_;
};

LoadGenerator::LoadGenerator(const LoadOptions& options,
                             const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                             const std::string& http_server)
    : options_(options) {
  for (const auto& c : channels) stubs_.push_back(v1::Conveyor::NewStub(c));
  if (!http_server.empty()) {
    const size_t colon = http_server.rfind(':');
    http_host_ = http_server.substr(0, colon);
    http_port_ = colon == std::string::npos ? "80" : http_server.substr(colon + 1);
  }
}

LoadGenerator::~LoadGenerator() = default;

void LoadGenerator::OnFinished(Call* call) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_;
  if (!call->result().ok) ++failed_;
  --in_flight_;
  cv_.notify_all();
}

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

HttpCall::HttpCall(LoadGenerator* bench, const RequestSpec& spec) : bench_(bench) {
  result_.index = spec.index;
  result_.prompt_tokens = static_cast<int>(spec.prompt.size());
  result_.requested_tokens = spec.max_new_tokens;
  const bool constrained = !bench->options().json_schema.empty();
  json body = {{"prompt", spec.prompt},
               {"max_tokens", spec.max_new_tokens},
               {"temperature", bench->options().temperature},
               {"seed", spec.seed},
               {"ignore_eos", bench->options().ignore_eos && !constrained},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (constrained) {
    body["response_format"] = {
        {"type", "json_schema"},
        {"json_schema",
         {{"name", "bench"}, {"schema", json::parse(bench->options().json_schema)}}}};
  }
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

void LoadGenerator::Launch(const RequestSpec& spec, Clock::time_point start) {
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

std::vector<RequestResult> LoadGenerator::Run(const std::vector<RequestSpec>& specs,
                                              Clock::time_point start) {
  const int n = static_cast<int>(specs.size());
  const int concurrency = options_.concurrency;
  const double timeout_s = options_.timeout_s;
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
    const std::vector<double> arrivals =
        MakeArrivals(n, options_.request_rate, options_.burstiness, options_.seed);
    const int cap = options_.max_concurrency;
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

nlohmann::json ToJson(const RequestResult& r, bool itl) {
  nlohmann::json j = {{"index", r.index},
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
  if (itl) j["itl_ms"] = r.itl_ms;
  return j;
}

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

}  // namespace conveyor::bench
