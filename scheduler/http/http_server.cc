#include "scheduler/http/http_server.h"

#include <sys/socket.h>

#include <chrono>
#include <condition_variable>
#include <csignal>
#include <fstream>
#include <mutex>
#include <sstream>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/jinja/chat_template.h"
#include "common/status_macros.h"
#include "httplib.h"
#include "scheduler/client_api.h"
#include "scheduler/http/growing_task_queue.h"
#include "scheduler/http/tls_identity.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {
namespace {

using openai::Endpoint;
using openai::Json;

// Pending connections the kernel holds before accept (httplib's build listens with 5,
// which a burst of clients opening their streams at once overflows into SYN retries).
constexpr int kListenBacklog = 1024;
// How long a stream waits for the engine before it checks that its client is still
// there; a closed connection is noticed within this even when no token is due.
constexpr auto kStreamPollInterval = std::chrono::milliseconds(100);
// How long an idle keep-alive connection is kept. httplib's thread polls an idle
// connection every ~10 ms (measured: 100 idle connections cost 18% of a core), so idle
// ones are closed after 2 s instead of its 5; a client reconnects when it comes back.
constexpr time_t kKeepAliveTimeoutS = 2;
// httplib's build compresses bodies of exactly "application/json" when the client accepts
// br or gzip. Answers are small and compressing them is scheduler CPU for nothing, so the
// type carries its charset (also true) and goes out as it is. (SSE is never compressed.)
constexpr char kJsonType[] = "application/json; charset=utf-8";

// httplib's server (plain or TLS) with the listen backlog raised (its build fixes it at
// 5; listen() on a listening socket just updates the backlog).
template <typename Base>
class Listener final : public Base {
 public:
  using Base::Base;
  bool RaiseBacklog(int backlog) { return ::listen(this->svr_sock_, backlog) == 0; }
};

// One request's answer on its way from the engine to the connection's thread. The engine
// calls Send/Finish on its delivery thread and must never wait: both only queue and notify.
class ResponseQueue final : public ResponseSink {
 public:
  void Send(v1::GenerateResponse message) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      messages_.push_back(std::move(message));
    }
    ready_.notify_one();
  }

  void Finish(const absl::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      status_ = status;
      ended_ = true;
    }
    ready_.notify_one();
  }

  // Waits until a message or the end arrives, or `timeout` passes; moves what arrived to
  // `out`. Returns true once the answer has ended, with its status in `status`.
  bool Wait(std::chrono::milliseconds timeout, std::vector<v1::GenerateResponse>* out,
            absl::Status* status) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait_for(lock, timeout, [&] { return ended_ || !messages_.empty(); });
    for (v1::GenerateResponse& m : messages_) out->push_back(std::move(m));
    messages_.clear();
    if (ended_) *status = status_;
    return ended_;
  }

  // Waits for the whole answer.
  absl::Status WaitAll(std::vector<v1::GenerateResponse>* out) {
    std::unique_lock<std::mutex> lock(mu_);
    ready_.wait(lock, [&] { return ended_; });
    for (v1::GenerateResponse& m : messages_) out->push_back(std::move(m));
    messages_.clear();
    return status_;
  }

  bool ended() {
    std::lock_guard<std::mutex> lock(mu_);
    return ended_;
  }

 private:
  std::mutex mu_;
  std::condition_variable ready_;
  std::vector<v1::GenerateResponse> messages_;
  bool ended_ = false;
  absl::Status status_;
};

// A streaming response: httplib calls Pump until it returns false or the sink is done,
// then Close, on the connection's thread.
class EventStream {
 public:
  EventStream(Engine* engine, uint64_t id, std::shared_ptr<ResponseQueue> queue,
              openai::ResponseFormatter formatter)
      : engine_(engine), id_(id), queue_(std::move(queue)), formatter_(std::move(formatter)) {}

