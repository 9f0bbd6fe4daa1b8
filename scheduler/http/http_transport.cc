#include "scheduler/http/http_transport.h"

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/ssl/context.hpp>
#include <boost/asio/ssl/stream.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/thread_pool.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>
#include <list>
#include <mutex>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {
namespace {

namespace net = boost::asio;
namespace ssl = boost::asio::ssl;
namespace http = boost::beast::http;
using tcp = boost::asio::ip::tcp;
using boost::system::error_code;
using Parser = http::request_parser<http::string_body>;

// Bytes a connection reads ahead while its request is answered: enough to notice the
// client leave (or keep a pipelined request's start) without buffering much.
constexpr size_t kWatchReadBytes = 1024;
// Beyond the header limit, room in the read buffer for the start of a body.
constexpr size_t kReadBufferSlackBytes = 64 << 10;
// Connections over the cap that are being told so (503) at once; beyond that they are
// closed without an answer.
constexpr int kMaxRefusing = 256;
// After an error answer to a request whose body was not read: how long and how much of
// what the client still sends is read and dropped, so that closing does not reset the
// connection before the client has read the answer (nginx's lingering close).
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = 1 << 20;
// Descriptors kept free for everything else (workers' channels, files, metrics).
constexpr rlim_t kReservedDescriptors = 256;

// What every request body being read or parsed may hold, together.
class BodyBudget {
 public:
  explicit BodyBudget(size_t bytes) : free_(bytes) {}
  bool TryTake(size_t n) {
    size_t free = free_.load();
    do {
      if (free < n) return false;
    } while (!free_.compare_exchange_weak(free, free - n));
    return true;
  }
  void Give(size_t n) { free_.fetch_add(n); }

 private:
  std::atomic<size_t> free_;
};

// One request's share of the budget, returned when the body is released.
class BudgetShare {
 public:
  explicit BudgetShare(std::shared_ptr<BodyBudget> budget) : budget_(std::move(budget)) {}
  ~BudgetShare() { budget_->Give(bytes_); }
  BudgetShare(const BudgetShare&) = delete;
  BudgetShare& operator=(const BudgetShare&) = delete;
  bool Grow(uint64_t n) {
    if (!budget_->TryTake(n)) return false;
    bytes_ += n;
    return true;
  }

 private:
  const std::shared_ptr<BodyBudget> budget_;
  size_t bytes_ = 0;
};

absl::string_view Reason(int status) {
  const std::string_view reason = http::obsolete_reason(http::int_to_status(status));
  return reason.empty() ? "Unknown" : absl::string_view(reason.data(), reason.size());
}

// What every connection shares: the settings, the handler and the counts.
struct Shared {
  HttpTransport::Options options;
  HttpHandler* handler = nullptr;
  std::unique_ptr<ssl::context> tls;  // Null: plaintext.
  std::shared_ptr<BodyBudget> budget;
  std::atomic<int> open{0};
  std::atomic<int> refusing{0};
  std::atomic<bool> stopping{false};

  void Refused(std::string_view reason) const {
    if (options.on_refused) options.on_refused(reason);
  }
  void ConnectionsChanged(int open_now) const {
    if (options.on_connections) options.on_connections(open_now);
  }
};

// What the transport needs of every connection, whatever its stream.
class ConnectionBase : public HttpExchange {
 public:
  // The server stops: close now if no answer is in progress, else once it has ended.
  virtual void Shutdown() = 0;
  // Close now; an answer in progress loses its client.
  virtual void Abort() = 0;
  // Make room for a new connection: close if still waiting for a request (counted as
  // "idle_evicted"), else nothing.
  virtual void Evict() = 0;

