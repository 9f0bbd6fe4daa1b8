// The OpenAI-compatible HTTP front end of the scheduler process (docs/http-api.md):
// POST /v1/completions and /v1/chat/completions (one JSON body, or Server-Sent Events with
// "stream": true), GET /v1/models and GET /health, served by cpp-httplib beside the gRPC
// API. Each request becomes a GenerateRequest that goes through the same BuildRequest and
// Engine::Submit as a gRPC one, so validation, limits and metrics are shared; the
// JSON <-> proto mapping is openai_protocol.h.
//
// Threads: httplib serves each connection on one thread of a pool that grows on demand up
// to Options::max_threads. The engine's thread only queues messages for a request (its
// ResponseSink never blocks); the connection's thread waits for them and writes. A stream
// whose client has gone (a failed write, or the socket found closed while waiting) is
// cancelled in the engine, which frees its KV blocks at the next step.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/jinja/chat_template.h"
#include "common/tokenizer.h"
#include "scheduler/engine.h"
#include "scheduler/http/openai_protocol.h"
#include "scheduler/metrics.h"
#include "scheduler/request_builder.h"
#include "scheduler/token_auth.h"

namespace httplib {
class Server;
struct Request;
struct Response;
}  // namespace httplib

namespace conveyor::scheduler {

class ReloadingTlsIdentity;

class HttpServer {
 public:
  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;  // 0 picks a free port (port() tells which).
    // Connections served at once: one thread each, started as connections arrive. Further
    // connections wait, accepted, until a thread is free.
    int max_threads = 256;
    // Larger request bodies are refused (413) before they are read.
    size_t max_body_bytes = 16 << 20;
    // The model directory (for the chat template's special tokens), the name responses
    // give the model, and the other names a request's "model" may use.
    std::string model_dir;
    std::string model_name;
    std::vector<std::string> model_aliases;
    // The model's chat template (jinja::LoadChatTemplate); null when it has none, which
    // makes chat requests 400. Must outlive the server.
    const jinja::ChatTemplate* chat_template = nullptr;
  };

  // `tokenizer` and `metrics` (nullable) must outlive the server.
  HttpServer(Options options, const Tokenizer* tokenizer, SchedulerMetrics* metrics);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Requires a bearer token (the Authorization header) on every /v1 request: 401 without
  // a valid one, 429 when the token's concurrent generations are all in use. /health
  // stays open. Must be called before Start; `authenticator` must outlive the server.
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
  int port() const { return port_; }

  // Makes generation possible with `engine` (which must outlive the server's Stop) under
  // `limits`.
  void SetEngine(Engine* engine, const ServingLimits& limits);
  // What /health answers: 200 while serving, 503 otherwise (gRPC health's SERVING).
  void SetServing(bool serving) { serving_.store(serving); }

  // Stops listening, ends open streams and waits for the connection threads. Idempotent.
  void Stop();

 private:
  void HandleGenerate(openai::Endpoint endpoint, const httplib::Request& req,
                      httplib::Response& res);
  // Parses, renders (chat) and builds the engine request; errors are the client's answer.
  absl::StatusOr<std::unique_ptr<Request>> Prepare(openai::Endpoint endpoint, std::string_view body,
                                                   openai::ParsedRequest* parsed) const;
  absl::Status RenderChat(openai::ParsedRequest* parsed) const;
  void Reject(const absl::Status& status, httplib::Response& res) const;
  absl::Status Authenticate(const httplib::Request& req) const;
  // httplib's server, plain or TLS as configured.
  absl::StatusOr<std::unique_ptr<httplib::Server>> MakeListener() const;

  const Options options_;
  const Tokenizer* tokenizer_;
  SchedulerMetrics* metrics_;
  TokenAuthenticator* authenticator_ = nullptr;
  std::string tls_cert_file_, tls_key_file_, tls_client_ca_file_;
  int tls_refresh_s_ = 60;
  // Before server_, which refers to it: destroyed after it.
  std::unique_ptr<ReloadingTlsIdentity> tls_identity_;
  const int64_t created_unix_s_;  // Start-up time: the model's "created".

  // Set by Start.
  std::string bos_token_;  // Special tokens' text, for the chat template.
  std::string eos_token_;

  std::atomic<Engine*> engine_{nullptr};
  ServingLimits limits_;  // Written by SetEngine before engine_ is published.
  openai::ParseOptions parse_options_;
  std::atomic<bool> serving_{false};
  std::atomic<uint64_t> next_id_{1};

  std::unique_ptr<httplib::Server> server_;
  int port_ = 0;
  std::thread listener_;
  std::atomic<bool> stopped_{false};
};

}  // namespace conveyor::scheduler
