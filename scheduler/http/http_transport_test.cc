// The HTTP transport over real sockets, in-process, with a handler that echoes, streams or
// holds requests: every limit and timeout, each as a client that breaks it would, and the
// ordinary paths (keep-alive, pipelining, chunked bodies, 100-continue, HTTP/1.0). The
// OpenAI front on top of it is tested with real processes in tests/http/.
#include "scheduler/http/http_transport.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/raw_http_client.h"

namespace conveyor::scheduler {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
using testing::RawHttpClient;
using testing::StatusOf;

// Echoes POST bodies, streams, or holds requests; records what it saw.
class TestHandler final : public HttpHandler {
 public:
  std::optional<HttpResponse> CheckHead(const HttpRequestHead& head) override {
    if (head.path == "/forbidden") return HttpResponse{401, "text/plain", "no", {}};
    return std::nullopt;
  }

  void Handle(HttpRequest request, std::shared_ptr<HttpExchange> exchange) override {
    handled_.fetch_add(1);
    const std::string path = request.head().path;
    if (path == "/stream") {
      exchange->StartStream(200, "text/event-stream", {});
      for (int i = 0; i < 3; ++i) exchange->Write("data: " + std::to_string(i) + "\n\n");
      exchange->EndStream();
    } else if (path == "/hold" || path == "/forever") {
      exchange->OnClientGone([this] {
        std::lock_guard<std::mutex> lock(mu_);
        ++gone_;
        changed_.notify_all();
      });
      if (path == "/forever") {
        exchange->StartStream(200, "text/event-stream", {});
        Feed(exchange);
      }
      std::lock_guard<std::mutex> lock(mu_);
      held_.push_back(exchange);
      changed_.notify_all();
    } else {
      exchange->Respond({200, "text/plain", std::string(request.body()), {}});
    }
  }

  std::string ErrorBody(int status, std::string_view message) override {
    return "{\"error\":\"" + std::string(message) + "\"}";
  }

  // Waits until `n` clients of held requests have gone.
  bool WaitGone(int n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, 10s, [&] { return gone_ >= n; });
  }
  bool WaitHeld(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return changed_.wait_for(lock, 10s, [&] { return held_.size() >= n; });
  }
  int handled() const { return handled_.load(); }
  void ReleaseAll() {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& e : held_) e->Respond({200, "text/plain", "released", {}});
    held_.clear();
  }

 private:
  // Writes 16 KiB pieces one after another, for as long as the connection lets it.
  void Feed(const std::shared_ptr<HttpExchange>& exchange) {
    exchange->Post([this, exchange] {
      exchange->Write(std::string(16 << 10, 'x'));
      std::lock_guard<std::mutex> lock(mu_);
      if (gone_ == 0 && fed_++ < 100000) Feed(exchange);
    });
  }

  std::atomic<int> handled_{0};
  std::mutex mu_;
  std::condition_variable changed_;
  std::vector<std::shared_ptr<HttpExchange>> held_;
  int gone_ = 0;
  int fed_ = 0;
};

class HttpTransportTest : public ::testing::Test {
 protected:
  void Start(HttpTransport::Options options = {}) {
    options.on_refused = [this](std::string_view reason) {
      std::lock_guard<std::mutex> lock(mu_);
      ++refused_[std::string(reason)];
    };
    transport_ = std::make_unique<HttpTransport>(std::move(options), &handler_);
    ASSERT_TRUE(transport_->Start().ok());
  }
  void TearDown() override {
    if (transport_ != nullptr) transport_->Stop(100ms);
  }
  int Refused(const std::string& reason) {
    std::lock_guard<std::mutex> lock(mu_);
    return refused_[reason];
  }
  int port() const { return transport_->port(); }

  TestHandler handler_;
  std::unique_ptr<HttpTransport> transport_;
  std::mutex mu_;
  std::map<std::string, int> refused_;
};

std::string Post(std::string_view path, std::string_view body) {
  return std::string("POST ") + std::string(path) +
         " HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         std::string(body);
}

TEST_F(HttpTransportTest, KeepAliveAndPipelinedRequestsAreAnsweredInOrder) {
  Start();
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "one")));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("\r\n\r\none"));
  ASSERT_TRUE(c.Send(Post("/echo", "two") + Post("/echo", "three")));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("\r\n\r\ntwo"));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("\r\n\r\nthree"));
  EXPECT_EQ(handler_.handled(), 3);
}

TEST_F(HttpTransportTest, ChunkedBodiesAreReadWithinTheLimitAndRefusedPastIt) {
  HttpTransport::Options options;
  options.max_body_bytes = 1 << 20;
  Start(options);
  {
    RawHttpClient c(port());
    ASSERT_TRUE(
        c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               "5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n"));
    EXPECT_THAT(c.ReadResponse(), HasSubstr("\r\n\r\nhello world"));
  }
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  const std::string chunk = "10000\r\n" + std::string(0x10000, 'a') + "\r\n";
  bool sent_all = true;
  for (int i = 0; i < 64 && sent_all; ++i) sent_all = c.Send(chunk);  // 4 MiB in all.
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 413) << response.substr(0, 200);
  EXPECT_THAT(response, HasSubstr("exceeds 1048576 bytes"));
  EXPECT_EQ(handler_.handled(), 1);
  EXPECT_EQ(Refused("body_too_large"), 1);
}