  // The registry's (guarded by its mutex).
  std::list<std::weak_ptr<ConnectionBase>>::iterator registration;
  std::list<std::weak_ptr<ConnectionBase>>::iterator evictable_position;
  bool evictable = false;
};

// The live connections, for Stop, and those that hold no request (handshaking, idle, or
// still sending headers), oldest first: at the connection cap the oldest of those makes
// room for a new one, so connections that only wait (idle keep-alives, a slow-headers
// attack) can never lock clients out. Only connections with a request in progress count
// against the cap for good.
class Registry {
 public:
  void Add(const std::shared_ptr<ConnectionBase>& c) {
    std::lock_guard<std::mutex> lock(mu_);
    c->registration = live_.insert(live_.end(), c);
  }
  void Remove(ConnectionBase* c) {
    std::lock_guard<std::mutex> lock(mu_);
    live_.erase(c->registration);
    SetEvictableLocked(c, false);
  }
  void SetEvictable(ConnectionBase* c, bool evictable) {
    std::lock_guard<std::mutex> lock(mu_);
    SetEvictableLocked(c, evictable);
  }
  // The connection that has waited longest without a request (no longer evictable), or
  // null.
  std::shared_ptr<ConnectionBase> TakeOldestEvictable() {
    std::lock_guard<std::mutex> lock(mu_);
    while (!evictable_.empty()) {
      std::shared_ptr<ConnectionBase> c = evictable_.front().lock();
      evictable_.pop_front();
      if (c != nullptr) {
        c->evictable = false;
        return c;
      }
    }
    return nullptr;
  }
  std::vector<std::shared_ptr<ConnectionBase>> Snapshot() {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<std::shared_ptr<ConnectionBase>> out;
    out.reserve(live_.size());
    for (const auto& weak : live_) {
      if (auto c = weak.lock()) out.push_back(std::move(c));
    }
    return out;
  }

 private:
  void SetEvictableLocked(ConnectionBase* c, bool evictable) {
    if (c->evictable == evictable) return;
    c->evictable = evictable;
    if (evictable) {
      c->evictable_position = evictable_.insert(evictable_.end(), live_weak(c));
    } else {
      evictable_.erase(c->evictable_position);
    }
  }
  std::weak_ptr<ConnectionBase> live_weak(ConnectionBase* c) { return *c->registration; }

