// What an operator relies on, checked on real processes: gRPC health (NOT_SERVING until
// the workers are ready), reflection, a metrics page that promtool accepts and that agrees
// with what clients received, and a graceful drain on SIGTERM.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <thread>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health.grpc.pb.h"
#include "reflection.grpc.pb.h"
#include "testing/subprocess.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

HealthStatus::ServingStatus Health(Server& server) {
  auto stub = grpc::health::v1::Health::NewStub(server.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  HealthStatus response;
  const grpc::Status status =
      stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST(OperationsTest, HealthIsNotServingUntilTheWorkersAreReady) {
  Server server({}, /*start_worker=*/false);
  EXPECT_EQ(Health(server), HealthStatus::NOT_SERVING);
  const std::string port = server.worker_address().substr(server.worker_address().rfind(':') + 1);
  auto worker = Subprocess::Start({WorkerBinary(), "--port=" + port, "--metrics_port=0"});
  ASSERT_TRUE(worker.has_value());
  ASSERT_TRUE(worker->WaitForLine("listening on", 30s).has_value());
  worker->DrainStdout();
  ASSERT_TRUE(server.WaitReady());
  EXPECT_EQ(Health(server), HealthStatus::SERVING);
  EXPECT_EQ(server.Generate(Greedy({1, 2, 3}, 4)).tokens.size(), 4u);
}

TEST(OperationsTest, SigtermWhileWaitingForWorkersExitsZeroAtOnce) {
  // No worker ever comes; the scheduler would wait --worker_init_timeout_s (600 s).
  Server server({}, /*start_worker=*/false);
  EXPECT_EQ(Health(server), HealthStatus::NOT_SERVING);
  server.scheduler().Signal(SIGTERM);
  EXPECT_EQ(server.scheduler().Wait(10s), 0);
}

// A metrics port that another process holds is an error naming the flag, exit 1: not an
// abort from prometheus-cpp's exception.
TEST(OperationsTest, ATakenMetricsPortIsAnErrorNotACrash) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  auto p = Subprocess::Start({SchedulerBinary(), "--model=" + TestModelDir("llama3_gqa"),
                              "--port=0", "--workers=127.0.0.1:1",
                              "--metrics_port=" + std::to_string(ntohs(addr.sin_port))});
  ASSERT_TRUE(p.has_value());
  p->DrainStdout();
  EXPECT_EQ(p->Wait(30s), 1);  // nullopt would be a death by signal.
  close(fd);
}

TEST(OperationsTest, ReflectionListsTheServices) {
  Server server({"--enable_reflection"});
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(server.channel());
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> names;
  for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
  EXPECT_THAT(names, ::testing::IsSupersetOf({"conveyor.v1.Conveyor", "grpc.health.v1.Health"}));
  EXPECT_TRUE(stream->Finish().ok());
}

TEST(OperationsTest, MetricsPassPromtoolAndMatchWhatClientsReceived) {
  Server server({});
  ASSERT_TRUE(server.WaitReady());
  const std::vector<v1::GenerateRequest> requests = MixedRequests(12, 8);
  const std::vector<Stream> streams = RunConcurrently(server, requests);
  int tokens = 0;
  for (const Stream& s : streams) {
    ASSERT_TRUE(s.status.ok());
    tokens += static_cast<int>(s.tokens.size());
  }
  EXPECT_EQ(server.Metric("conveyor_generated_tokens_total"), tokens);
  EXPECT_EQ(server.Metric("conveyor_time_to_first_token_seconds_count"), 12);
  EXPECT_EQ(server.Metric("conveyor_e2e_request_latency_seconds_count"), 12);
  EXPECT_EQ(server.Metric("conveyor_inter_token_latency_seconds_count"), tokens - 12);
  EXPECT_EQ(server.Metric("conveyor_workers_ready"), 1);

  const auto page = server.MetricsPage();
  ASSERT_TRUE(page.has_value());
  const std::string path = ::testing::TempDir() + "/conveyor_metrics.prom";
  FILE* f = std::fopen(path.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fwrite(page->data(), 1, page->size(), f);
  std::fclose(f);
  // promtool (Debian's `prometheus` package, installed by scripts/install-deps.sh) is
  // the independent judge of the exposition format and naming conventions.
  const std::string command = "promtool check metrics < " + path + " 2>&1";
  FILE* out = popen(command.c_str(), "r");
  ASSERT_NE(out, nullptr);
  std::string report;
  char buffer[512];
  while (std::fgets(buffer, sizeof(buffer), out) != nullptr) report += buffer;
  EXPECT_EQ(pclose(out), 0) << report;
  EXPECT_EQ(report, "") << report;
}

TEST(OperationsTest, SigtermDrainsRunningStreamsRefusesNewOnesAndExitsZero) {
  Server server({"--drain_timeout_s=60"});
  ASSERT_TRUE(server.WaitReady());
  // Long enough that the drain is still going when the refused call arrives.
  std::vector<Stream> streams(16);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  threads.reserve(16);
  for (int i = 0; i < 16; ++i) {
    threads.emplace_back([&, i] {
      streams[i] = server.Generate(Greedy({1, 11, static_cast<int32_t>(40 + i)}, 1500), 120s,
                                   [&](const Stream& s) {
                                     if (s.tokens.size() == 1) ++started;
                                     return false;
                                   });
    });
  }
  while (started < 16) std::this_thread::sleep_for(1ms);
  server.scheduler().Signal(SIGTERM);
  std::this_thread::sleep_for(300ms);
  const Stream refused = server.Generate(Greedy({1, 2, 3}, 4), 5s);
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  for (std::thread& t : threads) t.join();
  for (const Stream& s : streams) {
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens.size(), 1500u);
  }
  EXPECT_EQ(server.scheduler().Wait(30s), 0);
}

TEST(OperationsTest, DrainTimeoutEndsWhatIsLeftWithAStatus) {
  Server server({"--drain_timeout_s=0.3"});
  ASSERT_TRUE(server.WaitReady());
  std::vector<Stream> streams(4);
  std::atomic<int> started{0};
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int i = 0; i < 4; ++i) {
    threads.emplace_back([&, i] {
      streams[i] = server.Generate(Greedy({1, 12, static_cast<int32_t>(50 + i)}, 1900), 120s,
                                   [&](const Stream& s) {
                                     if (s.tokens.size() == 1) ++started;
                                     return false;
                                   });
    });
  }
  while (started < 4) std::this_thread::sleep_for(1ms);
  server.scheduler().Signal(SIGTERM);
  for (std::thread& t : threads) t.join();
  for (const Stream& s : streams) {
    EXPECT_EQ(s.status.error_code(), grpc::StatusCode::UNAVAILABLE);
    EXPECT_THAT(s.status.error_message(), HasSubstr("shut down"));
    EXPECT_LT(s.tokens.size(), 1900u);
  }
  EXPECT_EQ(server.scheduler().Wait(30s), 0);
}

}  // namespace
}  // namespace conveyor::testing
