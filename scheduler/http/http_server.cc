#include "scheduler/http/http_server.h"

#include <malloc.h>

#include <chrono>
#include <fstream>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "scheduler/front_end.h"
#include "scheduler/http/tls_identity.h"
#include "spdlog/spdlog.h"
#include "text/gguf_tokenizer.h"

namespace conveyor::scheduler {
namespace {

using openai::Endpoint;
using openai::Json;

constexpr char kJsonType[] = "application/json; charset=utf-8";
// Bodies from this size on return the heap memory they used once parsed (malloc_trim).
constexpr size_t kTrimAfterBodyBytes = 1 << 20;
constexpr std::string_view kModelPrefix = "/v1/models/";

enum class Route { kHealth, kModels, kModel, kCompletions, kChatCompletions, kUnknown };

Route Resolve(std::string_view path) {
  if (path == "/health") return Route::kHealth;
  if (path == "/v1/models") return Route::kModels;
  if (path.size() > kModelPrefix.size() && path.starts_with(kModelPrefix)) {
    return Route::kModel;
  }
  if (path == "/v1/completions") return Route::kCompletions;
  if (path == "/v1/chat/completions") return Route::kChatCompletions;
  return Route::kUnknown;
}

absl::string_view MethodFor(Route route) {
  return route == Route::kCompletions || route == Route::kChatCompletions ? "POST" : "GET";
}

HttpResponse Json200(std::string body) { return {200, kJsonType, std::move(body), {}}; }

HttpResponse ErrorResponse(const absl::Status& status) {
  HttpResponse response{openai::HttpStatusFor(status), kJsonType, openai::ErrorBody(status), {}};
  if (absl::IsUnauthenticated(status)) response.headers.emplace_back("WWW-Authenticate", "Bearer");
  return response;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// tokenizer_config.json's `key` token text (a string, or an added-token object with
// "content"), or "" when it has none.
std::string ConfigToken(const Json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

// The model's tokenizer_config.json, or for a GGUF file the one its metadata implies;
// null when there is none or it cannot be read.
Json TokenizerConfig(const std::string& model_path) {
  if (IsGgufPath(model_path)) {
    absl::StatusOr<Json> config = LoadGgufTokenizerConfig(model_path);
    return config.ok() ? *std::move(config) : Json();
  }
  std::ifstream in(model_path + "/tokenizer_config.json");
  std::stringstream text;
  text << in.rdbuf();
  return Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
}

// The text a chat template gets as bos_token and eos_token: tokenizer_config.json's (a
// GGUF file's tokenizer.ggml.bos/eos_token_id tokens), as Hugging Face passes them, else
// the tokenizer's pieces for its BOS and EOS ids.
std::pair<std::string, std::string> TemplateSpecialTokens(const std::string& model_path,
                                                          const Tokenizer& tokenizer) {
  const Json config = TokenizerConfig(model_path);
  std::string bos = config.is_object() ? ConfigToken(config, "bos_token") : "";
  std::string eos = config.is_object() ? ConfigToken(config, "eos_token") : "";
  if (bos.empty() && tokenizer.bos_id() >= 0) bos = tokenizer.Piece(tokenizer.bos_id());
  if (eos.empty() && tokenizer.eos_id() >= 0) eos = tokenizer.Piece(tokenizer.eos_id());
  return {std::move(bos), std::move(eos)};
}

// What a request with a reasoning budget needs to continue its answer (docs/reasoning.md):
// its first generation is limited to the budget; if it ends there with tokens left, a
// second one continues from the prompt and every token so far, after kReasoningEndText's
// tokens when the reasoning had not ended, up to the request's max_tokens in all.
struct Continuation {
  Engine* engine = nullptr;
  ServingLimits limits;
  const Tokenizer* tokenizer = nullptr;
  v1::GenerateRequest generate;  // The first generation's sampling and stopping.
  std::vector<int32_t> prompt;   // Its prompt's tokens.
  std::vector<int32_t> end_ids;  // kReasoningEndText's tokens.
  int total_max_tokens = 0;
  std::string request_id;
};

// One request's answer on its way from the engine to its connection. The engine calls
// Send and Finish (through the PhaseSink of the generation that runs) on its delivery
// thread and must never wait: both only queue, and the first event of a batch asks the
// connection (HttpExchange::Post) to run Drain, which formats everything queued by then
// into one write. Nothing is drained before Begin (the request was admitted and the answer
// may start), so an early token cannot overtake the stream's opening. A reasoning budget
// may make the answer two generations (phases); the client sees one.
class GenerationSink final : public std::enable_shared_from_this<GenerationSink> {
 public:
  GenerationSink(std::shared_ptr<HttpExchange> exchange, openai::ResponseFormatter formatter,
                 bool stream, std::shared_ptr<TokenAuthenticator::Grant> grant,
                 std::optional<Continuation> continuation)
      : exchange_(std::move(exchange)),
        formatter_(std::move(formatter)),
        stream_(stream),
        grant_(std::move(grant)),
        continuation_(std::move(continuation)) {}

  // The engine's sink for generation `phase` of this answer.
  std::shared_ptr<ResponseSink> PhaseSink(int phase) {
    class Sink final : public ResponseSink {
     public:
      Sink(std::shared_ptr<GenerationSink> answer, int phase)
          : answer_(std::move(answer)), phase_(phase) {}
      void Send(v1::GenerateResponse message) override {
        answer_->Queue({phase_, std::move(message), std::nullopt});
      }
      void Finish(const absl::Status& status) override {
        answer_->Queue({phase_, std::nullopt, status});
      }

     private:
      const std::shared_ptr<GenerationSink> answer_;
      const int phase_;
    };
    return std::make_shared<Sink>(shared_from_this(), phase);
  }

  // The engine accepted the request (as `engine_id`): the answer may start.
  void Begin(uint64_t engine_id) {
    std::lock_guard<std::mutex> lock(mu_);
    engine_id_ = engine_id;
    begun_ = true;
    ScheduleLocked();
  }

  // The client left: cancels the generation that runs (and any that would follow).
  void Cancel(Engine* engine) {
    uint64_t id = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_gone_ = true;
      id = engine_id_;
    }
    engine->Cancel(id);
  }

 private:
  // A message or the end of generation `phase`.
  struct Event {
    int phase;
    std::optional<v1::GenerateResponse> message;
    std::optional<absl::Status> finish;
  };

  void Queue(Event event) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(event));
    ScheduleLocked();
  }