  std::mutex mu_;
  std::list<std::weak_ptr<ConnectionBase>> live_;
  std::list<std::weak_ptr<ConnectionBase>> evictable_;
};

// One client connection, plain (Stream = tcp::socket) or TLS. Everything runs on the
// connection's strand; HttpExchange calls from other threads are dispatched onto it.
//
// A request goes: wait until readable (idle: no buffer held) -> headers -> body ->
// handled (a small read stays outstanding, to notice the client leave) -> answered
// (whole, or streamed as it comes) -> the next request, or closed.
template <class Stream>
class Connection final : public ConnectionBase,
                         public std::enable_shared_from_this<Connection<Stream>> {
 public:
  static constexpr bool kTls = !std::is_same_v<Stream, tcp::socket>;

  // `refuse`: over the connection cap; answered 503 and closed.
  Connection(Shared* shared, Registry* registry, Stream stream, bool refuse)
      : shared_(shared),
        registry_(registry),
        stream_(std::move(stream)),
        executor_(stream_.get_executor()),
        read_deadline_(executor_),
        write_deadline_(executor_),
        buffer_(shared->options.max_header_bytes + kReadBufferSlackBytes),
        refuse_(refuse) {}

  ~Connection() override = default;

  void Start() {
    registry_->Add(this->shared_from_this());
    if (!refuse_) registry_->SetEvictable(this, true);
    if constexpr (kTls) {
      ArmRead(shared_->options.header_timeout);
      stream_.async_handshake(
          ssl::stream_base::server,
          [self = this->shared_from_this()](const error_code& ec) { self->OnHandshake(ec); });
    } else {
      OnHandshake({});
    }
  }

  // --- HttpExchange ---

  void Post(std::function<void()> task) override {
    net::post(executor_, [self = this->shared_from_this(), task = std::move(task)] { task(); });
  }

  void Respond(HttpResponse response) override {
    Dispatch([this, response = std::move(response)]() mutable {
      if (phase_ != Phase::kHandling) return;
      AppendHead(response.status, response.content_type, response.headers, response.body.size());
      out_ += response.body;
      Finish(/*linger=*/false);
    });
  }

  void StartStream(int status, std::string content_type, HttpHeaders headers) override {
    Dispatch([this, status, content_type = std::move(content_type),
              headers = std::move(headers)]() mutable {
      if (phase_ != Phase::kHandling) return;
      // HTTP/1.0 has no chunked encoding: the stream ends when the connection does.
      if (version_ < 11) keep_alive_ = false;
      AppendHead(status, content_type, headers, std::nullopt);
      phase_ = Phase::kStreaming;
      Flush();
    });
  }

  void Write(std::string data) override {
    Dispatch([this, data = std::move(data)] {
      if (phase_ != Phase::kStreaming || data.empty()) return;
      if (version_ >= 11) {
        absl::StrAppend(&out_, absl::Hex(data.size()), "\r\n", data, "\r\n");
      } else {
        out_ += data;
      }
      if (out_.size() + sending_.size() > shared_->options.max_unsent_bytes) {
        spdlog::warn("HTTP: dropping a client that has not read {} bytes of its stream",
                     out_.size() + sending_.size());
        shared_->Refused(HttpTransport::kSlowReader);
        return ClientGone();
      }
      Flush();
    });
  }

  void EndStream() override {
    Dispatch([this] {
      if (phase_ != Phase::kStreaming) return;
      if (version_ >= 11) out_ += "0\r\n\r\n";
      Finish(/*linger=*/false);
    });
  }

  void OnClientGone(std::function<void()> callback) override {
    Dispatch([this, callback = std::move(callback)]() mutable {
      if (gone_) {
        net::post(executor_, std::move(callback));
      } else if (phase_ == Phase::kHandling || phase_ == Phase::kStreaming ||
                 phase_ == Phase::kResponding) {
        on_gone_ = std::move(callback);
      }
    });
  }

  // --- ConnectionBase ---

  void Shutdown() override {
    Dispatch([this] {
      stopping_ = true;
      if (!AnswerInProgress()) Close();
    });
  }

  void Abort() override {
    Dispatch([this] { ClientGone(); });
  }

  void Evict() override {
    Dispatch([this] {
      if (phase_ != Phase::kHandshake && phase_ != Phase::kIdle && phase_ != Phase::kHeader) {
        return;
      }
      shared_->Refused(HttpTransport::kIdleEvicted);
      Close();
    });
  }

 private:
  enum class Phase {
    kHandshake,
    kIdle,        // Between requests.
    kHeader,      // Reading a request's headers.
    kBody,        // Reading its body.
    kHandling,    // The handler has it; no answer yet.
    kStreaming,   // A streamed answer is being written.
    kResponding,  // The last bytes of an answer are being written.
    kLingering,   // Answered with an error; dropping what the client still sends.
    kClosed,
  };

  bool AnswerInProgress() const {
    return phase_ == Phase::kHandling || phase_ == Phase::kStreaming ||
           phase_ == Phase::kResponding;
  }

  template <class F>
  void Dispatch(F&& f) {
    net::dispatch(executor_,
                  [self = this->shared_from_this(), f = std::forward<F>(f)]() mutable { f(); });
  }

  tcp::socket& Socket() {
    if constexpr (kTls) {
      return stream_.next_layer();
    } else {
      return stream_;
    }
  }

  // A read phase's deadline: when it passes, the read in progress is cancelled and its
  // handler sees timed_out_.
  void ArmRead(std::chrono::milliseconds timeout) {
    timed_out_ = false;
    read_deadline_.expires_after(timeout);
    read_deadline_.async_wait(
        [self = this->shared_from_this(), generation = ++read_generation_](const error_code& ec) {
          if (ec || generation != self->read_generation_ || self->phase_ == Phase::kClosed) {
            return;
          }
          self->timed_out_ = true;
          error_code ignored;
          self->Socket().cancel(ignored);
        });
  }

  void DisarmRead() {
    ++read_generation_;
    read_deadline_.cancel();
  }

  void OnHandshake(const error_code& ec) {
    if (ec) {
      if (!timed_out_) shared_->Refused(HttpTransport::kTlsHandshake);
      return Close();
    }
    if (refuse_) {
      keep_alive_ = false;
      return Refuse(
          503, HttpTransport::kConnectionLimit,
          absl::StrCat("the server holds its maximum of ", shared_->options.max_connections,
                       " open connections; retry shortly"),
          /*linger=*/true);
    }
    WaitForRequest();
  }

  // Idle: waits for the next request's first byte. A plain connection holds no read buffer
  // meanwhile; a TLS one reads through its stream (a request may already sit decrypted, or
  // in a record read with the handshake, where the socket shows nothing), into a small one.
  void WaitForRequest() {
    phase_ = Phase::kIdle;
    if (stopping_) return Close();
    registry_->SetEvictable(this, true);
    if (buffer_.size() > 0) return ReadHeader();
    if (buffer_.capacity() > 0) buffer_.shrink_to_fit();
    ArmRead(shared_->options.idle_timeout);
    if constexpr (kTls) return Watch();
    Socket().async_wait(tcp::socket::wait_read,
                        [self = this->shared_from_this()](const error_code& ec) {
                          if (ec || self->timed_out_ || self->phase_ != Phase::kIdle) {
                            return self->Close();
                          }
                          self->ReadHeader();
                        });
  }

  void ReadHeader() {
    phase_ = Phase::kHeader;
    over_budget_ = false;
    ArmRead(shared_->options.header_timeout);
    parser_ = std::make_unique<Parser>();
    parser_->header_limit(
        static_cast<uint32_t>(std::min<size_t>(shared_->options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(shared_->options.max_body_bytes);
    http::async_read_header(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](const error_code& ec, size_t) { self->OnHeader(ec); });
  }

  void OnHeader(const error_code& ec) {
    if (phase_ == Phase::kClosed) return;  // Closed while the read finished (an eviction).
    if (ec) return OnReadError(ec);
    registry_->SetEvictable(this, false);  // A request is coming: it counts from now.
    const auto& request = parser_->get();
    keep_alive_ = request.keep_alive();
    version_ = request.version();
    const std::string_view target = request.target();
    head_.method = std::string(request.method_string());
    head_.path = std::string(target.substr(0, target.find('?')));
    head_.authorization = std::string(request[http::field::authorization]);
    head_.api_key = std::string(request["x-api-key"]);
    if (std::optional<HttpResponse> refusal = shared_->handler->CheckHead(head_)) {
      // A request with a body left unread cannot be followed by another.
      const bool body_unread = !parser_->is_done();
      if (body_unread) keep_alive_ = false;
      parser_.reset();
      DisarmRead();
      phase_ = Phase::kHandling;
      AppendHead(refusal->status, refusal->content_type, refusal->headers, refusal->body.size());
      out_ += refusal->body;
      return Finish(/*linger=*/body_unread);
    }
    share_ = std::make_shared<BudgetShare>(shared_->budget);
    if (const auto length = parser_->content_length(); length.has_value()) {
      if (!share_->Grow(*length)) return RefuseBusy();
    } else if (parser_->chunked()) {
      // Chunked bodies take their share as each chunk is announced.
      on_chunk_ = [this](uint64_t size, std::string_view, error_code& chunk_ec) {
        // share_ is gone once the connection closed (a read may still finish after).
        if (share_ == nullptr || !share_->Grow(size)) {
          over_budget_ = true;
          chunk_ec = http::error::body_limit;
        }
      };
      parser_->on_chunk_header(on_chunk_);
    }
    const std::string expect(request[http::field::expect]);
    if (!parser_->is_done() &&
        absl::EqualsIgnoreCase(absl::StripAsciiWhitespace(expect), "100-continue")) {
      // The client waits for this before it sends the body.
      continue_ = absl::StrCat("HTTP/1.", version_ % 10, " 100 Continue\r\n\r\n");
      return net::async_write(
          stream_, net::buffer(continue_),
          [self = this->shared_from_this()](const error_code& write_ec, size_t) {
            if (write_ec) return self->Close();
            self->ReadBody();
          });
    }
    ReadBody();
  }

  void ReadBody() {
    phase_ = Phase::kBody;
    ArmRead(shared_->options.body_timeout);
    http::async_read(
        stream_, buffer_, *parser_,
        [self = this->shared_from_this()](const error_code& ec, size_t) { self->OnBody(ec); });
  }

  void OnBody(const error_code& ec) {
    if (phase_ == Phase::kClosed) return;
    if (ec) return OnReadError(ec);
    DisarmRead();
    std::string body = std::move(parser_->get().body());
    parser_.reset();
    on_chunk_ = nullptr;
    HttpRequest request(head_, std::move(body), std::move(share_));
    phase_ = Phase::kHandling;
    Watch();
    shared_->handler->Handle(std::move(request), this->shared_from_this());
  }

  void OnReadError(const error_code& ec) {
    const bool started = phase_ == Phase::kHeader ? buffer_.size() > 0 || parser_->got_some()
                                                  : phase_ == Phase::kBody;
    if (timed_out_) {
      if (!started) return Close();
      const bool header = phase_ == Phase::kHeader;
      return Refuse(408, header ? HttpTransport::kHeaderTimeout : HttpTransport::kBodyTimeout,
                    header ? absl::StrCat("the request's headers did not arrive within ",
                                          shared_->options.header_timeout.count(), " ms")
                           : absl::StrCat("the request's body did not arrive within ",
                                          shared_->options.body_timeout.count(), " ms"),
                    /*linger=*/false);
    }
    if (ec == http::error::header_limit || ec == http::error::buffer_overflow) {
      return Refuse(431, HttpTransport::kHeaderTooLarge,
                    absl::StrCat("the request's headers exceed ", shared_->options.max_header_bytes,
                                 " bytes"),
                    /*linger=*/true);
    }
    if (ec == http::error::body_limit) {
      if (over_budget_) return RefuseBusy();
      return Refuse(413, HttpTransport::kBodyTooLarge,
                    absl::StrCat("the request body exceeds ", shared_->options.max_body_bytes,
                                 " bytes (the server's --max_receive_bytes); send a shorter "
                                 "prompt"),
                    /*linger=*/true);
    }
    if (ec.category() == error_code(http::error::bad_method).category() &&
        ec != http::error::end_of_stream && ec != http::error::partial_message) {
      return Refuse(400, HttpTransport::kMalformed,
                    absl::StrCat("malformed HTTP request: ", ec.message()), /*linger=*/true);
    }
    Close();  // The client closed or reset the connection.
  }

  void RefuseBusy() {
    Refuse(503, HttpTransport::kBodyBudget,
           "the server is receiving too many request bodies at once; retry shortly",
           /*linger=*/true, {{"Retry-After", "1"}});
  }

  // Answers an error by the transport itself and closes the connection after it.
  void Refuse(int status, std::string_view reason, std::string_view message, bool linger,
              const HttpHeaders& headers = {}) {
    shared_->Refused(reason);
    DisarmRead();
    parser_.reset();
    keep_alive_ = false;
    phase_ = Phase::kHandling;
    const std::string body = shared_->handler->ErrorBody(status, message);
    AppendHead(status, "application/json; charset=utf-8", headers, body.size());
    out_ += body;
    Finish(linger);
  }

  // While the handler works: a small read notices the client leave, and keeps what it
  // sends next (a pipelined request) for later. Once such bytes are in, it stops: the
  // client is evidently there, and the next request is parsed from them.
  void Watch() {
    if (watching_ || buffer_.size() > 0 || phase_ == Phase::kClosed) return;
    watching_ = true;
    stream_.async_read_some(buffer_.prepare(kWatchReadBytes),
                            [self = this->shared_from_this()](const error_code& ec, size_t n) {
                              self->OnWatched(ec, n);
                            });
  }

  void OnWatched(const error_code& ec, size_t n) {
    watching_ = false;
    if (phase_ == Phase::kLingering) {
      if (ec || timed_out_) return Close();
      buffer_.consume(buffer_.size());
      return DropInput();
    }
    if (ec) return phase_ == Phase::kIdle ? Close() : ClientGone();
    buffer_.commit(n);
    if (phase_ == Phase::kIdle) ReadHeader();
  }

  void AppendHead(int status, std::string_view content_type, const HttpHeaders& headers,
                  std::optional<size_t> content_length) {
    absl::StrAppend(&out_, "HTTP/1.", version_ >= 11 ? 1 : 0, " ", status, " ", Reason(status),
                    "\r\n");
    if (!content_type.empty()) {
      absl::StrAppend(&out_,
                      "Content-Type: ", absl::string_view(content_type.data(), content_type.size()),
                      "\r\n");
    }
    if (content_length.has_value()) {
      absl::StrAppend(&out_, "Content-Length: ", *content_length, "\r\n");
    } else if (version_ >= 11) {
      out_ += "Transfer-Encoding: chunked\r\n";
    }
    if (!keep_alive_ || stopping_) {
      out_ += "Connection: close\r\n";
    } else if (version_ < 11) {
      out_ += "Connection: keep-alive\r\n";
    }
    for (const auto& [name, value] : headers) absl::StrAppend(&out_, name, ": ", value, "\r\n");
    out_ += "\r\n";
  }

  // The answer is complete in out_: send it, then go on with the next request or close.
  void Finish(bool linger) {
    phase_ = Phase::kResponding;
    end_after_flush_ = true;
    linger_ = linger;
    Flush();
  }

  void Flush() {
    if (writing_ || out_.empty() || phase_ == Phase::kClosed) return;
    writing_ = true;
    sending_.swap(out_);
    write_deadline_.expires_after(shared_->options.send_timeout);
    write_deadline_.async_wait(
        [self = this->shared_from_this(), generation = ++write_generation_](const error_code& ec) {
          if (ec || generation != self->write_generation_ || !self->writing_) return;
          self->shared_->Refused(HttpTransport::kSlowReader);
          self->ClientGone();
        });
    net::async_write(
        stream_, net::buffer(sending_),
        [self = this->shared_from_this()](const error_code& ec, size_t) { self->OnWritten(ec); });
  }

  void OnWritten(const error_code& ec) {
    writing_ = false;
    sending_.clear();
    ++write_generation_;
    write_deadline_.cancel();
    if (ec) return ClientGone();
    if (!out_.empty()) return Flush();
    if (end_after_flush_) EndExchange();
  }

  void EndExchange() {
    end_after_flush_ = false;
    on_gone_ = nullptr;
    if (linger_) return Linger();
    if (!keep_alive_ || stopping_ || gone_) return Close();
    if (watching_) {
      // The watch read goes on as the wait for the next request.
      phase_ = Phase::kIdle;
      registry_->SetEvictable(this, true);
      ArmRead(shared_->options.idle_timeout);
      return;
    }
    WaitForRequest();
  }

  // Closes the sending side and drops what the client still sends for a while, so that
  // it reads the error answer instead of a reset.
  void Linger() {
    phase_ = Phase::kLingering;
    error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_send, ignored);
    ArmRead(std::chrono::duration_cast<std::chrono::milliseconds>(kLingerTime));
    if (!watching_) DropInput();  // Else the watch read's completion goes on with it.
  }

  void DropInput() {
    if (!drop_buffer_) drop_buffer_ = std::make_unique<std::array<char, 4096>>();
    Socket().async_read_some(net::buffer(*drop_buffer_),
                             [self = this->shared_from_this()](const error_code& ec, size_t n) {
                               self->dropped_ += n;
                               if (ec || self->timed_out_ || self->dropped_ > kLingerBytes) {
                                 return self->Close();
                               }
                               self->DropInput();
                             });
  }

  void ClientGone() {
    if (gone_ || phase_ == Phase::kClosed) return;
    gone_ = true;
    if (on_gone_) net::post(executor_, std::exchange(on_gone_, nullptr));
    Close();
  }

  void Close() {
    if (phase_ == Phase::kClosed) return;
    // An answer in progress loses its client.
    if (AnswerInProgress() && !gone_) {
      gone_ = true;
      if (on_gone_) net::post(executor_, std::exchange(on_gone_, nullptr));
    }
    phase_ = Phase::kClosed;
    DisarmRead();
    ++write_generation_;
    write_deadline_.cancel();
    error_code ignored;
    Socket().shutdown(tcp::socket::shutdown_both, ignored);
    Socket().close(ignored);
    // The parser stays until the connection goes: a read whose bytes had arrived when the
    // close ran (an eviction racing a slow client's next header line) still parses them
    // into it before its handler sees the connection closed. Freeing it here crashed the
    // scheduler under load (a segfault in beast's parse_start_line).
    share_.reset();
    registry_->Remove(this);
    if (refuse_) {
      shared_->refusing.fetch_sub(1);
    } else {
      shared_->ConnectionsChanged(shared_->open.fetch_sub(1) - 1);
    }
  }

  Shared* const shared_;
  Registry* const registry_;
  Stream stream_;
  const net::any_io_executor executor_;
  net::steady_timer read_deadline_;
  net::steady_timer write_deadline_;
  uint64_t read_generation_ = 0;
  uint64_t write_generation_ = 0;
  boost::beast::flat_buffer buffer_;
  std::unique_ptr<Parser> parser_;
  std::function<void(uint64_t, std::string_view, error_code&)> on_chunk_;
  std::shared_ptr<BudgetShare> share_;
  HttpRequestHead head_;
  std::string continue_;
  std::string out_;      // Waiting to be written.
  std::string sending_;  // Being written.
  std::unique_ptr<std::array<char, 4096>> drop_buffer_;
  size_t dropped_ = 0;
  std::function<void()> on_gone_;
  Phase phase_ = Phase::kHandshake;
  unsigned version_ = 11;
  const bool refuse_;
  bool keep_alive_ = true;
  bool timed_out_ = false;
  bool over_budget_ = false;
  bool watching_ = false;
  bool writing_ = false;
  bool end_after_flush_ = false;
  bool linger_ = false;
  bool gone_ = false;
  bool stopping_ = false;
};

}  // namespace

class HttpTransport::Impl {
 public:
  Impl(Options options, HttpHandler* handler)
      : work_(net::make_work_guard(io_)),
        accept_strand_(net::make_strand(io_)),
        acceptor_(accept_strand_),
        accept_retry_(accept_strand_),
        offload_(static_cast<size_t>(std::max(1, options.offload_threads))) {
    shared_.options = std::move(options);
    shared_.handler = handler;
    shared_.budget = std::make_shared<BodyBudget>(shared_.options.max_buffered_body_bytes);
  }

