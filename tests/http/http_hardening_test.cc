// The HTTP front against a hostile client, with real processes (a conveyor-scheduler with
// --http_port and a conveyor-worker on the tiny test model): every request and connection
// pattern that once killed or starved the scheduler (issue W), each followed by proof that
// it still serves. Every refusal must be OpenAI's error shape with a message that says
// what to fix, and must never echo the offending input back.
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "testing/raw_http_client.h"
#include "testing/subprocess.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;

std::string Post(std::string_view path, std::string_view body) {
  return std::string("POST ") + std::string(path) +
         " HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
         std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

std::string Get(std::string_view path) {
  return std::string("GET ") + std::string(path) + " HTTP/1.1\r\nHost: x\r\n\r\n";
}

// The error object of an OpenAI-shaped error answer; fails the test if it is not one.
nlohmann::json ErrorOf(const std::string& response) {
  const nlohmann::json body =
      nlohmann::json::parse(BodyOf(response), nullptr, /*allow_exceptions=*/false);
  EXPECT_TRUE(body.is_object() && body.contains("error")) << response.substr(0, 300);
  if (!body.is_object() || !body.contains("error")) return nlohmann::json::object();
  const nlohmann::json& error = body["error"];
  EXPECT_TRUE(error["message"].is_string() && !error["message"].get<std::string>().empty());
  EXPECT_TRUE(error["type"].is_string());
  EXPECT_TRUE(error.contains("param") && error.contains("code"));
  return error;
}

int Threads(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("Threads:", 0) == 0) return std::stoi(line.substr(8));
  }
  return -1;
}

class HttpHardeningTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    http_port_ = FreePort();
    server_ = new Server({"--http_port=" + std::to_string(http_port_), "--http_header_timeout_s=1",
                          "--http_body_timeout_s=1", "--http_max_connections=64"});
    ASSERT_TRUE(server_->WaitReady());
  }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  // Fails the test unless the scheduler is alive and answers /health and a completion.
  static void ExpectServing() {
    ASSERT_EQ(server_->scheduler().Wait(0ms), std::nullopt) << "the scheduler died";
    RawHttpClient health(http_port_);
    ASSERT_TRUE(health.Send(Get("/health")));
    EXPECT_EQ(StatusOf(health.ReadResponse()), 200);
    RawHttpClient completion(http_port_);
    ASSERT_TRUE(
        completion.Send(Post("/v1/completions", R"({"prompt": [1, 2, 3], "max_tokens": 4})")));
    const std::string response = completion.ReadResponse();
    EXPECT_EQ(StatusOf(response), 200) << response;
  }

  static Server* server_;
  static int http_port_;
};

Server* HttpHardeningTest::server_ = nullptr;
int HttpHardeningTest::http_port_ = 0;

TEST_F(HttpHardeningTest, BodiesNestedAHundredThousandDeepAre400AndNothingDies) {
  const std::string deep = std::string(100000, '[') + std::string(100000, ']');
  const std::string message = R"({"role": "user", "content": "hi"})";
  const std::vector<std::pair<std::string, std::string>> bodies = {
      {"/v1/completions", R"({"prompt": [1, )" + deep + "]}"},
      {"/v1/chat/completions",
       R"({"messages": [)" + message + R"(], "response_format": )" + deep + "}"},
      {"/v1/chat/completions", R"({"messages": [)" + message + R"(], "tools": )" + deep + "}"},
      {"/v1/chat/completions", R"({"messages": [{"role": "user", "content": )" + deep + "}]}"},
      {"/v1/chat/completions",
       R"({"messages": [{"role": "user", "content": [{"type": "text", "text": )" + deep + "}]}]}"},
      {"/v1/completions", R"({"prompt": "a", "ignored": )" + deep + "}"},
  };
  for (const auto& [path, body] : bodies) {
    RawHttpClient c(http_port_);
    ASSERT_TRUE(c.Send(Post(path, body)));
    const std::string response = c.ReadResponse();
    EXPECT_EQ(StatusOf(response), 400) << path;
    const nlohmann::json error = ErrorOf(response);
    EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("more than 64 levels deep"));
    // Never the 200 KB value back.
    EXPECT_LT(response.size(), 1000u);
  }
  ExpectServing();
}

