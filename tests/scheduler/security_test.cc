// TLS, mTLS and bearer tokens on real processes, with throw-away certificates from the
// openssl CLI (tests/support/make_test_certs.sh): the client API over TLS and mTLS, the
// scheduler <-> worker plane over mTLS (including a tensor-parallel pair, whose Gloo
// rendezvous store is mTLS too), tokens missing / wrong / right, the per-token limit,
// the plaintext health port, reflection off by default, and HTTPS with curl.
#include <grpcpp/grpcpp.h>

#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <thread>

#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health.grpc.pb.h"
#include "reflection.grpc.pb.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"
#include "worker.grpc.pb.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using HealthStatus = grpc::health::v1::HealthCheckResponse;

constexpr char kAliceToken[] = "alice-0123456789abcdef";
constexpr char kBobToken[] = "bob-0123456789abcdefgh";

std::string ReadAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The certificates, made once for the whole suite.
class Certificates {
 public:
  Certificates() {
    const std::string command = std::string(CONVEYOR_MAKE_TEST_CERTS) + " " + dir_.path() + " 2>&1";
    EXPECT_EQ(std::system(command.c_str()), 0) << command;
  }
  std::string operator()(const std::string& name) const { return dir_.path() + "/" + name; }

 private:
  TestTempDir dir_;
};

const Certificates& Certs() {
  static const Certificates* certs = new Certificates();
  return *certs;
}

// Client-side TLS: trusts `ca`, presents `cert`/`key` when given.
std::shared_ptr<grpc::ChannelCredentials> TlsClient(const std::string& ca,
                                                    const std::string& cert = "",
                                                    const std::string& key = "") {
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = ReadAll(Certs()(ca));
  if (!cert.empty()) {
    options.pem_cert_chain = ReadAll(Certs()(cert));
    options.pem_private_key = ReadAll(Certs()(key));
  }
  return grpc::SslCredentials(options);
}

std::shared_ptr<grpc::Channel> Channel(int port,
                                       const std::shared_ptr<grpc::ChannelCredentials>& creds) {
  // "localhost" is what the server certificate names.
  return grpc::CreateChannel("localhost:" + std::to_string(port), creds);
}

struct Process {
  std::optional<Subprocess> process;
  int port = 0;
};

// Starts a binary and waits for its "listening on" line. An empty process (and a test
// failure) if it does not come up.
Process Start(std::vector<std::string> argv) {
  Process p;
  auto started = Subprocess::Start(argv);
  if (!started.has_value()) {
    ADD_FAILURE() << "cannot start " << argv[0];
    return p;
  }
  p.process.emplace(std::move(*started));
  const auto line = p.process->WaitForLine("listening on", 30s);
  if (!line.has_value()) {
    ADD_FAILURE() << argv[0] << " did not start listening";
    return p;
  }
  p.port = PortFromListeningLine(*line);
  p.process->DrainStdout();
  return p;
}

std::vector<std::string> WorkerMtls() {
  return {"--tls_cert_file=" + Certs()("server.crt"), "--tls_key_file=" + Certs()("server.key"),
          "--tls_ca_file=" + Certs()("ca.crt")};
}

// The scheduler's side of the worker plane, with its own certificate `cert`.
std::vector<std::string> SchedulerToWorkersMtls(const std::string& cert = "client") {
  return {"--worker_tls_ca_file=" + Certs()("ca.crt"),
          "--worker_tls_cert_file=" + Certs()(cert + ".crt"),
          "--worker_tls_key_file=" + Certs()(cert + ".key")};
}

