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
#include "scheduler/http/responses_api.h"
#include "scheduler/http/router_endpoints.h"
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

enum class Route {
  kHealth,
  kMetrics,
  kModels,
  kModel,
  kServerInfo,
  kModelInfo,
  kLoad,
  kCompletions,
  kChatCompletions,
  kResponses,
  kMessages,
  kCompletionsRender,
  kChatRender,
  kUnknown
};

Route Resolve(std::string_view path) {
  if (path == "/health") return Route::kHealth;
  if (path == "/metrics") return Route::kMetrics;
  if (path == "/v1/models") return Route::kModels;
  if (path.size() > kModelPrefix.size() && path.starts_with(kModelPrefix)) {
    return Route::kModel;
  }
  // SGLang's router's names (router_endpoints.h), and its older ones.
  if (path == "/server_info" || path == "/get_server_info") return Route::kServerInfo;
  if (path == "/model_info" || path == "/get_model_info") return Route::kModelInfo;
  if (path == "/get_load") return Route::kLoad;
  if (path == "/v1/completions/render") return Route::kCompletionsRender;
  if (path == "/v1/chat/completions/render") return Route::kChatRender;
  if (path == "/v1/completions") return Route::kCompletions;
  if (path == "/v1/chat/completions") return Route::kChatCompletions;
  if (path == "/v1/responses") return Route::kResponses;
  if (path == "/v1/messages") return Route::kMessages;
  return Route::kUnknown;
}

bool Generates(Route route) {
  return route == Route::kCompletions || route == Route::kChatCompletions ||
         route == Route::kResponses || route == Route::kMessages;
}

bool Renders(Route route) {
  return route == Route::kCompletionsRender || route == Route::kChatRender;
}

absl::string_view MethodFor(Route route) {
  return Generates(route) || Renders(route) ? "POST" : "GET";
}

Endpoint EndpointFor(Route route) {
  switch (route) {
    case Route::kChatCompletions:
    case Route::kChatRender:
      return Endpoint::kChatCompletions;
    case Route::kResponses:
      return Endpoint::kResponses;
    case Route::kMessages:
      return Endpoint::kMessages;
    default:
      return Endpoint::kCompletions;
  }
}

// Before SetEngine: the workers are not initialised yet.
absl::Status NotReadyError() {
  return absl::UnavailableError("no model worker is ready yet; retry shortly");
}

// The client's credential: its Authorization header, else Anthropic's x-api-key header
// (what the Messages API's clients send) as a bearer token.
std::string Credential(const HttpRequestHead& head) {
  if (!head.authorization.empty() || head.api_key.empty()) return head.authorization;
  return absl::StrCat("Bearer ", head.api_key);
}

HttpResponse Json200(std::string body) { return {200, kJsonType, std::move(body), {}}; }

