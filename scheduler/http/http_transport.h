// HTTP/1.1 connections for the scheduler's OpenAI-compatible front (docs/http-api.md), on
// Boost.Beast's parser and Boost.Asio's event loop: a connection costs memory, not a
// thread. A few I/O threads serve every connection; the application's handler runs on
// them and must not block (HttpTransport::Offload runs slow work on a separate pool).
//
// What one client can make the process hold is bounded, whatever it sends:
//   - connections: at most max_connections open. At the cap, a new connection closes the
//     one that has waited longest without a request (idle, or still sending headers);
//     only when every connection has a request in progress is it answered 503;
//   - time: idle_timeout until a request's first byte, header_timeout for its headers,
//     body_timeout for its body (408 when either runs out), send_timeout for a write the
//     client does not read;
//   - memory: max_header_bytes (431), max_body_bytes for every framing, Content-Length and
//     chunked alike (413; a declared length over it is refused before a byte of the body
//     is read), max_buffered_body_bytes for all bodies being read or parsed at once (503),
//     and max_unsent_bytes of a streamed answer the client has not read (it is dropped as
//     too slow a reader, and its request cancelled).
// Each refusal is counted (Options::on_refused) and answered in the handler's error shape.
//
// Nothing here knows OpenAI or the engine: a request reaches HttpHandler whole, and its
// answer goes back through an HttpExchange, whole or streamed, from any thread.
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <cstddef>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/status.h"

namespace conveyor::scheduler {

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// A whole answer.
struct HttpResponse {
  int status = 200;
  std::string content_type;
  std::string body;
  HttpHeaders headers;  // Beyond Content-Type, Content-Length and Connection.
};

// What is known of a request before its body is read.
struct HttpRequestHead {
  std::string method;         // "GET", "POST", ...
  std::string path;           // The target without its query.
  std::string authorization;  // The Authorization header ("" without one).
  std::string api_key;        // The x-api-key header, Anthropic's clients' credential.
};

// A request whose body has been read. Holds its body's share of the transport's
// buffered-body budget until ReleaseBody or destruction: release it as soon as the body
// has been parsed.
class HttpRequest {
 public:
  HttpRequest(HttpRequestHead head, std::string body, std::shared_ptr<void> budget_share)
      : head_(std::move(head)), body_(std::move(body)), budget_share_(std::move(budget_share)) {}
  HttpRequest(HttpRequest&&) = default;
  HttpRequest& operator=(HttpRequest&&) = default;

  const HttpRequestHead& head() const { return head_; }
  std::string_view body() const { return body_; }
  // Frees the body and returns its bytes to the budget.
  void ReleaseBody() {
    std::string().swap(body_);
    budget_share_.reset();
  }

 private:
  HttpRequestHead head_;
  std::string body_;
  std::shared_ptr<void> budget_share_;
};

// One request's answer, on its connection. Every method may be called from any thread;
// calls take effect in the order made. After the answer has ended (Respond, EndStream) or
// the client has gone, further calls do nothing.
class HttpExchange {
 public:
  virtual ~HttpExchange() = default;

  // Runs `task` after the caller returns, on the connection's context: one task at a time,
  // in order, never concurrently with the connection's own callbacks.
  virtual void Post(std::function<void()> task) = 0;
  // The whole answer.
  virtual void Respond(HttpResponse response) = 0;
  // A streamed answer: status and headers now (chunked on HTTP/1.1), then each Write as it
  // comes, then EndStream. What the client has not read yet is buffered up to
  // max_unsent_bytes; past that the client counts as gone.
  virtual void StartStream(int status, std::string content_type, HttpHeaders headers) = 0;
  virtual void Write(std::string data) = 0;
  virtual void EndStream() = 0;
  // `callback` runs once, on the connection's context, if the client goes away (closes,
  // resets, reads too slowly, or the server stops) before the answer has ended; at once if
  // it has already gone. A later call replaces an earlier callback.
  virtual void OnClientGone(std::function<void()> callback) = 0;
};

class HttpHandler {
 public:
  virtual ~HttpHandler() = default;
  // Called when the headers are in: an answer refuses the request before its body is
  // read (unknown route, missing credentials); a connection whose request had a body is
  // closed after it.
  virtual std::optional<HttpResponse> CheckHead(const HttpRequestHead& head) = 0;
  // The whole request, on an I/O thread: answer through `exchange`, never block.
  virtual void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) = 0;
  // The body of an answer the transport gives by itself (408, 413, 431, 400, 503) in the
  // handler's error shape; `message` says what to fix.
  virtual std::string ErrorBody(int status, std::string_view message) = 0;
};

class HttpTransport {
 public:
  // Why the transport refused a connection or request by itself (Options::on_refused).
  static constexpr std::string_view kConnectionLimit = "connection_limit";
  static constexpr std::string_view kHeaderTimeout = "header_timeout";
  static constexpr std::string_view kBodyTimeout = "body_timeout";
  static constexpr std::string_view kHeaderTooLarge = "header_too_large";
  static constexpr std::string_view kBodyTooLarge = "body_too_large";
  static constexpr std::string_view kBodyBudget = "body_budget";
  static constexpr std::string_view kMalformed = "malformed";
  static constexpr std::string_view kSlowReader = "slow_reader";
  static constexpr std::string_view kTlsHandshake = "tls_handshake";
  static constexpr std::string_view kIdleEvicted = "idle_evicted";

  struct Options {
    std::string host = "127.0.0.1";
    int port = 0;             // 0 picks a free port (port() tells which).
    int io_threads = 2;       // Threads that run every connection's I/O and the handler.
    int offload_threads = 2;  // Threads for Offload (parsing, templates, tokenizing).
    int max_connections = 16384;
    size_t max_header_bytes = 64 << 10;
    size_t max_body_bytes = 16 << 20;
    size_t max_buffered_body_bytes = 256 << 20;
    size_t max_unsent_bytes = 4 << 20;
    std::chrono::milliseconds idle_timeout{60'000};
    std::chrono::milliseconds header_timeout{10'000};
    std::chrono::milliseconds body_timeout{60'000};
    std::chrono::milliseconds send_timeout{60'000};
    // TLS: called once on the server's OpenSSL context (certificate, client CA, versions);
    // false refuses to start. Empty: plaintext.
    std::function<bool(SSL_CTX*)> configure_tls;
    // Observers (optional; called from I/O threads): the open connections after each
    // change, and each refusal by reason (the constants above).
    std::function<void(int)> on_connections;
    std::function<void(std::string_view)> on_refused;
  };

  // `handler` must outlive the transport.
  HttpTransport(Options options, HttpHandler* handler);
  ~HttpTransport();
  HttpTransport(const HttpTransport&) = delete;
  HttpTransport& operator=(const HttpTransport&) = delete;

  // Binds, listens and starts the I/O threads.
  absl::Status Start();
  int port() const;
  // Runs `task` on the offload pool (FIFO, offload_threads at a time).
  void Offload(std::function<void()> task);
  // Connections open now (refusals over the cap not counted).
  int open_connections() const;

  // Stops accepting, lets answers in progress end for up to `grace`, closes every
  // connection (their clients count as gone) and joins the threads. Idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::milliseconds(2000));

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace conveyor::scheduler