  void ScheduleLocked() {
    if (!begun_ || scheduled_) return;
    scheduled_ = true;
    exchange_->Post([self = shared_from_this()] { self->Drain(); });
  }

  void Format(const v1::GenerateResponse& message, std::string* out) {
    if (stream_) {
      formatter_.AppendEvents(message, out);
    } else {
      formatter_.Add(message);
    }
  }

  // On the connection's context: the final message of the first generation, which ended
  // at the reasoning budget. Formats it as a message that does not end the answer and
  // starts the second generation; OK when the answer goes on (or ended here), else the
  // error that ends it.
  absl::Status Continue(v1::GenerateResponse message, std::string* out) {
    Continuation& c = *continuation_;
    first_usage_ = message.usage();
    message.clear_usage();
    message.set_finish_reason(v1::FINISH_REASON_UNSPECIFIED);
    Format(message, out);
    if (formatter_.reasoning_open()) {
      v1::GenerateResponse end;
      end.set_request_id(message.request_id());
      end.set_text(std::string(openai::kReasoningEndText));
      end.mutable_token_ids()->Add(c.end_ids.begin(), c.end_ids.end());
      Format(end, out);
      generated_.insert(generated_.end(), c.end_ids.begin(), c.end_ids.end());
      added_tokens_ = static_cast<int>(c.end_ids.size());
    }
    const int remaining = c.total_max_tokens - static_cast<int>(generated_.size());
    absl::StatusOr<std::unique_ptr<Request>> built = absl::InternalError("");
    if (remaining > 0) {
      v1::GenerateRequest g = c.generate;
      g.clear_text();
      g.clear_add_bos();
      g.mutable_token_ids()->mutable_ids()->Add(c.prompt.begin(), c.prompt.end());
      g.mutable_token_ids()->mutable_ids()->Add(generated_.begin(), generated_.end());
      g.set_max_new_tokens(remaining);
      built = BuildRequest(g, c.limits, *c.tokenizer);
    }
    if (remaining <= 0) {
      // The end text took the last of max_tokens: the answer ends here (with the first
      // generation's Finish, still to come).
      v1::GenerateResponse last;
      last.set_request_id(message.request_id());
      last.set_finish_reason(v1::FINISH_REASON_LENGTH);
      *last.mutable_usage() = SummedUsage(v1::Usage());
      Format(last, out);
      return absl::OkStatus();
    }
    if (!built.ok()) return built.status();
    std::unique_ptr<Request> r = *std::move(built);
    r->request_id = c.request_id;
    r->front_end = FrontEnd::kHttp;
    r->sink = PhaseSink(1);
    absl::StatusOr<uint64_t> id = c.engine->Submit(std::move(r));
    if (!id.ok()) return id.status();
    bool gone = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_id_ = *id;
      gone = client_gone_;
    }
    if (gone) c.engine->Cancel(*id);
    phase_ = 1;
    return absl::OkStatus();
  }