Process StartWorker(std::vector<std::string> flags) {
  std::vector<std::string> argv = {WorkerBinary(), "--port=0", "--metrics_port=0", "--threads=1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return Start(argv);
}

Process StartScheduler(const std::string& workers, std::vector<std::string> flags) {
  std::vector<std::string> argv = {
      SchedulerBinary(),           "--port=0",
      "--metrics_port=0",          "--model=" + TestModelDir("llama3_gqa"),
      "--workers=" + workers,      "--block_size=4",
      "--worker_init_timeout_s=60"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  return Start(argv);
}

struct Call {
  grpc::Status status;
  int tokens = 0;
};

// One Generate of `max_new` greedy tokens; `token` empty sends none.
Call Generate(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
              int max_new = 4, std::chrono::milliseconds timeout = 60s) {
  auto stub = v1::Conveyor::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + timeout);
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  auto reader = stub->Generate(&context, Greedy({1, 2, 3}, max_new));
  Call call;
  v1::GenerateResponse response;
  while (reader->Read(&response)) call.tokens += response.token_ids_size();
  call.status = reader->Finish();
  return call;
}

grpc::Status GetModelInfo(const std::shared_ptr<grpc::Channel>& channel, const std::string& token) {
  auto stub = v1::Conveyor::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 10s);
  if (!token.empty()) context.AddMetadata("authorization", "Bearer " + token);
  v1::ModelInfoResponse info;
  return stub->GetModelInfo(&context, v1::ModelInfoRequest(), &info);
}

// Waits until GetModelInfo answers OK (the workers are initialised) or `limit` passes.
bool WaitReady(const std::shared_ptr<grpc::Channel>& channel, const std::string& token,
               std::chrono::milliseconds limit = 30s) {
  const auto end = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < end) {
    if (GetModelInfo(channel, token).ok()) return true;
    std::this_thread::sleep_for(100ms);
  }
  return false;
}

// gRPC health's answer, or the call's failure as an UNKNOWN status.
grpc::Status Health(const std::shared_ptr<grpc::Channel>& channel, HealthStatus* out) {
  auto stub = grpc::health::v1::Health::NewStub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  return stub->Check(&context, grpc::health::v1::HealthCheckRequest(), out);
}

// curl's HTTP status for `url` (0 when the connection or handshake failed).
int Curl(const std::string& url, const std::string& extra) {
  const std::string command = "curl -s -o /dev/null -w '%{http_code}' --max-time 20 " + extra +
                              " '" + url + "' 2>/dev/null";
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[16] = {};
  const size_t n = fread(buffer, 1, sizeof(buffer) - 1, pipe);
  pclose(pipe);
  return std::atoi(std::string(buffer, n).c_str());
}

// The whole stack secured: workers over mTLS, the client API over TLS with tokens
// (alice may run one generation at a time, bob any number), health on a plaintext port.
class SecuredServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    tokens_dir_ = new TestTempDir();
    std::ofstream(tokens_dir_->path() + "/tokens") << "# test clients\n"
                                                   << kAliceToken << " alice 1\n"
                                                   << kBobToken << " bob\n";
    std::vector<std::string> worker_flags = WorkerMtls();
    worker_health_port_ = FreePort();
    worker_flags.push_back("--health_port=" + std::to_string(worker_health_port_));
    worker_ = new Process(StartWorker(worker_flags));
    std::vector<std::string> flags = SchedulerToWorkersMtls();
    for (const std::string& f :
         {"--tls_cert_file=" + Certs()("server.crt"), "--tls_key_file=" + Certs()("server.key"),
          "--auth_tokens_file=" + tokens_dir_->path() + "/tokens"}) {
      flags.push_back(f);
    }
    health_port_ = FreePort();
    http_port_ = FreePort();
    flags.push_back("--health_port=" + std::to_string(health_port_));
    flags.push_back("--http_port=" + std::to_string(http_port_));
    scheduler_ = new Process(StartScheduler("localhost:" + std::to_string(worker_->port), flags));
  }
  static void TearDownTestSuite() {
    delete scheduler_;
    delete worker_;
    delete tokens_dir_;
  }
  void SetUp() override {
    ASSERT_GT(scheduler_->port, 0);
    channel_ = Channel(scheduler_->port, TlsClient("ca.crt"));
    ASSERT_TRUE(WaitReady(channel_, kBobToken)) << "the secured server never became ready";
  }

  static TestTempDir* tokens_dir_;
  static Process* worker_;
  static Process* scheduler_;
  static int health_port_, worker_health_port_, http_port_;
  std::shared_ptr<grpc::Channel> channel_;
};

