// The OpenAI-compatible HTTP front end of the scheduler process (docs/http-api.md):
// POST /v1/completions and /v1/chat/completions (one JSON body, or Server-Sent Events with
// "stream": true), GET /v1/models and GET /health, on the event-driven transport of
// http_transport.h beside the gRPC API. Each request becomes a GenerateRequest that goes
// through the same BuildRequest and Engine::Submit as a gRPC one, so validation, limits and
// metrics are shared; the JSON <-> proto mapping is openai_protocol.h.
//
// Threads: routing, /health and /v1/models run on the transport's I/O threads; parsing a
// body (within JsonLimits), rendering the chat template and tokenizing run on its offload
// pool, so a 16 MiB prompt never delays another connection. The engine's delivery thread
// only queues a request's messages (GenerationSink never blocks) and asks the connection
// to format and write them; messages that arrive while a write is in flight go out
// together. A client that leaves (closed or reset connection, a stream it stops reading)
// has its request cancelled in the engine, which frees its KV blocks at the next step:
// streamed or not.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "scheduler/engine.h"
#include "scheduler/http/http_transport.h"
#include "scheduler/http/openai_protocol.h"
#include "scheduler/http/openai_request.h"
#include "scheduler/metrics.h"
#include "scheduler/request_builder.h"
#include "scheduler/token_auth.h"
#include "text/bounded_json.h"
#include "text/jinja/chat_template.h"
#include "text/tokenizer.h"

namespace conveyor::scheduler {

class ReloadingTlsIdentity;

class HttpServer final : private HttpHandler {
 public:
  struct Options {
    // Address, threads, connection cap, size limits and timeouts. Its configure_tls and
    // observers are the server's to set (SetTls, the metrics).
    HttpTransport::Options transport;
    // How deep and how large a request's JSON may be.
    JsonLimits json_limits;
    // The model directory or .gguf file (for the chat template's special tokens), the name
    // responses give the model, and the other names a request's "model" may use.
    std::string model_dir;
    std::string model_name;
    std::vector<std::string> model_aliases;
    // The model's chat template and its "tool_use" template (jinja::LoadChatTemplates);
    // null when it has none (chat requests are then 400; requests with tools render
    // through chat_template). Both must outlive the server.
    const jinja::ChatTemplate* chat_template = nullptr;
    const jinja::ChatTemplate* tool_use_template = nullptr;
    // --tool_call_format: a format's name, or "auto" (recognised from the template).
    std::string tool_call_format = "auto";
    // --reasoning_parser: a parser's name, or "auto" (recognised from the template), and
    // --max_reasoning_tokens, the budget of chat requests that set none (0: none).
    std::string reasoning_parser = "auto";
    int max_reasoning_tokens = 0;
  };

  // `tokenizer` and `metrics` (nullable) must outlive the server.
  HttpServer(Options options, const Tokenizer* tokenizer, SchedulerMetrics* metrics);
  ~HttpServer() override;
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Requires a bearer token (the Authorization header) on every /v1 request: 401 without
  // a valid one (before its body is read), 429 when the token's concurrent generations
  // are all in use. /health, /metrics and the routers' /server_info, /model_info and
  // /get_load stay open. Must be called before Start; `authenticator` must outlive the
  // server.
  void SetAuthenticator(TokenAuthenticator* authenticator);

  // Serves HTTPS with this certificate and key (PEM files), read at Start and again when
  // they change (checked at most every `refresh_s` seconds); with `client_ca_file` a
  // client must present a certificate it issued (mTLS; that file is read once). Must be
  // called before Start.
  void SetTls(std::string cert_file, std::string key_file, std::string client_ca_file,
              int refresh_s);

  // Binds and starts serving. Until SetEngine, generation answers 503.
  absl::Status Start();
  // The bound port (after Start).
  int port() const;

  // Makes generation possible with `engine` under `limits`; `info` is the replica's model
  // and shape, as the routers' info endpoints answer it. The engine must be stopped (every
  // request finished) before Stop, and outlive it.
  void SetEngine(Engine* engine, const ServingLimits& limits, const v1::ModelInfoResponse& info);
  // What /health answers: 200 while serving, 503 otherwise (gRPC health's SERVING).
  void SetServing(bool serving) { serving_.store(serving); }

  // Stops listening, lets answers in progress end briefly, closes every connection and
  // joins the threads. Idempotent.
  void Stop();

 private:
  // HttpHandler.
  std::optional<HttpResponse> CheckHead(const HttpRequestHead& head) override;
  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override;
  std::string ErrorBody(int status, std::string_view message) override;
  // GET /server_info, /model_info or /get_load (`path`): for the routers.
  HttpResponse RouterInfo(std::string_view path) const;

  // A generation request, on the offload pool from parsing to Submit.
  void Generate(openai::Endpoint endpoint, HttpRequest& request,
                const std::shared_ptr<HttpExchange>& exchange,
                const std::shared_ptr<TokenAuthenticator::Grant>& grant);
  // POST /v1/completions/render or /v1/chat/completions/render (router_endpoints.h), on
  // the offload pool.
  void Render(openai::Endpoint endpoint, HttpRequest& request, HttpExchange& exchange);
  // The error answer for `status`, counted as a rejected HTTP request.
  // Answers `status` in the shape of `endpoint`'s API.
  void Reject(const absl::Status& status, HttpExchange& exchange,
              openai::Endpoint endpoint = openai::Endpoint::kChatCompletions) const;

  Options options_;
  const Tokenizer* tokenizer_;
  SchedulerMetrics* metrics_;
  TokenAuthenticator* authenticator_ = nullptr;
  std::string tls_cert_file_, tls_key_file_, tls_client_ca_file_;
  int tls_refresh_s_ = 60;
  // Before transport_, which refers to it: destroyed after it.
  std::unique_ptr<ReloadingTlsIdentity> tls_identity_;
  const int64_t created_unix_s_;  // Start-up time: the model's "created".

  openai::ChatTemplating chat_;  // Its special tokens are set by Start.
  // The tokens of openai::kReasoningEndText, which end reasoning at its budget.
  std::vector<int32_t> reasoning_end_ids_;

  std::atomic<Engine*> engine_{nullptr};
  // Written by SetEngine before engine_ is published.
  ServingLimits limits_;
  std::string server_info_body_, model_info_body_;
  openai::ParseOptions parse_options_;
  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> next_id_{1};

  std::unique_ptr<HttpTransport> transport_;
};

}  // namespace conveyor::scheduler