  bool Pump(httplib::DataSink& sink) {
    std::string out;
    if (!started_) {
      formatter_.AppendStart(&out);
      started_ = true;
    }
    absl::Status status;
    messages_.clear();
    const bool ended = queue_->Wait(kStreamPollInterval, &messages_, &status);
    for (const v1::GenerateResponse& m : messages_) formatter_.AppendEvents(m, &out);
    // "data: {error}" then the end of the stream, with no [DONE]: how OpenAI's clients
    // learn of a failure after the 200 went out.
    if (ended && !status.ok()) out += openai::ErrorEvent(status);
    // Everything that arrived goes out in one write. A failed write, or a socket found
    // closed while nothing was due, means the client left: Close cancels the request.
    if (!out.empty() ? !sink.write(out.data(), out.size()) : !sink.is_writable()) return false;
    if (ended) sink.done();
    return true;
  }

  // The response is over, sent or not. A request still running has lost its client.
  void Close() {
    if (!queue_->ended()) engine_->Cancel(id_);
  }

 private:
  Engine* const engine_;
  const uint64_t id_;
  const std::shared_ptr<ResponseQueue> queue_;
  openai::ResponseFormatter formatter_;
  std::vector<v1::GenerateResponse> messages_;
  bool started_ = false;
};

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SetJson(httplib::Response& res, int status, const std::string& body) {
  res.status = status;
  res.set_content(body, kJsonType);
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

}  // namespace