TEST_F(HttpTransportTest, ADeclaredLengthOverTheLimitIsRefusedBeforeTheBodyIsSent) {
  HttpTransport::Options options;
  options.max_body_bytes = 1 << 20;
  Start(options);
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 104857600\r\n\r\n"));
  const std::string response = c.ReadResponse();
  EXPECT_EQ(StatusOf(response), 413);
  EXPECT_THAT(response, HasSubstr("Connection: close"));
  EXPECT_EQ(handler_.handled(), 0);
}

TEST_F(HttpTransportTest, ExpectContinueGetsItsInterimAnswer) {
  Start();
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send(
      "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n"));
  EXPECT_EQ(c.ReadUntil("\r\n\r\n"), "HTTP/1.1 100 Continue\r\n\r\n");
  ASSERT_TRUE(c.Send("body"));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("\r\n\r\nbody"));
}

TEST_F(HttpTransportTest, HeadersTrickledSlowerThanTheTimeoutGet408) {
  HttpTransport::Options options;
  options.header_timeout = 300ms;
  Start(options);
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("GET /echo HTTP/1.1\r\n"));
  std::string response;
  for (int i = 0; i < 30; ++i) {
    std::this_thread::sleep_for(100ms);
    if (!c.Send("X-Slow: " + std::to_string(i) + "\r\n")) break;
  }
  response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 408) << response;
  EXPECT_THAT(response, HasSubstr("headers did not arrive within 300 ms"));
  EXPECT_EQ(Refused("header_timeout"), 1);
}

TEST_F(HttpTransportTest, ABodyThatNeverEndsGets408) {
  HttpTransport::Options options;
  options.body_timeout = 300ms;
  Start(options);
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nabc"));
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 408) << response;
  EXPECT_EQ(Refused("body_timeout"), 1);
  EXPECT_EQ(handler_.handled(), 0);
}

TEST_F(HttpTransportTest, AnIdleConnectionIsClosedQuietly) {
  HttpTransport::Options options;
  options.idle_timeout = 200ms;
  Start(options);
  RawHttpClient c(port());
  EXPECT_EQ(c.ReadAll(), "");
  for (int i = 0; i < 100 && transport_->open_connections() > 0; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(transport_->open_connections(), 0);
}

TEST_F(HttpTransportTest, OversizedHeadersGet431AndGarbageGets400) {
  Start();
  {
    RawHttpClient c(port());
    std::string request = "GET /echo HTTP/1.1\r\n";
    for (int i = 0; i < 20000; ++i) request += "X-A: b\r\n";  // 160 KB of headers.
    c.Send(request);
    EXPECT_EQ(StatusOf(c.ReadAll()), 431);
  }
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("NOT HTTP AT ALL\r\n\r\n"));
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 400);
  EXPECT_THAT(response, HasSubstr("malformed HTTP request"));
}

TEST_F(HttpTransportTest, ARefusalFromCheckHeadSkipsTheBody) {
  Start();
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("POST /forbidden HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\n"));
  const std::string response = c.ReadResponse();
  EXPECT_EQ(StatusOf(response), 401);
  EXPECT_THAT(response, HasSubstr("Connection: close"));  // Its body was never read.
  EXPECT_EQ(handler_.handled(), 0);
  // Without a body the connection goes on.
  RawHttpClient keep(port());
  ASSERT_TRUE(keep.Send("GET /forbidden HTTP/1.1\r\nHost: x\r\n\r\n"));
  EXPECT_EQ(StatusOf(keep.ReadResponse()), 401);
  ASSERT_TRUE(keep.Send(Post("/echo", "after")));
  EXPECT_THAT(keep.ReadResponse(), HasSubstr("after"));
}

TEST_F(HttpTransportTest, AtTheCapTheLongestIdleConnectionMakesRoom) {
  HttpTransport::Options options;
  options.max_connections = 4;
  Start(options);
  std::vector<std::unique_ptr<RawHttpClient>> idle;
  idle.reserve(4);
  for (int i = 0; i < 4; ++i) idle.push_back(std::make_unique<RawHttpClient>(port()));
  // The transport counts them once it accepted them.
  for (int i = 0; i < 100 && transport_->open_connections() < 4; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  RawHttpClient fresh(port());
  ASSERT_TRUE(fresh.Send(Post("/echo", "served")));
  EXPECT_THAT(fresh.ReadResponse(), HasSubstr("served"));
  EXPECT_TRUE(idle[0]->ServerClosed());
  EXPECT_EQ(Refused("idle_evicted"), 1);
}

TEST_F(HttpTransportTest, AtTheCapWithEveryConnectionBusyANewOneGets503) {
  HttpTransport::Options options;
  options.max_connections = 2;
  Start(options);
  RawHttpClient a(port()), b(port());
  ASSERT_TRUE(a.Send(Post("/hold", "")));
  ASSERT_TRUE(b.Send(Post("/hold", "")));
  ASSERT_TRUE(handler_.WaitHeld(2));
  RawHttpClient c(port());
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 503);
  EXPECT_THAT(response, HasSubstr("maximum of 2 open connections"));
  EXPECT_EQ(Refused("connection_limit"), 1);
  handler_.ReleaseAll();
  EXPECT_THAT(a.ReadResponse(), HasSubstr("released"));
}