  ~Impl() { Stop(std::chrono::milliseconds(0)); }

  absl::Status Start() {
    Options& o = shared_.options;
    RaiseDescriptorLimit();
    if (o.configure_tls) {
      shared_.tls = std::make_unique<ssl::context>(ssl::context::tls_server);
      SSL_CTX* ctx = shared_.tls->native_handle();
      // Idle TLS connections give their record buffers back.
      SSL_CTX_set_mode(ctx, SSL_MODE_RELEASE_BUFFERS);
      if (!o.configure_tls(ctx)) {
        return absl::InvalidArgumentError("HTTPS: the TLS settings were refused");
      }
    }
    error_code ec;
    const auto address = net::ip::make_address(o.host == "localhost" ? "127.0.0.1" : o.host, ec);
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("cannot listen for HTTP on ", o.host, ": not an IP address"));
    }
    const tcp::endpoint endpoint(address, static_cast<uint16_t>(o.port));
    acceptor_.open(endpoint.protocol(), ec);
    if (!ec) acceptor_.set_option(net::socket_base::reuse_address(true), ec);
    if (!ec) acceptor_.bind(endpoint, ec);
    if (!ec) acceptor_.listen(net::socket_base::max_listen_connections, ec);
    if (ec) {
      return absl::UnavailableError(
          absl::StrCat("cannot listen for HTTP on ", o.host, ":", o.port, ": ", ec.message()));
    }
    port_ = acceptor_.local_endpoint().port();
    Accept();
    for (int i = 0; i < std::max(1, o.io_threads); ++i) {
      threads_.emplace_back([this] { io_.run(); });
    }
    return absl::OkStatus();
  }

  int port() const { return port_; }
  int open_connections() const { return shared_.open.load(); }
  void Offload(std::function<void()> task) { net::post(offload_, std::move(task)); }

  void Stop(std::chrono::milliseconds grace) {
    if (stopped_.exchange(true)) return;
    shared_.stopping = true;
    if (!threads_.empty()) {
      net::post(accept_strand_, [this] {
        error_code ignored;
        acceptor_.close(ignored);
        accept_retry_.cancel();
      });
      for (const auto& c : registry_.Snapshot()) c->Shutdown();
      const auto deadline = std::chrono::steady_clock::now() + grace;
      while (shared_.open.load() + shared_.refusing.load() > 0 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      for (const auto& c : registry_.Snapshot()) c->Abort();
      const auto abort_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
      while (shared_.open.load() + shared_.refusing.load() > 0 &&
             std::chrono::steady_clock::now() < abort_deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    }
    offload_.stop();
    offload_.join();
    work_.reset();
    io_.stop();
    for (std::thread& t : threads_) t.join();
    threads_.clear();
  }

 private:
  // Every connection is a descriptor: take the hard limit, and keep the cap below it.
  void RaiseDescriptorLimit() {
    rlimit limit{};
    if (getrlimit(RLIMIT_NOFILE, &limit) != 0) return;
    if (limit.rlim_cur < limit.rlim_max) {
      limit.rlim_cur = limit.rlim_max;
      setrlimit(RLIMIT_NOFILE, &limit);
      getrlimit(RLIMIT_NOFILE, &limit);
    }
    Options& o = shared_.options;
    const rlim_t needed =
        static_cast<rlim_t>(o.max_connections) + kMaxRefusing + kReservedDescriptors;
    if (limit.rlim_cur != RLIM_INFINITY && limit.rlim_cur < needed) {
      const int fits = static_cast<int>(
          std::max<rlim_t>(limit.rlim_cur, kMaxRefusing + kReservedDescriptors + 1) - kMaxRefusing -
          kReservedDescriptors);
      spdlog::warn(
          "HTTP: the open-files limit ({}) allows {} connections, not the {} asked for "
          "(--http_max_connections); raise `ulimit -n` to serve more",
          limit.rlim_cur, fits, o.max_connections);
      o.max_connections = fits;
    }
  }

  void Accept() {
    acceptor_.async_accept(net::make_strand(io_), [this](const error_code& ec, tcp::socket socket) {
      OnAccept(ec, std::move(socket));
    });
  }

  void OnAccept(const error_code& ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || shared_.stopping) return;
    if (ec) {
      // Out of descriptors or memory: try again shortly instead of spinning.
      const auto now = std::chrono::steady_clock::now();
      if (now - last_accept_warning_ > std::chrono::seconds(10)) {
        spdlog::warn("HTTP: cannot accept a connection: {}", ec.message());
        last_accept_warning_ = now;
      }
      accept_retry_.expires_after(std::chrono::milliseconds(100));
      accept_retry_.async_wait([this](const error_code& wait_ec) {
        if (!wait_ec && !shared_.stopping) Accept();
      });
      return;
    }
    error_code ignored;
    // A token is a few dozen bytes: send each at once rather than wait for the last ACK.
    socket.set_option(tcp::no_delay(true), ignored);
    bool refuse = shared_.open.load() >= shared_.options.max_connections;
    if (refuse) {
      // A connection that holds no request makes room (it closes shortly; the count may
      // exceed the cap by the evictions in flight).
      if (std::shared_ptr<ConnectionBase> victim = registry_.TakeOldestEvictable()) {
        victim->Evict();
        refuse = false;
      }
    }
    if (refuse) {
      if (shared_.refusing.fetch_add(1) >= kMaxRefusing) {
        shared_.refusing.fetch_sub(1);
        shared_.Refused(HttpTransport::kConnectionLimit);
        socket.close(ignored);
        return Accept();
      }
    } else {
      shared_.ConnectionsChanged(shared_.open.fetch_add(1) + 1);
    }
    if (shared_.tls != nullptr) {
      std::make_shared<Connection<ssl::stream<tcp::socket>>>(
          &shared_, &registry_, ssl::stream<tcp::socket>(std::move(socket), *shared_.tls), refuse)
          ->Start();
    } else {
      std::make_shared<Connection<tcp::socket>>(&shared_, &registry_, std::move(socket), refuse)
          ->Start();
    }
    Accept();
  }

  Shared shared_;
  Registry registry_;
  net::io_context io_;
  net::executor_work_guard<net::io_context::executor_type> work_;
  // The acceptor and its retry timer: Stop closes them from another thread.
  net::strand<net::io_context::executor_type> accept_strand_;
  tcp::acceptor acceptor_;
  net::steady_timer accept_retry_;
  std::chrono::steady_clock::time_point last_accept_warning_;
  net::thread_pool offload_;
  std::vector<std::thread> threads_;
  int port_ = 0;
  std::atomic<bool> stopped_{false};
};

HttpTransport::HttpTransport(Options options, HttpHandler* handler)
    : impl_(std::make_unique<Impl>(std::move(options), handler)) {}

HttpTransport::~HttpTransport() = default;

absl::Status HttpTransport::Start() { return impl_->Start(); }
int HttpTransport::port() const { return impl_->port(); }
void HttpTransport::Offload(std::function<void()> task) { impl_->Offload(std::move(task)); }
int HttpTransport::open_connections() const { return impl_->open_connections(); }
void HttpTransport::Stop(std::chrono::milliseconds grace) { impl_->Stop(grace); }

}  // namespace conveyor::scheduler