  // The answer's usage: the first generation's prompt, every generated token (and the
  // end text's), `second`'s timings where it has them.
  v1::Usage SummedUsage(const v1::Usage& second) const {
    v1::Usage usage = first_usage_;
    usage.set_generated_tokens(first_usage_.generated_tokens() + added_tokens_ +
                               second.generated_tokens());
    usage.set_e2e_latency_ms(std::max(first_usage_.e2e_latency_ms(), second.e2e_latency_ms()));
    usage.set_preemptions(first_usage_.preemptions() + second.preemptions());
    return usage;
  }

  // On the connection's context.
  void Drain() {
    std::vector<Event> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(pending_);
      scheduled_ = false;
    }
    if (done_) return;
    std::string out;
    if (stream_ && !opened_) {
      exchange_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
      formatter_.AppendStart(&out);
      opened_ = true;
    }
    absl::Status status;
    bool ended = false;
    for (Event& event : events) {
      // A generation that was continued has nothing more to say (its Finish).
      if (ended || event.phase != phase_) continue;
      if (event.finish.has_value()) {
        status = *event.finish;
        ended = true;
        continue;
      }
      v1::GenerateResponse& message = *event.message;
      const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
      if (continuation_.has_value() && phase_ == 0) {
        generated_.insert(generated_.end(), message.token_ids().begin(), message.token_ids().end());
        if (final && message.finish_reason() == v1::FINISH_REASON_LENGTH &&
            static_cast<int>(generated_.size()) < continuation_->total_max_tokens) {
          status = Continue(std::move(message), &out);
          ended = !status.ok();
          continue;
        }
      }
      if (phase_ == 1 && final) *message.mutable_usage() = SummedUsage(message.usage());
      Format(message, &out);
    }
    if (stream_) {
      // "data: {error}" then the end of the stream, with no [DONE]: how OpenAI's clients
      // learn of a failure after the 200 went out.
      if (ended && !status.ok()) out += openai::ErrorEvent(status);
      exchange_->Write(std::move(out));
      if (ended) exchange_->EndStream();
    } else if (ended) {
      // The whole answer is waited for, so its HTTP status can still say how it ended.
      exchange_->Respond(status.ok() ? Json200(formatter_.Body()) : ErrorResponse(status));
    }
    if (ended) {
      done_ = true;
      grant_->Release();
    }
  }

  const std::shared_ptr<HttpExchange> exchange_;
  // Drain's alone (one Drain runs at a time, on the connection's context).
  openai::ResponseFormatter formatter_;
  const bool stream_;
  const std::shared_ptr<TokenAuthenticator::Grant> grant_;
  std::optional<Continuation> continuation_;
  bool opened_ = false;
  bool done_ = false;
  int phase_ = 0;                   // The generation whose events count.
  std::vector<int32_t> generated_;  // The first generation's tokens (and the end text's).
  int added_tokens_ = 0;            // The end text's tokens.
  v1::Usage first_usage_;

  std::mutex mu_;
  std::vector<Event> pending_;  // Guarded by mu_, as is everything below.
  bool begun_ = false;
  bool scheduled_ = false;
  bool client_gone_ = false;
  uint64_t engine_id_ = 0;
};

}  // namespace

