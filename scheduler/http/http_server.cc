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

// The text a chat template gets as bos_token and eos_token: tokenizer_config.json's, as
// Hugging Face passes them, else the tokenizer's pieces for its BOS and EOS ids.
std::pair<std::string, std::string> TemplateSpecialTokens(const std::string& model_dir,
                                                          const Tokenizer& tokenizer) {
  std::ifstream in(model_dir + "/tokenizer_config.json");
  std::stringstream text;
  text << in.rdbuf();
  const Json config = Json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  std::string bos = config.is_object() ? ConfigToken(config, "bos_token") : "";
  std::string eos = config.is_object() ? ConfigToken(config, "eos_token") : "";
  if (bos.empty() && tokenizer.bos_id() >= 0) bos = tokenizer.Piece(tokenizer.bos_id());
  if (eos.empty() && tokenizer.eos_id() >= 0) eos = tokenizer.Piece(tokenizer.eos_id());
  return {std::move(bos), std::move(eos)};
}

// One request's answer on its way from the engine to its connection. The engine calls
// Send and Finish on its delivery thread and must never wait: both only queue, and the
// first message of a batch asks the connection (HttpExchange::Post) to run Drain, which
// formats everything queued by then into one write. Nothing is drained before Begin (the
// request was admitted and the answer may start), so an early token cannot overtake the
// stream's opening.
class GenerationSink final : public ResponseSink,
                             public std::enable_shared_from_this<GenerationSink> {
 public:
  GenerationSink(std::shared_ptr<HttpExchange> exchange, openai::ResponseFormatter formatter,
                 bool stream, std::shared_ptr<TokenAuthenticator::Grant> grant)
      : exchange_(std::move(exchange)),
        formatter_(std::move(formatter)),
        stream_(stream),
        grant_(std::move(grant)) {}

  void Send(v1::GenerateResponse message) override {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(std::move(message));
    ScheduleLocked();
  }

  void Finish(const absl::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    ended_ = true;
    ScheduleLocked();
  }

  // The engine accepted the request: the answer may start.
  void Begin() {
    std::lock_guard<std::mutex> lock(mu_);
    begun_ = true;
    ScheduleLocked();
  }

 private:
  void ScheduleLocked() {
    if (!begun_ || scheduled_) return;
    scheduled_ = true;
    exchange_->Post([self = shared_from_this()] { self->Drain(); });
  }

  // On the connection's context.
  void Drain() {
    std::vector<v1::GenerateResponse> messages;
    absl::Status status;
    bool ended = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      messages.swap(pending_);
      status = status_;
      ended = ended_;
      scheduled_ = false;
    }
    if (done_) return;
    if (stream_) {
      std::string out;
      if (!opened_) {
        exchange_->StartStream(200, "text/event-stream", {{"Cache-Control", "no-cache"}});
        formatter_.AppendStart(&out);
        opened_ = true;
      }
      for (const v1::GenerateResponse& m : messages) formatter_.AppendEvents(m, &out);
      // "data: {error}" then the end of the stream, with no [DONE]: how OpenAI's clients
      // learn of a failure after the 200 went out.
      if (ended && !status.ok()) out += openai::ErrorEvent(status);
      exchange_->Write(std::move(out));
      if (ended) exchange_->EndStream();
    } else {
      // The whole answer is waited for, so its HTTP status can still say how it ended.
      for (const v1::GenerateResponse& m : messages) formatter_.Add(m);
      if (ended) {
        exchange_->Respond(status.ok() ? Json200(formatter_.Body()) : ErrorResponse(status));
      }
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
  bool opened_ = false;
  bool done_ = false;

  std::mutex mu_;
  std::vector<v1::GenerateResponse> pending_;  // Guarded by mu_, as is everything below.
  absl::Status status_;
  bool ended_ = false;
  bool begun_ = false;
  bool scheduled_ = false;
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
  if (chat_.chat_template != nullptr) {
    chat_.renders_tools =
        openai::TemplateRendersTools(*chat_.chat_template, chat_.bos_token, chat_.eos_token);
    if (chat_.renders_tools && !chat_.tool_call_format.has_value()) {
      absl::StatusOr<openai::ToolCallFormat> guessed =
          openai::GuessToolCallFormat(chat_.chat_template->source());
      if (guessed.ok()) chat_.tool_call_format = *guessed;
    }
    spdlog::info("chat template: tools {}, tool calls parsed as {}",
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
  auto sink = std::make_shared<GenerationSink>(
      exchange, openai::ResponseFormatter(parsed, id, UnixSeconds(), options_.model_name),
      parsed.stream, grant);
  r->sink = sink;
  absl::StatusOr<uint64_t> engine_id = engine->Submit(std::move(r));
  if (!engine_id.ok()) return Reject(engine_id.status(), *exchange);
  // A client that leaves frees its request's KV blocks at the next step.
  exchange->OnClientGone([engine, id = *engine_id, grant] {
    engine->Cancel(id);
    grant->Release();
  });
  sink->Begin();
}

void HttpServer::Reject(const absl::Status& status, HttpExchange& exchange) const {
  if (metrics_ != nullptr) metrics_->CountRejected(status.code(), FrontEnd::kHttp);
  exchange.Respond(ErrorResponse(status));
}

}  // namespace conveyor::scheduler