// The error in the shape of the endpoint's API (Anthropic's for /v1/messages).
HttpResponse ErrorResponse(const absl::Status& status,
                           Endpoint endpoint = Endpoint::kChatCompletions) {
  HttpResponse response{openai::HttpStatusFor(status),
                        kJsonType,
                        endpoint == Endpoint::kMessages ? openai::MessagesErrorBody(status)
                                                        : openai::ErrorBody(status),
                        {}};
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
// Send and Finish (through the sink of the choice and generation that runs) on its
// delivery thread and must never wait: both only queue, and the first event of a batch
// asks the connection (HttpExchange::Post) to run Drain, which formats everything queued
// by then into one write. Nothing is drained before Begin (the request was admitted and
// the answer may start), so an early token cannot overtake the stream's opening.
//
// With n > 1 the answer has n choices, each a generation of its own; it ends once every
// choice has (a stream's usage chunk and [DONE] come then), or at the first error (the
// other choices are cancelled). A reasoning budget may make a choice two generations
// (phases); the client sees one.
class GenerationSink final : public std::enable_shared_from_this<GenerationSink> {
 public:
  GenerationSink(std::shared_ptr<HttpExchange> exchange, Endpoint endpoint,
                 std::vector<std::unique_ptr<openai::AnswerFormatter>> formatters, bool stream,
                 std::shared_ptr<TokenAuthenticator::Grant> grant,
                 std::optional<Continuation> continuation)
      : exchange_(std::move(exchange)),
        endpoint_(endpoint),
        stream_(stream),
        grant_(std::move(grant)),
        continuation_(std::move(continuation)) {
    for (std::unique_ptr<openai::AnswerFormatter>& formatter : formatters) {
      choices_.push_back(Choice{.formatter = std::move(formatter)});
    }
  }

  // The engine's sink for generation `phase` of choice `index`.
  std::shared_ptr<ResponseSink> ChoiceSink(int index, int phase) {
    class Sink final : public ResponseSink {
     public:
      Sink(std::shared_ptr<GenerationSink> answer, int index, int phase)
          : answer_(std::move(answer)), index_(index), phase_(phase) {}
      void Send(v1::GenerateResponse message) override {
        answer_->Queue({index_, phase_, std::move(message), std::nullopt});
      }
      void Finish(const absl::Status& status) override {
        answer_->Queue({index_, phase_, std::nullopt, status});
      }

     private:
      const std::shared_ptr<GenerationSink> answer_;
      const int index_;
      const int phase_;
    };
    return std::make_shared<Sink>(shared_from_this(), index, phase);
  }

  // The engine accepted the choices (as `engine_ids`): the answer may start.
  void Begin(Engine* engine, const std::vector<uint64_t>& engine_ids) {
    std::lock_guard<std::mutex> lock(mu_);
    engine_ = engine;
    engine_ids_ = engine_ids;
    begun_ = true;
    ScheduleLocked();
  }

  // The client left: cancels the generations that run (and any that would follow).
  void Cancel() {
    std::vector<uint64_t> ids;
    Engine* engine = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      client_gone_ = true;
      ids = engine_ids_;
      engine = engine_;
    }
    for (uint64_t id : ids) engine->Cancel(id);
  }

 private:
  // A message or the end of generation `phase` of choice `index`.
  struct Event {
    int index;
    int phase;
    std::optional<v1::GenerateResponse> message;
    std::optional<absl::Status> finish;
  };

  // Drain's alone (one Drain runs at a time, on the connection's context).
  struct Choice {
    std::unique_ptr<openai::AnswerFormatter> formatter;
    int phase = 0;  // The generation whose events count.
    bool ended = false;
    std::vector<int32_t> generated;  // The first generation's tokens (and the end text's).
    int added_tokens = 0;            // The end text's tokens.
    v1::Usage first_usage;
    v1::Usage usage;  // The whole choice's, once it ended.
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

  void Format(Choice& choice, const v1::GenerateResponse& message, std::string* out) {
    if (stream_) {
      choice.formatter->AppendEvents(message, out);
    } else {
      choice.formatter->Add(message);
    }
  }

  // On the connection's context: the final message of choice `index`'s first generation,
  // which ended at the reasoning budget. Formats it as a message that does not end the
  // choice and starts the second generation; OK when the choice goes on (or ended here),
  // else the error that ends the answer.
  absl::Status Continue(int index, v1::GenerateResponse message, std::string* out) {
    Choice& choice = choices_[index];
    Continuation& c = *continuation_;
    choice.first_usage = message.usage();
    message.clear_usage();
    message.set_finish_reason(v1::FINISH_REASON_UNSPECIFIED);
    Format(choice, message, out);
    if (choice.formatter->reasoning_open()) {
      v1::GenerateResponse end;
      end.set_request_id(message.request_id());
      end.set_text(std::string(openai::kReasoningEndText));
      end.mutable_token_ids()->Add(c.end_ids.begin(), c.end_ids.end());
      Format(choice, end, out);
      choice.generated.insert(choice.generated.end(), c.end_ids.begin(), c.end_ids.end());
      choice.added_tokens = static_cast<int>(c.end_ids.size());
    }
    const int remaining = c.total_max_tokens - static_cast<int>(choice.generated.size());
    if (remaining <= 0) {
      // The end text took the last of max_tokens: the choice ends here (with the first
      // generation's Finish, still to come).
      v1::GenerateResponse last;
      last.set_request_id(message.request_id());
      last.set_finish_reason(v1::FINISH_REASON_LENGTH);
      *last.mutable_usage() = SummedUsage(choice, v1::Usage());
      Format(choice, last, out);
      return absl::OkStatus();
    }
    v1::GenerateRequest g = c.generate;
    g.clear_text();
    g.clear_add_bos();
    g.clear_n();
    // Choice i samples with seed + i (BuildChoices).
    if (g.has_seed()) g.set_seed(g.seed() + static_cast<uint64_t>(index));
    g.mutable_token_ids()->mutable_ids()->Add(c.prompt.begin(), c.prompt.end());
    g.mutable_token_ids()->mutable_ids()->Add(choice.generated.begin(), choice.generated.end());
    g.set_max_new_tokens(remaining);
    ASSIGN_OR_RETURN(std::unique_ptr<Request> r, BuildRequest(g, c.limits, *c.tokenizer));
    r->request_id = c.request_id;
    r->front_end = FrontEnd::kHttp;
    r->sink = ChoiceSink(index, 1);
    ASSIGN_OR_RETURN(const uint64_t id, c.engine->Submit(std::move(r)));
    bool gone = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      engine_ids_[index] = id;
      gone = client_gone_;
    }
    if (gone) c.engine->Cancel(id);
    choice.phase = 1;
    return absl::OkStatus();
  }

  // A continued choice's usage: the first generation's prompt, every generated token
  // (and the end text's), `second`'s timings where it has them.
  static v1::Usage SummedUsage(const Choice& choice, const v1::Usage& second) {
    v1::Usage usage = choice.first_usage;
    usage.set_generated_tokens(choice.first_usage.generated_tokens() + choice.added_tokens +
                               second.generated_tokens());
    usage.set_e2e_latency_ms(
        std::max(choice.first_usage.e2e_latency_ms(), second.e2e_latency_ms()));
    usage.set_preemptions(choice.first_usage.preemptions() + second.preemptions());
    return usage;
  }

  // Applies one event of a choice that has not ended; false when it ends the answer with
  // an error (in `status_`).
  bool Apply(Event& event, std::string* out) {
    Choice& choice = choices_[event.index];
    if (event.finish.has_value()) {
      choice.ended = true;
      ++num_ended_;
      if (event.finish->ok()) return true;
      status_ = *event.finish;
      return false;
    }
    v1::GenerateResponse& message = *event.message;
    const bool final = message.finish_reason() != v1::FINISH_REASON_UNSPECIFIED;
    if (continuation_.has_value() && choice.phase == 0) {
      choice.generated.insert(choice.generated.end(), message.token_ids().begin(),
                              message.token_ids().end());
      if (final && message.finish_reason() == v1::FINISH_REASON_LENGTH &&
          static_cast<int>(choice.generated.size()) < continuation_->total_max_tokens) {
        status_ = Continue(event.index, std::move(message), out);
        return status_.ok();
      }
    }
    if (choice.phase == 1 && final) *message.mutable_usage() = SummedUsage(choice, message.usage());
    if (final) choice.usage = message.usage();
    Format(choice, message, out);
    return true;
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
      for (Choice& choice : choices_) choice.formatter->AppendStart(&out);
      opened_ = true;
    }
    bool failed = false;
    for (Event& event : events) {
      const Choice& choice = choices_[event.index];
      // A generation that was continued has nothing more to say (its Finish).
      if (choice.ended || event.phase != choice.phase) continue;
      if (!Apply(event, &out)) {
        failed = true;
        break;
      }
    }
    const bool ended = failed || num_ended_ == static_cast<int>(choices_.size());
    if (failed) Cancel();  // The other choices are not wanted any more.
    if (stream_) {
      if (ended && !failed) {
        std::vector<v1::Usage> usage;
        for (const Choice& choice : choices_) usage.push_back(choice.usage);
        choices_.front().formatter->AppendEnd(openai::ResponseFormatter::SumUsage(usage), &out);
      }
      // "data: {error}" then the end of the stream, with no [DONE]: how OpenAI's clients
      // learn of a failure after the 200 went out.
      if (failed) out += choices_.front().formatter->ErrorEvents(status_);
      exchange_->Write(std::move(out));
      if (ended) exchange_->EndStream();
    } else if (ended) {
      // The whole answer is waited for, so its HTTP status can still say how it ended.
      std::vector<const openai::AnswerFormatter*> formatters;
      for (const Choice& choice : choices_) formatters.push_back(choice.formatter.get());
      exchange_->Respond(failed ? ErrorResponse(status_, endpoint_)
                                : Json200(formatters.front()->WholeBody(formatters)));
    }
    if (ended) {
      done_ = true;
      grant_->Release();
    }
  }

  const std::shared_ptr<HttpExchange> exchange_;
  const Endpoint endpoint_;
  const bool stream_;
  const std::shared_ptr<TokenAuthenticator::Grant> grant_;
  // Drain's alone.
  std::optional<Continuation> continuation_;
  std::vector<Choice> choices_;
  int num_ended_ = 0;
  absl::Status status_;  // The error that ended the answer.
  bool opened_ = false;
  bool done_ = false;

  std::mutex mu_;
  std::vector<Event> pending_;  // Guarded by mu_, as is everything below.
  bool begun_ = false;
  bool scheduled_ = false;
  bool client_gone_ = false;
  Engine* engine_ = nullptr;
  std::vector<uint64_t> engine_ids_;  // The generation each choice runs.
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