HttpServer::HttpServer(Options options, const Tokenizer* tokenizer, SchedulerMetrics* metrics)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      created_unix_s_(UnixSeconds()) {
  parse_options_.model_name = options_.model_name;
  parse_options_.model_aliases = options_.model_aliases;
  parse_options_.json_limits = options_.json_limits;
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::SetAuthenticator(TokenAuthenticator* authenticator) {
  authenticator_ = authenticator;
}

void HttpServer::SetTls(std::string cert_file, std::string key_file, std::string client_ca_file,
                        int refresh_s) {
  tls_cert_file_ = std::move(cert_file);
  tls_key_file_ = std::move(key_file);
  tls_client_ca_file_ = std::move(client_ca_file);
  tls_refresh_s_ = refresh_s;
}

absl::Status HttpServer::Start() {
  chat_.chat_template = options_.chat_template;
  chat_.tool_template = options_.tool_use_template;
  // Tools are rendered, and their calls recognised, by the template tool requests use.
  const jinja::ChatTemplate* tool_template =
      chat_.tool_template != nullptr ? chat_.tool_template : chat_.chat_template;
  std::tie(chat_.bos_token, chat_.eos_token) =
      TemplateSpecialTokens(options_.model_dir, *tokenizer_);
  if (options_.tool_call_format != "auto") {
    absl::StatusOr<openai::ToolCallFormat> format =
        openai::ToolCallFormatFromName(options_.tool_call_format);
    if (!format.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tool_call_format: ", format.status().message()));
    }
    chat_.tool_call_format = *format;
  }
  chat_.default_max_reasoning_tokens = options_.max_reasoning_tokens;
  if (options_.reasoning_parser != "auto") {
    absl::StatusOr<openai::ReasoningFormat> format =
        openai::ReasoningFormatFromName(options_.reasoning_parser);
    if (!format.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--reasoning_parser: ", format.status().message()));
    }
    chat_.reasoning_format = *format;
  } else if (chat_.chat_template != nullptr) {
    chat_.reasoning_format = openai::GuessReasoningFormat(chat_.chat_template->source());
  }
  if (absl::StatusOr<std::vector<int>> ids = tokenizer_->Encode(openai::kReasoningEndText);
      ids.ok()) {
    reasoning_end_ids_.assign(ids->begin(), ids->end());
  }
  spdlog::info(
      "reasoning parser: {} ({}){}", openai::ReasoningFormatName(chat_.reasoning_format),
      options_.reasoning_parser == "auto" ? "recognised from the chat template"
                                          : "--reasoning_parser",
      chat_.default_max_reasoning_tokens > 0
          ? absl::StrCat(", default max_reasoning_tokens ", chat_.default_max_reasoning_tokens)
          : "");
  if (tool_template != nullptr) {
    chat_.renders_tools =
        openai::TemplateRendersTools(*tool_template, chat_.bos_token, chat_.eos_token);
    if (chat_.renders_tools && !chat_.tool_call_format.has_value()) {
      absl::StatusOr<openai::ToolCallFormat> guessed =
          openai::GuessToolCallFormat(tool_template->source());
      if (guessed.ok()) chat_.tool_call_format = *guessed;
    }
    spdlog::info("chat template{}: tools {}, tool calls parsed as {}",
                 chat_.tool_template != nullptr ? " (\"tool_use\" for requests with tools)" : "",
                 chat_.renders_tools ? "rendered" : "not rendered (requests with tools are 400)",
                 chat_.tool_call_format.has_value()
                     ? std::string(openai::ToolCallFormatName(*chat_.tool_call_format))
                     : std::string("unknown (set --tool_call_format)"));
  }
  HttpTransport::Options transport = options_.transport;
  if (!tls_cert_file_.empty()) {
    ASSIGN_OR_RETURN(tls_identity_,
                     ReloadingTlsIdentity::Load(tls_cert_file_, tls_key_file_, tls_refresh_s_));
    transport.configure_tls = [this](SSL_CTX* ctx) {
      SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION);
      SSL_CTX_set_options(ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
      tls_identity_->Install(ctx);
      if (tls_client_ca_file_.empty()) return true;
      if (SSL_CTX_load_verify_locations(ctx, tls_client_ca_file_.c_str(), nullptr) != 1) {
        spdlog::error("HTTPS: cannot use the client CA {}", tls_client_ca_file_);
        return false;
      }
      SSL_CTX_set_client_CA_list(ctx, SSL_load_client_CA_file(tls_client_ca_file_.c_str()));
      SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      return true;
    };
  }
  if (metrics_ != nullptr) {
    transport.on_connections = [metrics = metrics_](int open) {
      metrics->SetHttpConnections(open);
    };
    transport.on_refused = [metrics = metrics_](std::string_view reason) {
      metrics->CountHttpRefused(reason);
    };
  }
  transport_ =
      std::make_unique<HttpTransport>(std::move(transport), static_cast<HttpHandler*>(this));
  return transport_->Start();
}

int HttpServer::port() const { return transport_ == nullptr ? 0 : transport_->port(); }

void HttpServer::SetEngine(Engine* engine, const ServingLimits& limits) {
  limits_ = limits;
  parse_options_.max_logprobs = limits.max_logprobs;
  engine_.store(engine);
}

void HttpServer::Stop() {
  if (transport_ != nullptr) transport_->Stop();
}

std::string HttpServer::ErrorBody(int status, std::string_view message) {
  return openai::HttpErrorBody(status, message);
}

std::optional<HttpResponse> HttpServer::CheckHead(const HttpRequestHead& head) {
  const Route route = Resolve(head.path);
  if (route == Route::kUnknown) {
    return ErrorResponse(openai::WithCode(
        absl::NotFoundError(absl::StrCat("Unknown request URL: ", head.method, " ", head.path)),
        "unknown_url"));
  }
  if (head.method != MethodFor(route)) {
    const std::string message =
        absl::StrCat(head.path, " takes ", MethodFor(route), ", not ", head.method);
    return HttpResponse{405,
                        kJsonType,
                        openai::HttpErrorBody(405, message),
                        {{"Allow", std::string(MethodFor(route))}}};
  }
  // Credentials are checked before a body is read: a stranger's 16 MiB costs nothing.
  if (route != Route::kHealth && authenticator_ != nullptr) {
    if (absl::Status auth = authenticator_->Authenticate(head.authorization).status(); !auth.ok()) {
      if (metrics_ != nullptr) metrics_->CountRejected(auth.code(), FrontEnd::kHttp);
      return ErrorResponse(auth);
    }
  }
  return std::nullopt;
}

void HttpServer::Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) {
  switch (Resolve(request.head().path)) {
    case Route::kHealth: {
      const bool serving = serving_.load();
      return exchange->Respond({serving ? 200 : 503,
                                kJsonType,
                                serving ? R"({"status":"serving"})" : R"({"status":"not_serving"})",
                                {}});
    }
    case Route::kModels:
      return exchange->Respond(Json200(openai::ModelList(options_.model_name, created_unix_s_)));
    case Route::kModel: {
      const std::string model(request.head().path.substr(kModelPrefix.size()));
      if (!openai::ServesModel(parse_options_, model)) {
        return exchange->Respond(ErrorResponse(openai::ModelNotFoundError(model, parse_options_)));
      }
      return exchange->Respond(Json200(openai::ModelObject(options_.model_name, created_unix_s_)));
    }
    case Route::kCompletions:
    case Route::kChatCompletions:
      break;
    case Route::kUnknown:
      return;  // CheckHead answered it.
  }
  const Endpoint endpoint = Resolve(request.head().path) == Route::kChatCompletions
                                ? Endpoint::kChatCompletions
                                : Endpoint::kCompletions;
  // One of the token's concurrent-generation slots, held until the answer has ended.
  auto grant = std::make_shared<TokenAuthenticator::Grant>();
  if (authenticator_ != nullptr) {
    absl::StatusOr<TokenAuthenticator::Grant> admitted =
        authenticator_->Admit(request.head().authorization);
    if (!admitted.ok()) return Reject(admitted.status(), *exchange);
    *grant = std::move(*admitted);
  }
  if (engine_.load() == nullptr) {
    return Reject(absl::UnavailableError("no model worker is ready yet; retry shortly"), *exchange);
  }
  // Parsing, the chat template and tokenizing take time in proportion to the body: off the
  // I/O threads.
  auto owned = std::make_shared<HttpRequest>(std::move(request));
  transport_->Offload([this, endpoint, owned, exchange, grant] {
    const size_t body_bytes = owned->body().size();
    Generate(endpoint, *owned, exchange, grant);
    // glibc keeps what a large body and its JSON tree freed in the offload thread's arena
    // (measured: ~50-90 MiB resident after four 1 Mi-value bodies); give it back.
    if (body_bytes >= kTrimAfterBodyBytes) malloc_trim(0);
  });
}