HttpServer::HttpServer(Options options, const Tokenizer* tokenizer, SchedulerMetrics* metrics)
    : options_(std::move(options)),
      tokenizer_(tokenizer),
      metrics_(metrics),
      created_unix_s_(UnixSeconds()) {
  parse_options_.model_name = options_.model_name;
  parse_options_.model_aliases = options_.model_aliases;
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
  std::tie(bos_token_, eos_token_) = TemplateSpecialTokens(options_.model_dir, *tokenizer_);

  // httplib's build sends without MSG_NOSIGNAL: writing to a client that has gone would
  // raise SIGPIPE and kill the process. Ignored, the write fails and the stream ends.
  std::signal(SIGPIPE, SIG_IGN);

  std::unique_ptr<httplib::Server> server;
  std::function<bool(int)> raise_backlog;
  if (!tls_cert_file_.empty()) {
    ASSIGN_OR_RETURN(tls_identity_,
                     ReloadingTlsIdentity::Load(tls_cert_file_, tls_key_file_, tls_refresh_s_));
    auto tls = std::make_unique<Listener<httplib::SSLServer>>([this](SSL_CTX& ctx) {
      SSL_CTX_set_min_proto_version(&ctx, TLS1_2_VERSION);
      SSL_CTX_set_options(&ctx, SSL_OP_NO_COMPRESSION | SSL_OP_NO_RENEGOTIATION);
      tls_identity_->Install(&ctx);
      if (tls_client_ca_file_.empty()) return true;
      if (SSL_CTX_load_verify_locations(&ctx, tls_client_ca_file_.c_str(), nullptr) != 1) {
        return false;
      }
      SSL_CTX_set_client_CA_list(&ctx, SSL_load_client_CA_file(tls_client_ca_file_.c_str()));
      SSL_CTX_set_verify(&ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
      return true;
    });
    if (!tls->is_valid()) {
      return absl::InvalidArgumentError(
          absl::StrCat("HTTPS: cannot use the client CA ", tls_client_ca_file_));
    }
    raise_backlog = [p = tls.get()](int backlog) { return p->RaiseBacklog(backlog); };
    server = std::move(tls);
  } else {
    auto plain = std::make_unique<Listener<httplib::Server>>();
    raise_backlog = [p = plain.get()](int backlog) { return p->RaiseBacklog(backlog); };
    server = std::move(plain);
  }
  const size_t max_threads = static_cast<size_t>(std::max(1, options_.max_threads));
  server->new_task_queue = [max_threads] { return new GrowingTaskQueue(max_threads); };
  server->set_payload_max_length(options_.max_body_bytes);
  // A token is a few dozen bytes: send each at once rather than wait for the last ACK.
  server->set_tcp_nodelay(true);
  server->set_keep_alive_timeout(kKeepAliveTimeoutS);

  server->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kCompletions, req, res);
  });
  server->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(Endpoint::kChatCompletions, req, res);
  });
  server->Get("/v1/models", [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::Status auth = Authenticate(req); !auth.ok()) return Reject(auth, res);
    SetJson(res, 200, openai::ModelList(options_.model_name, created_unix_s_));
  });
  server->Get("/v1/models/(.+)", [this](const httplib::Request& req, httplib::Response& res) {
    if (absl::Status auth = Authenticate(req); !auth.ok()) return Reject(auth, res);
    const std::string model = req.matches[1];
    if (!openai::ServesModel(parse_options_, model)) {
      return Reject(openai::ModelNotFoundError(model, parse_options_), res);
    }
    SetJson(res, 200, openai::ModelObject(options_.model_name, created_unix_s_));
  });
  server->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool serving = serving_.load();
    SetJson(res, serving ? 200 : 503,
            serving ? R"({"status":"serving"})" : R"({"status":"not_serving"})");
  });
  // Unknown routes (and httplib's own 4xx, e.g. 413) get OpenAI's error shape too.
  server->set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        const absl::Status status =
            res.status == 404
                ? openai::WithCode(absl::NotFoundError(absl::StrCat(
                                       "Unknown request URL: ", req.method, " ", req.path)),
                                   "unknown_url")
                : absl::InvalidArgumentError(
                      absl::StrCat("the request was refused (HTTP ", res.status, ")"));
        res.set_content(openai::ErrorBody(status), kJsonType);
        return httplib::Server::HandlerResponse::Handled;
      }));
  // Handlers do not throw; this keeps even a bad_alloc in the error shape.
  server->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, const std::exception_ptr&) {
        SetJson(res, 500, openai::ErrorBody(absl::InternalError("internal error")));
      });

  const int port = options_.port == 0
                       ? server->bind_to_any_port(options_.host)
                       : (server->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  if (port <= 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen for HTTP on ", options_.host, ":", options_.port));
  }
  if (!raise_backlog(kListenBacklog)) {
    spdlog::warn("HTTP: cannot raise the listen backlog; bursts of connections may wait");
  }
  port_ = port;
  server_ = std::move(server);
  listener_ = std::thread([this] { server_->listen_after_bind(); });
  // httplib's stop() does nothing until its loop runs, so a Stop right after Start would
  // leave the listener running and the join waiting forever.
  for (int i = 0; i < 5000 && !server_->is_running(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!server_->is_running()) {
    return absl::InternalError("the HTTP server did not start listening");
  }
  return absl::OkStatus();
}

void HttpServer::SetEngine(Engine* engine, const ServingLimits& limits) {
  limits_ = limits;
  parse_options_.max_logprobs = limits.max_logprobs;
  engine_.store(engine);
}

void HttpServer::Stop() {
  if (stopped_.exchange(true) || server_ == nullptr) return;
  server_->stop();
  if (listener_.joinable()) listener_.join();
}

absl::Status HttpServer::Authenticate(const httplib::Request& req) const {
  if (authenticator_ == nullptr) return absl::OkStatus();
  return authenticator_->Authenticate(req.get_header_value("Authorization")).status();
}

void HttpServer::Reject(const absl::Status& status, httplib::Response& res) const {
  if (absl::IsUnauthenticated(status)) res.set_header("WWW-Authenticate", "Bearer");
  SetJson(res, openai::HttpStatusFor(status), openai::ErrorBody(status));
}

absl::Status HttpServer::RenderChat(openai::ParsedRequest* parsed) const {
  if (options_.chat_template == nullptr) {
    return openai::WithParam(
        absl::InvalidArgumentError(
            "the model has no chat template (no chat_template.jinja, and no chat_template in "
            "tokenizer_config.json); use /v1/completions"),
        "messages");
  }
  absl::StatusOr<std::string> prompt =
      options_.chat_template->Render(openai::ChatTemplateContext(*parsed, bos_token_, eos_token_));
  if (!prompt.ok()) {
    // Templates reject conversations they cannot format (raise_exception): InvalidArgument,
    // the client's to fix.
    return openai::WithParam(
        absl::Status(prompt.status().code(),
                     absl::StrCat("the chat template failed: ", prompt.status().message())),
        "messages");
  }
  openai::SetChatPrompt(*std::move(prompt), &parsed->generate);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Request>> HttpServer::Prepare(Endpoint endpoint,
                                                             std::string_view body,
                                                             openai::ParsedRequest* parsed) const {
  ASSIGN_OR_RETURN(*parsed, openai::ParseRequest(endpoint, body, parse_options_));
  if (endpoint == Endpoint::kChatCompletions) RETURN_IF_ERROR(RenderChat(parsed));
  absl::StatusOr<std::unique_ptr<Request>> built =
      BuildRequest(parsed->generate, limits_, *tokenizer_);
  if (!built.ok()) return openai::RenameBuildError(built.status());
  return built;
}

void HttpServer::HandleGenerate(Endpoint endpoint, const httplib::Request& req,
                                httplib::Response& res) {
  auto reject = [&](const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->CountRejected(status.code(), ClientApi::kHttp);
    Reject(status, res);
  };
  // One of the token's concurrent-generation slots, held until the answer has been sent.
  auto grant = std::make_shared<TokenAuthenticator::Grant>();
  if (authenticator_ != nullptr) {
    absl::StatusOr<TokenAuthenticator::Grant> admitted =
        authenticator_->Admit(req.get_header_value("Authorization"));
    if (!admitted.ok()) return reject(admitted.status());
    *grant = std::move(*admitted);
  }
  Engine* engine = engine_.load();
  if (engine == nullptr) {
    return reject(absl::UnavailableError("no model worker is ready yet; retry shortly"));
  }
  openai::ParsedRequest parsed;
  absl::StatusOr<std::unique_ptr<Request>> built = Prepare(endpoint, req.body, &parsed);
  if (!built.ok()) return reject(built.status());

  const std::string id = absl::StrCat(
      endpoint == Endpoint::kChatCompletions ? "chatcmpl-" : "cmpl-", next_id_.fetch_add(1));
  std::unique_ptr<Request> r = std::move(*built);
  r->request_id = id;  // Names the request in the engine's log lines.
  r->api = ClientApi::kHttp;
  auto queue = std::make_shared<ResponseQueue>();
  r->sink = queue;
  absl::StatusOr<uint64_t> engine_id = engine->Submit(std::move(r));
  if (!engine_id.ok()) return reject(engine_id.status());

  openai::ResponseFormatter formatter(parsed, id, UnixSeconds(), options_.model_name);
  if (!parsed.stream) {
    // The whole answer is waited for here, so its HTTP status can still say how it ended.
    // (Without a content provider httplib gives no way to see the client leave.)
    std::vector<v1::GenerateResponse> messages;
    const absl::Status status = queue->WaitAll(&messages);
    if (!status.ok()) return Reject(status, res);
    for (const v1::GenerateResponse& m : messages) formatter.Add(m);
    return SetJson(res, 200, formatter.Body());
  }
  auto stream = std::make_shared<EventStream>(engine, *engine_id, queue, std::move(formatter));
  res.status = 200;
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [stream](size_t /*offset*/, httplib::DataSink& sink) { return stream->Pump(sink); },
      [stream, grant](bool /*success*/) {
        stream->Close();
        grant->Release();
      });
}

}  // namespace conveyor::scheduler