void HttpServer::SetEngine(Engine* engine, const ServingLimits& limits,
                           const v1::ModelInfoResponse& info) {
  limits_ = limits;
  server_info_body_ = openai::ServerInfoBody(info, options_.model_dir);
  model_info_body_ = openai::ModelInfoBody(info, options_.model_dir);
  parse_options_.max_logprobs = limits.max_logprobs;
  engine_.store(engine);
}

void HttpServer::Stop() {
  if (transport_ != nullptr) transport_->Stop();
}

HttpResponse HttpServer::RouterInfo(std::string_view path) const {
  const Route route = Resolve(path);
  // The bodies are written before engine_ is published.
  if (engine_.load() == nullptr) {
    return ErrorResponse(NotReadyError());
  }
  if (route == Route::kServerInfo) return Json200(server_info_body_);
  if (route == Route::kModelInfo) return Json200(model_info_body_);
  if (metrics_ == nullptr) {
    return ErrorResponse(absl::NotFoundError("this server keeps no load figures"));
  }
  const SchedulerMetrics::Load load = metrics_->CurrentLoad();
  return Json200(openai::LoadBody(load.running, load.waiting, load.kv_slots_used));
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
  // What health checks, scrapers and routers poll is open, as on the metrics port:
  // sglang-router asks /server_info, /model_info and /get_load without a token.
  const bool open = route == Route::kHealth || route == Route::kMetrics ||
                    route == Route::kServerInfo || route == Route::kModelInfo ||
                    route == Route::kLoad;
  if (!open && authenticator_ != nullptr) {
    if (absl::Status auth = authenticator_->Authenticate(Credential(head)).status(); !auth.ok()) {
      if (metrics_ != nullptr) metrics_->CountRejected(auth.code(), FrontEnd::kHttp);
      return ErrorResponse(auth, EndpointFor(route));
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
    case Route::kMetrics:
      // The same page as --metrics_port: Kubernetes' endpoint pickers scrape the serving
      // port (docs/scaling.md).
      if (metrics_ == nullptr) {
        return exchange->Respond(
            ErrorResponse(absl::NotFoundError("this server keeps no metrics")));
      }
      return exchange->Respond(
          {200, "text/plain; version=0.0.4; charset=utf-8", metrics_->Page(), {}});
    case Route::kModels:
      return exchange->Respond(Json200(openai::ModelList(options_.model_name, created_unix_s_)));
    case Route::kModel: {
      const std::string model(request.head().path.substr(kModelPrefix.size()));
      if (!openai::ServesModel(parse_options_, model)) {
        return exchange->Respond(ErrorResponse(openai::ModelNotFoundError(model, parse_options_)));
      }
      return exchange->Respond(Json200(openai::ModelObject(options_.model_name, created_unix_s_)));
    }
    case Route::kServerInfo:
    case Route::kModelInfo:
    case Route::kLoad:
      return exchange->Respond(RouterInfo(request.head().path));
    case Route::kCompletionsRender:
    case Route::kChatRender: {
      if (engine_.load() == nullptr) {
        return Reject(NotReadyError(), *exchange);
      }
      const Endpoint endpoint = EndpointFor(Resolve(request.head().path));
      auto owned = std::make_shared<HttpRequest>(std::move(request));
      // The chat template and tokenizing take time in proportion to the body.
      transport_->Offload(
          [this, endpoint, owned, exchange] { Render(endpoint, *owned, *exchange); });
      return;
    }
    case Route::kCompletions:
    case Route::kChatCompletions:
    case Route::kResponses:
    case Route::kMessages:
      break;
    case Route::kUnknown:
      return;  // CheckHead answered it.
  }
  const Endpoint endpoint = EndpointFor(Resolve(request.head().path));
  // One of the token's concurrent-generation slots, held until the answer has ended.
  auto grant = std::make_shared<TokenAuthenticator::Grant>();
  if (authenticator_ != nullptr) {
    absl::StatusOr<TokenAuthenticator::Grant> admitted =
        authenticator_->Admit(Credential(request.head()));
    if (!admitted.ok()) return Reject(admitted.status(), *exchange, endpoint);
    *grant = std::move(*admitted);
  }
  if (engine_.load() == nullptr) {
    return Reject(NotReadyError(), *exchange, endpoint);
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
  absl::StatusOr<std::vector<std::unique_ptr<Request>>> built = openai::BuildOpenAiRequest(
      endpoint, request.body(), parse_options_, chat_, limits_, *tokenizer_, &parsed);
  request.ReleaseBody();
  if (!built.ok()) return Reject(built.status(), *exchange, endpoint);
  std::vector<std::unique_ptr<Request>>& choices = *built;

  const char* prefix = endpoint == Endpoint::kChatCompletions ? "chatcmpl-"
                       : endpoint == Endpoint::kResponses     ? "resp_"
                       : endpoint == Endpoint::kMessages      ? "msg_"
                                                              : "cmpl-";
  const std::string id = absl::StrCat(prefix, next_id_.fetch_add(1));
  std::optional<Continuation> continuation;
  if (parsed.reasoning_budget_tokens > 0) {
    const Request& first = *choices.front();
    continuation.emplace();
    continuation->engine = engine;
    continuation->limits = limits_;
    continuation->tokenizer = tokenizer_;
    continuation->generate = std::move(parsed.generate);
    continuation->prompt.assign(first.tokens.begin(),
                                first.tokens.begin() + first.num_prompt_tokens);
    continuation->end_ids = reasoning_end_ids_;
    continuation->total_max_tokens = parsed.total_max_tokens;
    continuation->request_id = id;
  }
  const int64_t created = UnixSeconds();
  std::vector<std::unique_ptr<openai::AnswerFormatter>> formatters;
  for (size_t i = 0; i < choices.size(); ++i) {
    formatters.push_back(openai::MakeAnswerFormatter(parsed, id, created, options_.model_name,
                                                     static_cast<int>(i),
                                                     choices.front()->num_prompt_tokens));
  }
  auto sink = std::make_shared<GenerationSink>(exchange, endpoint, std::move(formatters),
                                               parsed.stream, grant, std::move(continuation));
  for (size_t i = 0; i < choices.size(); ++i) {
    choices[i]->request_id = id;  // Names the request in the engine's log lines.
    choices[i]->front_end = FrontEnd::kHttp;
    choices[i]->sink = sink->ChoiceSink(static_cast<int>(i), 0);
  }
  absl::StatusOr<std::vector<uint64_t>> engine_ids = engine->SubmitChoices(std::move(choices));
  if (!engine_ids.ok()) return Reject(engine_ids.status(), *exchange, endpoint);
  sink->Begin(engine, *engine_ids);
  // A client that leaves frees its request's KV blocks at the next step.
  exchange->OnClientGone([weak = std::weak_ptr<GenerationSink>(sink), grant] {
    if (std::shared_ptr<GenerationSink> answer = weak.lock()) answer->Cancel();
    grant->Release();
  });
}

void HttpServer::Render(Endpoint endpoint, HttpRequest& request, HttpExchange& exchange) {
  openai::ParsedRequest parsed;
  absl::StatusOr<std::vector<std::unique_ptr<Request>>> built = openai::BuildOpenAiRequest(
      endpoint, request.body(), parse_options_, chat_, limits_, *tokenizer_, &parsed);
  request.ReleaseBody();
  if (!built.ok()) return Reject(built.status(), exchange, endpoint);
  const Request& first = *built->front();
  const std::vector<int32_t> prompt(first.tokens.begin(),
                                    first.tokens.begin() + first.num_prompt_tokens);
  const std::string id = absl::StrCat(
      endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", next_id_.fetch_add(1));
  exchange.Respond(Json200(openai::RenderBody(endpoint, id, options_.model_name, prompt,
                                              parsed.generate, parsed.stream)));
}

void HttpServer::Reject(const absl::Status& status, HttpExchange& exchange,
                        Endpoint endpoint) const {
  if (metrics_ != nullptr) metrics_->CountRejected(status.code(), FrontEnd::kHttp);
  exchange.Respond(ErrorResponse(status, endpoint));
}

}  // namespace conveyor::scheduler