TestTempDir* SecuredServerTest::tokens_dir_ = nullptr;
Process* SecuredServerTest::worker_ = nullptr;
Process* SecuredServerTest::scheduler_ = nullptr;
int SecuredServerTest::health_port_ = 0;
int SecuredServerTest::worker_health_port_ = 0;
int SecuredServerTest::http_port_ = 0;

TEST_F(SecuredServerTest, TokenMissingOrWrongIsUnauthenticatedAndRightOneGenerates) {
  const Call none = Generate(channel_, "");
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(none.status.error_message(), HasSubstr("Bearer <token>"));
  EXPECT_EQ(Generate(channel_, "not-a-token-0123456789").status.error_code(),
            grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(GetModelInfo(channel_, "").error_code(), grpc::StatusCode::UNAUTHENTICATED);
  const Call alice = Generate(channel_, kAliceToken, 8);
  EXPECT_TRUE(alice.status.ok()) << alice.status.error_message();
  EXPECT_EQ(alice.tokens, 8);
}

TEST_F(SecuredServerTest, PlaintextAndUntrustingClientsFailTheHandshake) {
  const auto plaintext = Channel(scheduler_->port, grpc::InsecureChannelCredentials());
  EXPECT_EQ(Generate(plaintext, kBobToken, 4, 5s).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
  // A client that trusts another CA does not accept the server's certificate.
  const auto wrong_ca = Channel(scheduler_->port, TlsClient("other-ca.crt"));
  EXPECT_EQ(Generate(wrong_ca, kBobToken, 4, 5s).status.error_code(),
            grpc::StatusCode::UNAVAILABLE);
}

TEST_F(SecuredServerTest, HealthNeedsNoTokenAndThePlaintextPortsServeOnlyHealth) {
  HealthStatus health;
  ASSERT_TRUE(Health(channel_, &health).ok());
  EXPECT_EQ(health.status(), HealthStatus::SERVING);
  const auto plain = grpc::CreateChannel("127.0.0.1:" + std::to_string(health_port_),
                                         grpc::InsecureChannelCredentials());
  ASSERT_TRUE(Health(plain, &health).ok());
  EXPECT_EQ(health.status(), HealthStatus::SERVING);
  EXPECT_EQ(Generate(plain, kBobToken).status.error_code(), grpc::StatusCode::UNIMPLEMENTED);
  const auto worker_plain = grpc::CreateChannel("127.0.0.1:" + std::to_string(worker_health_port_),
                                                grpc::InsecureChannelCredentials());
  ASSERT_TRUE(Health(worker_plain, &health).ok());
  EXPECT_EQ(health.status(), HealthStatus::SERVING);
}

TEST_F(SecuredServerTest, ReflectionIsOffByDefault) {
  auto stub = grpc::reflection::v1alpha::ServerReflection::NewStub(channel_);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 5s);
  auto stream = stub->ServerReflectionInfo(&context);
  grpc::reflection::v1alpha::ServerReflectionRequest request;
  request.set_list_services("");
  stream->Write(request);
  stream->WritesDone();
  grpc::reflection::v1alpha::ServerReflectionResponse response;
  EXPECT_FALSE(stream->Read(&response));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(SecuredServerTest, APerTokenLimitRefusesTheNextGenerationUntilOneEnds) {
  // alice's one slot is taken by a long generation...
  Call first;
  std::thread long_call([&] { first = Generate(channel_, kAliceToken, 400); });
  bool refused = false;
  for (int i = 0; i < 200 && !refused; ++i) {
    std::this_thread::sleep_for(20ms);
    const Call second = Generate(channel_, kAliceToken, 1);
    if (second.status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
      refused = true;
      EXPECT_THAT(second.status.error_message(), HasSubstr("\"alice\""));
    }
  }
  EXPECT_TRUE(refused) << "alice's second generation was never refused";
  // ...while bob, under his own token, is not limited by hers.
  const Call bob = Generate(channel_, kBobToken, 2);
  EXPECT_TRUE(bob.status.ok()) << bob.status.error_message();
  long_call.join();
  EXPECT_TRUE(first.status.ok()) << first.status.error_message();
  EXPECT_EQ(first.tokens, 400);
  // The slot is free again.
  EXPECT_TRUE(Generate(channel_, kAliceToken, 1).status.ok());
}

TEST_F(SecuredServerTest, TheWorkerRefusesCallersWithoutACertificateFromItsCa) {
  auto health = [&](const std::shared_ptr<grpc::ChannelCredentials>& creds) {
    auto stub = worker::v1::Worker::NewStub(Channel(worker_->port, creds));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    worker::v1::HealthResponse response;
    return stub->Health(&context, worker::v1::HealthRequest(), &response);
  };
  EXPECT_EQ(health(grpc::InsecureChannelCredentials()).error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(health(TlsClient("ca.crt")).error_code(), grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  EXPECT_EQ(health(TlsClient("ca.crt", "rogue.crt", "rogue.key")).error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "a certificate from another CA";
  // A certificate from the deployment's CA gets through the handshake.
  EXPECT_TRUE(health(TlsClient("ca.crt", "client.crt", "client.key")).ok());
}

TEST_F(SecuredServerTest, HttpsNeedsTheTokenAndRefusesPlainHttp) {
  const std::string base = "https://localhost:" + std::to_string(http_port_);
  const std::string ca = "--cacert " + Certs()("ca.crt");
  EXPECT_EQ(Curl(base + "/health", ca), 200);
  EXPECT_EQ(Curl(base + "/v1/models", ca), 401);
  EXPECT_EQ(Curl(base + "/v1/models", ca + " -H 'Authorization: Bearer wrong-0123456789abc'"), 401);
  EXPECT_EQ(Curl(base + "/v1/models", ca + " -H 'Authorization: Bearer " + kBobToken + "'"), 200);
  // Anthropic's clients send the token as x-api-key.
  EXPECT_EQ(Curl(base + "/v1/models", ca + " -H 'x-api-key: " + kBobToken + "'"), 200);
  EXPECT_EQ(Curl(base + "/v1/models", ca + " -H 'x-api-key: wrong-0123456789abc'"), 401);
  // What scrapers and routers poll is open (docs/security.md); rendering a prompt is not.
  for (const char* open : {"/metrics", "/server_info", "/model_info", "/get_load"}) {
    EXPECT_EQ(Curl(base + open, ca), 200) << open;
  }
  EXPECT_EQ(Curl(base + "/v1/completions/render", ca + " -d '{\"prompt\": \"hi\"}'"), 401);
  EXPECT_EQ(Curl("http://localhost:" + std::to_string(http_port_) + "/v1/models", ""), 0);
  // curl trusting only the system's CAs does not accept the test CA's certificate.
  EXPECT_EQ(Curl(base + "/health", ""), 0);
}

TEST(ClientMtlsTest, OnlyClientsWithACertificateFromTheClientCaGetIn) {
  Process worker = StartWorker({});
  const int http_port = FreePort();
  Process scheduler = StartScheduler(
      "127.0.0.1:" + std::to_string(worker.port),
      {"--tls_cert_file=" + Certs()("server.crt"), "--tls_key_file=" + Certs()("server.key"),
       "--tls_client_ca_file=" + Certs()("ca.crt"), "--http_port=" + std::to_string(http_port)});
  ASSERT_GT(scheduler.port, 0);
  const auto good = Channel(scheduler.port, TlsClient("ca.crt", "client.crt", "client.key"));
  ASSERT_TRUE(WaitReady(good, ""));
  EXPECT_EQ(Generate(good, "", 4).tokens, 4);
  EXPECT_EQ(Generate(Channel(scheduler.port, TlsClient("ca.crt")), "", 4, 5s).status.error_code(),
            grpc::StatusCode::UNAVAILABLE)
      << "no client certificate";
  EXPECT_EQ(
      Generate(Channel(scheduler.port, TlsClient("ca.crt", "rogue.crt", "rogue.key")), "", 4, 5s)
          .status.error_code(),
      grpc::StatusCode::UNAVAILABLE)
      << "a certificate from another CA";
  // HTTPS asks for the same client certificates.
  const std::string models = "https://localhost:" + std::to_string(http_port) + "/v1/models";
  const std::string ca = "--cacert " + Certs()("ca.crt");
  EXPECT_EQ(
      Curl(models, ca + " --cert " + Certs()("client.crt") + " --key " + Certs()("client.key")),
      200);
  EXPECT_EQ(Curl(models, ca), 0) << "no client certificate";
  EXPECT_EQ(Curl(models, ca + " --cert " + Certs()("rogue.crt") + " --key " + Certs()("rogue.key")),
            0)
      << "a certificate from another CA";
}

TEST(WorkerMtlsTest, ASchedulerWithAnUntrustedCertificateNeverGetsTheWorker) {
  Process worker = StartWorker(WorkerMtls());
  Process scheduler =
      StartScheduler("localhost:" + std::to_string(worker.port), SchedulerToWorkersMtls("rogue"));
  ASSERT_GT(scheduler.port, 0);
  const auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(scheduler.port),
                                           grpc::InsecureChannelCredentials());
  EXPECT_FALSE(WaitReady(channel, "", 4s));
  HealthStatus health;
  ASSERT_TRUE(Health(channel, &health).ok());
  EXPECT_EQ(health.status(), HealthStatus::NOT_SERVING);
}

TEST(WorkerMtlsTest, TheWorkersCertificateMustNameItsHost) {
  // The worker presents a certificate for elsewhere.example but is reached as localhost.
  Process worker = StartWorker({"--tls_cert_file=" + Certs()("wrongname.crt"),
                                "--tls_key_file=" + Certs()("wrongname.key"),
                                "--tls_ca_file=" + Certs()("ca.crt")});
  const std::string address = "localhost:" + std::to_string(worker.port);
  {
    Process scheduler = StartScheduler(address, SchedulerToWorkersMtls());
    ASSERT_GT(scheduler.port, 0);
    const auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(scheduler.port),
                                             grpc::InsecureChannelCredentials());
    EXPECT_FALSE(WaitReady(channel, "", 4s));
  }
  // Told which name to expect, the scheduler accepts it.
  std::vector<std::string> flags = SchedulerToWorkersMtls();
  flags.emplace_back("--worker_tls_server_name=elsewhere.example");
  Process scheduler = StartScheduler(address, flags);
  ASSERT_GT(scheduler.port, 0);
  const auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(scheduler.port),
                                           grpc::InsecureChannelCredentials());
  ASSERT_TRUE(WaitReady(channel, ""));
  EXPECT_EQ(Generate(channel, "", 4).tokens, 4);
}

TEST(WorkerMtlsTest, TwoTensorParallelRanksMeetOverMtls) {
  Process rank0 = StartWorker(WorkerMtls());
  Process rank1 = StartWorker(WorkerMtls());
  Process scheduler = StartScheduler(
      "localhost:" + std::to_string(rank0.port) + ",localhost:" + std::to_string(rank1.port),
      SchedulerToWorkersMtls());
  ASSERT_GT(scheduler.port, 0);
  const auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(scheduler.port),
                                           grpc::InsecureChannelCredentials());
  ASSERT_TRUE(WaitReady(channel, "", 60s));
  const Call call = Generate(channel, "", 6);
  EXPECT_TRUE(call.status.ok()) << call.status.error_message();
  EXPECT_EQ(call.tokens, 6);
}

TEST(TlsRotationTest, ARotatedCertificateIsServedWithoutARestart) {
  // The scheduler's certificate files are replaced in place, as a Secret update does;
  // with --tls_refresh_s=1 new connections to the gRPC and the HTTPS port get the new
  // certificate within seconds.
  TestTempDir dir;
  const std::string cert = dir.path() + "/tls.crt";
  const std::string key = dir.path() + "/tls.key";
  auto copy = [](const std::string& from, const std::string& to) {
    std::ofstream(to + ".tmp") << ReadAll(from);
    std::rename((to + ".tmp").c_str(), to.c_str());
  };
  copy(Certs()("server.crt"), cert);
  copy(Certs()("server.key"), key);
  const int http_port = FreePort();
  Process scheduler =
      StartScheduler("127.0.0.1:" + std::to_string(FreePort()),
                     {"--tls_cert_file=" + cert, "--tls_key_file=" + key, "--tls_refresh_s=1",
                      "--http_port=" + std::to_string(http_port)});
  ASSERT_GT(scheduler.port, 0);
  auto grpc_ok = [&](const std::string& ca) {
    HealthStatus health;
    return Health(Channel(scheduler.port, TlsClient(ca)), &health).ok();
  };
  // curl trusting only `ca` gets an HTTP status from /health (503: no worker here), or
  // none when the handshake fails.
  auto https_ok = [&](const std::string& ca) {
    return Curl("https://localhost:" + std::to_string(http_port) + "/health",
                "--cacert " + Certs()(ca)) != 0;
  };
  auto within_10s = [](const std::function<bool()>& done) {
    for (int i = 0; i < 50; ++i) {
      if (done()) return true;
      std::this_thread::sleep_for(200ms);
    }
    return false;
  };
  EXPECT_TRUE(grpc_ok("ca.crt"));
  EXPECT_FALSE(grpc_ok("other-ca.crt"));
  EXPECT_TRUE(https_ok("ca.crt"));
  EXPECT_FALSE(https_ok("other-ca.crt"));
  copy(Certs()("rogue.crt"), cert);  // Issued by the other CA.
  copy(Certs()("rogue.key"), key);
  EXPECT_TRUE(within_10s([&] { return grpc_ok("other-ca.crt"); }))
      << "gRPC did not serve the new certificate within 10 s";
  EXPECT_FALSE(grpc_ok("ca.crt"));
  EXPECT_TRUE(within_10s([&] { return https_ok("other-ca.crt"); }))
      << "HTTPS did not serve the new certificate within 10 s";
  EXPECT_FALSE(https_ok("ca.crt"));
}

TEST(TlsConfigTest, BadFilesStopTheProcessAtStartWithAMessage) {
  auto exit_code = [](const std::vector<std::string>& argv) -> std::optional<int> {
    auto p = Subprocess::Start(argv);
    if (!p.has_value()) return std::nullopt;
    p->DrainStdout();
    return p->Wait(30s);
  };
  const std::string model = "--model=" + TestModelDir("llama3_gqa");
  // A key that is not the certificate's.
  EXPECT_EQ(exit_code({SchedulerBinary(), model, "--port=0", "--metrics_port=0",
                       "--tls_cert_file=" + Certs()("server.crt"),
                       "--tls_key_file=" + Certs()("client.key")}),
            2);
  // A worker with half its mTLS files.
  EXPECT_EQ(exit_code({WorkerBinary(), "--port=0", "--metrics_port=0",
                       "--tls_cert_file=" + Certs()("server.crt"),
                       "--tls_key_file=" + Certs()("server.key")}),
            2);
  // A file that is not a certificate.
  EXPECT_EQ(exit_code({SchedulerBinary(), model, "--port=0", "--metrics_port=0",
                       "--tls_cert_file=" + Certs()("server.key"),
                       "--tls_key_file=" + Certs()("server.key")}),
            2);
  // A tokens file that does not parse.
  TestTempDir dir;
  std::ofstream(dir.path() + "/tokens") << "short\n";
  EXPECT_EQ(exit_code({SchedulerBinary(), model, "--port=0", "--metrics_port=0",
                       "--auth_tokens_file=" + dir.path() + "/tokens"}),
            2);
}

}  // namespace
}  // namespace conveyor::testing