TEST_F(HttpHardeningTest, AChunkedBodyPastTheLimitIs413NotServed) {
  RawHttpClient c(http_port_);
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"));
  // 64 MiB in 1 MiB chunks (4x the 16 MiB limit) from another thread, while the answer is
  // read here: the server refuses it without reading it all.
  std::thread sender([&] {
    const std::string chunk = "100000\r\n" + std::string(1 << 20, ' ') + "\r\n";
    for (int i = 0; i < 64; ++i) {
      if (!c.Send(chunk)) return;
    }
  });
  const std::string response = c.ReadResponse();
  sender.join();
  EXPECT_EQ(StatusOf(response), 413) << response.substr(0, 300);
  EXPECT_THAT(ErrorOf(response)["message"].get<std::string>(), HasSubstr("exceeds 16777216 bytes"));
  // A chunked body within the limit is served.
  RawHttpClient ok(http_port_);
  const std::string body = R"({"prompt": [1, 2], "max_tokens": 2})";
  std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n";
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size());
  request += std::string(size) + "\r\n" + body + "\r\n0\r\n\r\n";
  ASSERT_TRUE(ok.Send(request));
  EXPECT_EQ(StatusOf(ok.ReadResponse()), 200);
  EXPECT_GE(server_->MetricSum("conveyor_http_refused_total"), 1);
}

TEST_F(HttpHardeningTest, ABodyThatNeverEndsIs408) {
  RawHttpClient c(http_port_);
  ASSERT_TRUE(
      c.Send("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"pro"));
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 408);
  EXPECT_THAT(ErrorOf(response)["message"].get<std::string>(), HasSubstr("body did not arrive"));
}

TEST_F(HttpHardeningTest, HeadersTrickledALineASecondAre408) {
  RawHttpClient c(http_port_);
  ASSERT_TRUE(c.Send("POST /v1/completions HTTP/1.1\r\n"));
  for (int i = 0; i < 5; ++i) {
    std::this_thread::sleep_for(400ms);
    if (!c.Send("X-Slow-" + std::to_string(i) + ": 1\r\n")) break;
  }
  const std::string response = c.ReadAll();
  EXPECT_EQ(StatusOf(response), 408) << response;
  ErrorOf(response);
}

TEST_F(HttpHardeningTest, AMillionHeaderLinesAre431) {
  RawHttpClient c(http_port_);
  std::thread sender([&] {
    std::string block = "POST /v1/completions HTTP/1.1\r\n";
    for (int i = 0; i < 10000; ++i) block += "X-A: b\r\n";
    for (int i = 0; i < 100 && c.Send(block); ++i) block = std::string(80000, 'X') + "\r\n";
  });
  const std::string response = c.ReadResponse();
  sender.join();
  EXPECT_EQ(StatusOf(response), 431);
  ErrorOf(response);
  ExpectServing();
}

// 300 connections that send a header line now and then once starved every client (256
// threads, one per connection). Now they cost memory: /health answers all along, and
// the scheduler starts no thread for them.
TEST_F(HttpHardeningTest, HundredsOfSlowConnectionsStarveNobody) {
  const pid_t pid = server_->scheduler().pid();
  const int threads_before = Threads(pid);
  std::vector<std::unique_ptr<RawHttpClient>> slow;
  for (int i = 0; i < 300; ++i) {
    slow.push_back(std::make_unique<RawHttpClient>(http_port_));
    slow.back()->Send("GET /health HTTP/1.1\r\n");
  }
  for (int round = 0; round < 3; ++round) {
    for (auto& c : slow) c->Send("X-Slow: 1\r\n");
    RawHttpClient health(http_port_);
    ASSERT_TRUE(health.Send(Get("/health")));
    EXPECT_EQ(StatusOf(health.ReadResponse()), 200) << "round " << round;
    std::this_thread::sleep_for(200ms);
  }
  // None per connection (gRPC's timer manager may start one of its own meanwhile).
  EXPECT_LE(Threads(pid), threads_before + 2);
  // Past the cap of 64, the longest-waiting of them made room for the others.
  EXPECT_GT(server_->MetricSum("conveyor_http_refused_total"), 200);
  ExpectServing();
}

// Peak memory (VmHWM) of the scheduler, in MiB, after resetting it to the current RSS.
double PeakRssMib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}
void ResetPeakRss(pid_t pid) {
  std::ofstream("/proc/" + std::to_string(pid) + "/clear_refs") << "5";
}
double RssMib(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stod(line.substr(6)) / 1024;
  }
  return -1;
}