void HttpServer::Generate(Endpoint endpoint, HttpRequest& request,
                          const std::shared_ptr<HttpExchange>& exchange,
                          const std::shared_ptr<TokenAuthenticator::Grant>& grant) {
  Engine* engine = engine_.load();
  openai::ParsedRequest parsed;
  absl::StatusOr<std::unique_ptr<Request>> built = openai::BuildOpenAiRequest(
      endpoint, request.body(), parse_options_, chat_, limits_, *tokenizer_, &parsed);
  request.ReleaseBody();
  if (!built.ok()) return Reject(built.status(), *exchange);

  const std::string id = absl::StrCat(
      endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", next_id_.fetch_add(1));
  std::unique_ptr<Request> r = std::move(*built);
  r->request_id = id;  // Names the request in the engine's log lines.
  r->front_end = FrontEnd::kHttp;
  std::optional<Continuation> continuation;
  if (parsed.reasoning_budget_tokens > 0) {
    continuation.emplace();
    continuation->engine = engine;
    continuation->limits = limits_;
    continuation->tokenizer = tokenizer_;
    continuation->generate = std::move(parsed.generate);
    continuation->prompt.assign(r->tokens.begin(), r->tokens.begin() + r->num_prompt_tokens);
    continuation->end_ids = reasoning_end_ids_;
    continuation->total_max_tokens = parsed.total_max_tokens;
    continuation->request_id = id;
  }
  auto sink = std::make_shared<GenerationSink>(
      exchange, openai::ResponseFormatter(parsed, id, UnixSeconds(), options_.model_name),
      parsed.stream, grant, std::move(continuation));
  r->sink = sink->PhaseSink(0);
  absl::StatusOr<uint64_t> engine_id = engine->Submit(std::move(r));
  if (!engine_id.ok()) return Reject(engine_id.status(), *exchange);
  sink->Begin(*engine_id);
  // A client that leaves frees its request's KV blocks at the next step.
  exchange->OnClientGone([engine, weak = std::weak_ptr<GenerationSink>(sink), grant] {
    if (std::shared_ptr<GenerationSink> answer = weak.lock()) answer->Cancel(engine);
    grant->Release();
  });
}

void HttpServer::Reject(const absl::Status& status, HttpExchange& exchange) const {
  if (metrics_ != nullptr) metrics_->CountRejected(status.code(), FrontEnd::kHttp);
  exchange.Respond(ErrorResponse(status));
}

}  // namespace conveyor::scheduler