TEST_F(HttpTransportTest, AClientThatLeavesIsReportedGone) {
  Start();
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send(Post("/hold", "")));
  ASSERT_TRUE(handler_.WaitHeld(1));
  c.Close();
  EXPECT_TRUE(handler_.WaitGone(1));
}

TEST_F(HttpTransportTest, AStreamTheClientDoesNotReadIsDroppedPastTheUnsentLimit) {
  HttpTransport::Options options;
  options.max_unsent_bytes = 256 << 10;
  Start(options);
  RawHttpClient c(port(), /*receive_buffer_bytes=*/4096);
  ASSERT_TRUE(c.Send(Post("/forever", "")));
  EXPECT_TRUE(handler_.WaitGone(1));  // Never read: the kernel's buffers fill, then ours.
  EXPECT_EQ(Refused("slow_reader"), 1);
}

TEST_F(HttpTransportTest, BodiesBeyondTheBufferedBudgetWait503) {
  HttpTransport::Options options;
  options.max_buffered_body_bytes = 1 << 20;
  Start(options);
  RawHttpClient a(port());
  ASSERT_TRUE(a.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800000\r\n\r\nab"));
  std::this_thread::sleep_for(100ms);
  RawHttpClient b(port());
  ASSERT_TRUE(b.Send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 800000\r\n\r\n"));
  const std::string response = b.ReadResponse();
  EXPECT_EQ(StatusOf(response), 503);
  EXPECT_THAT(response, HasSubstr("Retry-After: 1"));
  EXPECT_EQ(Refused("body_budget"), 1);
  // Once the first body is in and released, the budget is whole again.
  ASSERT_TRUE(a.Send(std::string(800000 - 2, 'c')));
  EXPECT_EQ(StatusOf(a.ReadResponse()), 200);
  RawHttpClient d(port());
  ASSERT_TRUE(d.Send(Post("/echo", std::string(900000, 'd'))));
  EXPECT_EQ(StatusOf(d.ReadResponse()), 200);
}

TEST_F(HttpTransportTest, StreamsAreChunkedOnHttp11AndCloseDelimitedOnHttp10) {
  Start();
  {
    RawHttpClient c(port());
    ASSERT_TRUE(c.Send(Post("/stream", "")));
    const std::string response = c.ReadUntil("0\r\n\r\n");
    EXPECT_THAT(response, HasSubstr("Transfer-Encoding: chunked"));
    EXPECT_THAT(response, HasSubstr("9\r\ndata: 2\n\n\r\n"));
  }
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send("POST /stream HTTP/1.0\r\nContent-Length: 0\r\n\r\n"));
  const std::string response = c.ReadAll();
  EXPECT_THAT(response, HasSubstr("HTTP/1.0 200"));
  EXPECT_THAT(response, HasSubstr("\r\n\r\ndata: 0\n\ndata: 1\n\ndata: 2\n\n"));
  EXPECT_THAT(response, Not(HasSubstr("chunked")));
}

TEST_F(HttpTransportTest, ThousandsOfIdleConnectionsCostNoThreads) {
  Start();
  const auto threads = [] {
    return std::distance(std::filesystem::directory_iterator("/proc/self/task"),
                         std::filesystem::directory_iterator{});
  };
  const auto before = threads();
  std::vector<std::unique_ptr<RawHttpClient>> idle;
  idle.reserve(2000);
  for (int i = 0; i < 2000; ++i) idle.push_back(std::make_unique<RawHttpClient>(port()));
  for (int i = 0; i < 500 && transport_->open_connections() < 2000; ++i) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_EQ(transport_->open_connections(), 2000);
  EXPECT_EQ(threads(), before);
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send(Post("/echo", "still here")));
  EXPECT_THAT(c.ReadResponse(), HasSubstr("still here"));
}

TEST_F(HttpTransportTest, StopEndsHeldAnswersAndTheirClientsCountAsGone) {
  Start();
  RawHttpClient c(port());
  ASSERT_TRUE(c.Send(Post("/hold", "")));
  ASSERT_TRUE(handler_.WaitHeld(1));
  transport_->Stop(50ms);
  EXPECT_TRUE(handler_.WaitGone(1));
  EXPECT_TRUE(c.ServerClosed());
}

}  // namespace
}  // namespace conveyor::scheduler