// Four 16 MiB bodies at once, nesting deep in a field nobody reads, once peaked at 2.2 GB
// and left 1.67 GB resident: now each is refused before a tree is built.
TEST_F(HttpHardeningTest, FourBodiesAtTheLimitCostLittleMoreThanTheirBytes) {
  const pid_t pid = server_->scheduler().pid();
  std::string deep = R"({"prompt": "a", "ignored": [)";
  while (deep.size() < (16u << 20) - 100) deep += "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[0,";
  deep += "]}";
  const double before = RssMib(pid);
  ResetPeakRss(pid);
  std::vector<std::unique_ptr<RawHttpClient>> clients;
  for (int i = 0; i < 4; ++i) {
    clients.push_back(std::make_unique<RawHttpClient>(http_port_));
    ASSERT_TRUE(clients.back()->Send(Post("/v1/completions", deep)));
  }
  for (auto& c : clients) EXPECT_EQ(StatusOf(c->ReadResponse()), 400);
  // The bodies themselves (4 x 16 MiB) and little else.
  EXPECT_LT(PeakRssMib(pid) - before, 160);
  ExpectServing();
}

TEST_F(HttpHardeningTest, ANonStreamingClientThatLeavesIsCancelled) {
  RawHttpClient c(http_port_);
  ASSERT_TRUE(c.Send(Post("/v1/completions",
                          R"({"prompt": [1, 2, 3], "max_tokens": 100000, "ignore_eos": true})")));
  std::this_thread::sleep_for(300ms);
  c.Close();
  EXPECT_EQ(server_->MetricSettled("conveyor_requests_running", 0, 10s), 0);
  EXPECT_EQ(server_->MetricSettled("conveyor_kv_blocks_used", 0, 10s), 0);
}

TEST_F(HttpHardeningTest, EveryRefusalIsOpenAisShape) {
  const std::vector<std::pair<std::string, int>> cases = {
      {Get("/nowhere"), 404},
      {Get("/v1/completions"), 405},
      {Post("/v1/completions", "{not json"), 400},
      {Post("/v1/completions", R"({"prompt": "a", "logprobs": 1073741825})"), 400},
      {"BREW /coffee HTCPCP/1.0\r\n\r\n", 400},
  };
  for (const auto& [request, status] : cases) {
    RawHttpClient c(http_port_);
    ASSERT_TRUE(c.Send(request));
    const std::string response = c.ReadResponse();
    EXPECT_EQ(StatusOf(response), status) << request.substr(0, 40);
    const nlohmann::json error = ErrorOf(response);
    if (request.find("1073741825") != std::string::npos) {
      EXPECT_THAT(error["message"].get<std::string>(), HasSubstr("[0, 20]"));
    }
  }
}

// A drain used to wait out gRPC's 5 s shutdown deadline whenever a client merely held an
// idle channel (the chart's grace margin is 5 s).
TEST(HttpDrainTest, ExitIsPromptWhileClientsHoldIdleConnections) {
  const int http_port = FreePort();
  Server server({"--http_port=" + std::to_string(http_port)});
  ASSERT_TRUE(server.WaitReady());  // Leaves the test's gRPC channel connected and idle.
  RawHttpClient keep_alive(http_port);
  ASSERT_TRUE(keep_alive.Send(Get("/health")));
  ASSERT_EQ(StatusOf(keep_alive.ReadResponse()), 200);
  const auto start = std::chrono::steady_clock::now();
  server.scheduler().Signal(SIGTERM);
  EXPECT_EQ(server.scheduler().Wait(30s), 0);
  EXPECT_LT(std::chrono::steady_clock::now() - start, 3s);
  EXPECT_TRUE(keep_alive.ServerClosed());
}

}  // namespace
}  // namespace conveyor::testing
