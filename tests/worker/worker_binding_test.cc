// A real conveyor-worker process and the scheduler it is bound to (worker/service.h):
// who calls is decided before a request is parsed (a stranger's 40 MB Step is refused
// PERMISSION_DENIED whatever its bytes, and costs no parse; garbage from the bound
// scheduler is INVALID_ARGUMENT naming its message type), only an Init that succeeds
// binds, a refusal says when the worker could become free (and when that would not help),
// and a worker without mTLS warns once at start that the first caller can bind it.
#include <grpcpp/grpcpp.h>
#include <grpcpp/impl/client_unary_call.h>
#include <grpcpp/support/sync_stream.h>

#include <csignal>
#include <cstdio>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "testing/subprocess.h"
#include "tests/support/scheduler_context.h"
#include "tests/support/test_support.h"
#include "worker.grpc.pb.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using ::testing::Not;
namespace v1 = worker::v1;

constexpr char kStranger[] = "not-the-scheduler";
constexpr char kStepMethod[] = "/conveyor.worker.v1.Worker/Step";
constexpr char kInitMethod[] = "/conveyor.worker.v1.Worker/Init";
constexpr size_t kBigStepBytes = 40 << 20;
// Bytes that are no protobuf message: 0xff starts a tag whose varint never ends.
const std::string kGarbage(4, '\xff');

// A conveyor-worker whose log (stderr) comes through the pipe Subprocess reads.
struct Worker {
  std::optional<Subprocess> process;
  int port = 0;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Worker::Stub> stub;
};

// Starts a worker with `flags` and waits until it listens. Unless `keep_log`, its log is
// drained (a test that reads it must keep reading).
Worker StartWorker(const std::vector<std::string>& flags, bool keep_log = false) {
  Worker w;
  std::vector<std::string> argv = {
      "/bin/sh",          "-c",          "exec \"$0\" \"$@\" 2>&1", WorkerBinary(), "--port=0",
      "--metrics_port=0", "--threads=1", "--log_level=info"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  auto process = Subprocess::Start(argv);
  if (!process.has_value()) {
    ADD_FAILURE() << "cannot start the worker";
    return w;
  }
  w.process.emplace(std::move(*process));
  // The first such line is the one on stdout, printed before the log says the same.
  const auto line = w.process->WaitForLine("conveyor-worker listening on", 30s);
  if (!line.has_value()) {
    ADD_FAILURE() << "the worker did not start";
    return w;
  }
  w.port = PortFromListeningLine(*line);
  if (!keep_log) w.process->DrainStdout();
  w.channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(w.port),
                                  grpc::InsecureChannelCredentials());
  w.stub = v1::Worker::NewStub(w.channel);
  return w;
}

v1::InitRequest TestInit() {
  v1::InitRequest request;
  request.set_model_path(TestModelDir("llama3_gqa"));
  request.set_block_size(16);
  request.set_kv_cache_bytes(8 << 20);
  return request;
}

grpc::Status Init(Worker& w, const std::string& id, const v1::InitRequest& request) {
  SchedulerContext context(id);
  context.set_deadline(std::chrono::system_clock::now() + 60s);
  v1::InitResponse response;
  return w.stub->Init(&context, request, &response);
}

// Sends `bytes` as the request of `method` with the scheduler identity `id` (none if
// empty), as a client that knows no message types would.
grpc::Status CallRaw(Worker& w, const std::string& method, const std::string& bytes,
                     const std::string& id) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + 60s);
  if (!id.empty()) context.AddMetadata(kSchedulerIdMetadataKey, id);
  grpc::Slice slice(bytes);
  const grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  // What a generated stub does, with bytes for messages.
  return grpc::internal::BlockingUnaryCall<grpc::ByteBuffer, grpc::ByteBuffer>(
      w.channel.get(),
      grpc::internal::RpcMethod(method.c_str(), grpc::internal::RpcMethod::NORMAL_RPC), &context,
      request, &response);
}

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

// A length-delimited field: tag, length, `payload`.
std::string LengthDelimited(int field, const std::string& payload) {
  std::string out;
  AppendVarint(static_cast<uint64_t>(field) << 3 | 2, &out);
  AppendVarint(payload.size(), &out);
  return out + payload;
}

// A valid StepRequest of about `bytes` bytes: one new sequence whose packed token ids
// take one byte each on the wire and four once parsed.
std::string BigStep(size_t bytes) {
  return LengthDelimited(
      v1::StepRequest::kNewSequencesFieldNumber,
      LengthDelimited(v1::NewSequence::kTokenIdsFieldNumber, std::string(bytes, '\x07')));
}

// The peak resident memory of process `pid` so far (VmHWM), in bytes; -1 if unknown.
int64_t PeakRssBytes(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(status, line)) {
    long long kib = 0;
    if (std::sscanf(line.c_str(), "VmHWM: %lld kB", &kib) == 1) return kib * 1024;
  }
  return -1;
}

// The numbers of a refusal: "last called it X s ago", "the N s binding lease", "in Y s".
struct RefusalNumbers {
  double silent_s = -1;
  double lease_s = -1;
  double free_in_s = -1;
};
std::optional<RefusalNumbers> ParseRefusal(const std::string& message) {
  static const std::regex pattern(
      R"(last called it ([0-9.]+) s ago;.* the ([0-9.]+) s binding lease: in ([0-9.]+) s at the earliest)");
  std::smatch m;
  if (!std::regex_search(message, m, pattern)) return std::nullopt;
  return RefusalNumbers{std::stod(m[1]), std::stod(m[2]), std::stod(m[3])};
}

// Who calls is decided first: a stranger's (or an anonymous caller's) 40 MB of garbage
// is PERMISSION_DENIED, not INVALID_ARGUMENT (nor gRPC's own INTERNAL of old), and so is
// a valid 40 MB step; on a worker nobody initialised, a Step is FAILED_PRECONDITION
// whatever its bytes. The bound scheduler then steps as before.
TEST(WorkerBindingTest, StrangersBigStepIsRefusedBeforeItIsParsed) {
  Worker w = StartWorker({});
  const std::string garbage = std::string(kBigStepBytes, '\xff');
  const grpc::Status unbound = CallRaw(w, kStepMethod, garbage, kStranger);
  EXPECT_EQ(unbound.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << unbound.error_message();
  EXPECT_THAT(unbound.error_message(), HasSubstr("not initialised"));

  ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());
  for (const std::string id : {kStranger, ""}) {
    SCOPED_TRACE("caller \"" + id + "\"");
    for (const std::string* bytes : {&garbage, &kGarbage}) {
      const grpc::Status refused = CallRaw(w, kStepMethod, *bytes, id);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED)
          << refused.error_message();
    }
    const grpc::Status init = CallRaw(w, kInitMethod, kGarbage, id);
    EXPECT_EQ(init.error_code(), grpc::StatusCode::PERMISSION_DENIED) << init.error_message();
  }
  EXPECT_EQ(CallRaw(w, kStepMethod, BigStep(kBigStepBytes), kStranger).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);

  v1::StepRequest step;  // Still the bound scheduler's: an empty step runs.
  SchedulerContext context;
  v1::StepResponse response;
  const grpc::Status ok = w.stub->Step(&context, step, &response);
  EXPECT_TRUE(ok.ok()) << ok.error_message();
}

// A stranger's valid 40 MB step (160 MiB of token ids once parsed) no longer costs a
// parse: the worker's peak memory grows by what gRPC received, not by the message. The
// numbers are printed for the record (docs/security.md quotes them).
TEST(WorkerBindingTest, StrangersBigStepCostsNoParse) {
  Worker w = StartWorker({});
  ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());
  const std::string big = BigStep(kBigStepBytes);
  {
    v1::StepRequest small;  // The same shape, small: a step the worker would parse.
    ASSERT_TRUE(small.ParseFromString(BigStep(1000)));
    ASSERT_EQ(small.new_sequences(0).token_ids_size(), 1000);
  }
  const int64_t before = PeakRssBytes(w.process->pid());
  ASSERT_GT(before, 0);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(CallRaw(w, kStepMethod, big, kStranger).error_code(),
              grpc::StatusCode::PERMISSION_DENIED);
  }
  const int64_t after = PeakRssBytes(w.process->pid());
  const double growth_mib = static_cast<double>(after - before) / (1 << 20);
  std::printf(
      "worker peak RSS (VmHWM): %.1f MiB before, %.1f MiB after three refused %zu MiB "
      "steps from a stranger: +%.1f MiB\n",
      static_cast<double>(before) / (1 << 20), static_cast<double>(after) / (1 << 20),
      kBigStepBytes >> 20, growth_mib);
  RecordProperty("peak_rss_growth_mib", std::to_string(growth_mib));
  // Parsed, the token ids alone take 160 MiB (and more while their array grows); the
  // bytes gRPC receives take 40 MiB, and up to about as much again while it assembles
  // them.
  EXPECT_LT(growth_mib, 100) << "the refused step was parsed?";
}

// Bytes that are no message, from the bound scheduler, are INVALID_ARGUMENT with a
// message naming the type and what is wrong (gRPC's own parse answered INTERNAL with
// none); the worker serves on.
TEST(WorkerBindingTest, MalformedBytesFromTheBoundSchedulerAreInvalidArgument) {
  Worker w = StartWorker({});
  ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());
  struct Case {
    std::string method;
    std::string bytes;
    std::string says;
  };
  const std::vector<Case> cases = {
      {kStepMethod, kGarbage,
       "not a valid conveyor.worker.v1.StepRequest message: its 4 bytes "
       "are not protobuf wire format"},
      // Wire format, but new_sequences holds no NewSequence.
      {kStepMethod, LengthDelimited(v1::StepRequest::kNewSequencesFieldNumber, kGarbage),
       "StepRequest message: its 6 bytes are protobuf wire format, but a field does not fit"},
      {kInitMethod, kGarbage, "not a valid conveyor.worker.v1.InitRequest message"},
      {"/conveyor.worker.v1.Worker/Health", kGarbage, "conveyor.worker.v1.HealthRequest"},
      {"/conveyor.worker.v1.Worker/CreateCollectiveId", kGarbage,
       "conveyor.worker.v1.CreateCollectiveIdRequest"},
      {"/conveyor.worker.v1.Worker/Shutdown", kGarbage, "conveyor.worker.v1.ShutdownRequest"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.method);
    const grpc::Status status = CallRaw(w, c.method, c.bytes, kTestSchedulerId);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
    EXPECT_THAT(status.error_message(), HasSubstr(c.says));
  }
  SchedulerContext context;
  v1::HealthResponse health;
  ASSERT_TRUE(w.stub->Health(&context, v1::HealthRequest(), &health).ok());
  EXPECT_TRUE(health.initialized());
}

// On the step stream, bytes that are no StepRequest have no step id to be answered under:
// the stream ends with INVALID_ARGUMENT saying why, and the worker goes on serving.
TEST(WorkerBindingTest, MalformedBytesOnTheStepStreamEndItWithInvalidArgument) {
  Worker w = StartWorker({});
  ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());
  SchedulerContext context;
  context.set_deadline(std::chrono::system_clock::now() + 60s);
  // What a generated stub does, with bytes for messages.
  std::unique_ptr<grpc::ClientReaderWriter<grpc::ByteBuffer, grpc::ByteBuffer>> stream(
      grpc::internal::ClientReaderWriterFactory<grpc::ByteBuffer, grpc::ByteBuffer>::Create(
          w.channel.get(),
          grpc::internal::RpcMethod("/conveyor.worker.v1.Worker/StepStream",
                                    grpc::internal::RpcMethod::BIDI_STREAMING),
          &context));
  grpc::Slice slice(kGarbage);
  stream->Write(grpc::ByteBuffer(&slice, 1));
  grpc::ByteBuffer answer;
  EXPECT_FALSE(stream->Read(&answer));
  const grpc::Status status = stream->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_THAT(status.error_message(),
              HasSubstr("not a valid conveyor.worker.v1.StepRequest message"));
  SchedulerContext health_context;
  v1::HealthResponse health;
  ASSERT_TRUE(w.stub->Health(&health_context, v1::HealthRequest(), &health).ok());
  EXPECT_TRUE(health.initialized());
}

// Only an Init that succeeds binds: a fresh caller whose Init fails, or who only asked
// for a collective id, leaves the worker free, and another's Init succeeds at once;
// after that, the first is refused.
TEST(WorkerBindingTest, OnlyASuccessfulInitBinds) {
  Worker w = StartWorker({});
  v1::InitRequest missing = TestInit();
  missing.set_model_path(TestDataDir() + "/no_such_model");
  const grpc::Status failed = Init(w, "first", missing);
  ASSERT_FALSE(failed.ok());
  EXPECT_NE(failed.error_code(), grpc::StatusCode::PERMISSION_DENIED) << failed.error_message();
  {
    SchedulerContext context("first");
    v1::CreateCollectiveIdResponse id;
    ASSERT_TRUE(w.stub->CreateCollectiveId(&context, v1::CreateCollectiveIdRequest(), &id).ok());
  }
  const grpc::Status second = Init(w, "second", TestInit());
  ASSERT_TRUE(second.ok()) << second.error_message();
  const grpc::Status first_again = Init(w, "first", TestInit());
  EXPECT_EQ(first_again.error_code(), grpc::StatusCode::PERMISSION_DENIED)
      << first_again.error_message();
  // And a failed Init of the bound scheduler keeps its binding.
  EXPECT_FALSE(Init(w, "second", missing).ok());
  EXPECT_EQ(Init(w, "first", TestInit()).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

// A refusal says how long ago the bound scheduler called, the lease and the earliest
// time the worker could become free; to an Init for another model or layout, also that
// waiting will not help. It never names the model, nor the bound scheduler's identity.
TEST(WorkerBindingTest, RefusalSaysWhenTheWorkerCouldBecomeFree) {
  Worker w = StartWorker({"--binding_lease_s=30"});
  ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());
  std::this_thread::sleep_for(1500ms);
  const grpc::Status refused = Init(w, kStranger, TestInit());
  ASSERT_EQ(refused.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  const std::string& message = refused.error_message();
  const std::optional<RefusalNumbers> n = ParseRefusal(message);
  ASSERT_TRUE(n.has_value()) << message;
  EXPECT_GE(n->silent_s, 1.4) << message;
  EXPECT_LT(n->silent_s, 15) << message;
  EXPECT_EQ(n->lease_s, 30) << message;
  EXPECT_NEAR(n->silent_s + n->free_in_s, 30, 0.11) << message;
  EXPECT_THAT(message, Not(HasSubstr("restart")));
  EXPECT_THAT(message, Not(HasSubstr("llama3_gqa")));
  EXPECT_THAT(message, Not(HasSubstr(kTestSchedulerId)));

  // The bound scheduler's Health renews the lease: the next refusal counts from it.
  {
    SchedulerContext context;
    v1::HealthResponse health;
    ASSERT_TRUE(w.stub->Health(&context, v1::HealthRequest(), &health).ok());
  }
  const std::optional<RefusalNumbers> renewed =
      ParseRefusal(Init(w, kStranger, TestInit()).error_message());
  ASSERT_TRUE(renewed.has_value());
  EXPECT_LT(renewed->silent_s, 1.0);

  // Another layout: even a free worker would refuse it.
  v1::InitRequest other = TestInit();
  other.set_block_size(8);
  const grpc::Status other_layout = Init(w, kStranger, other);
  ASSERT_EQ(other_layout.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(other_layout.error_message(),
              HasSubstr("another model or layout than this Init asks for, so waiting for it "
                        "will not help: restart the worker to load another model"));
  EXPECT_TRUE(ParseRefusal(other_layout.error_message()).has_value())
      << other_layout.error_message();
  EXPECT_THAT(other_layout.error_message(), Not(HasSubstr("llama3_gqa")));
}

// Once the bound scheduler was silent past its lease, a Step or Shutdown of another is
// still refused (saying the worker is free), and only another's Init that succeeds takes
// the worker over; the scheduler it served is refused from then on.
TEST(WorkerBindingTest, ALapsedBindingGoesOnlyToAnInitThatSucceeds) {
  Worker w = StartWorker({"--binding_lease_s=1"});
  ASSERT_TRUE(Init(w, "first", TestInit()).ok());
  std::this_thread::sleep_for(1500ms);
  SchedulerContext context(kStranger);
  v1::StepResponse response;
  const grpc::Status step = w.stub->Step(&context, v1::StepRequest(), &response);
  EXPECT_EQ(step.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(step.error_message(), HasSubstr("it is free, but only an Init that succeeds"));
  v1::InitRequest other = TestInit();
  other.set_block_size(8);
  const grpc::Status other_layout = Init(w, kStranger, other);  // Admitted, and it fails.
  EXPECT_EQ(other_layout.error_code(), grpc::StatusCode::FAILED_PRECONDITION)
      << other_layout.error_message();
  const grpc::Status takeover = Init(w, kStranger, TestInit());
  ASSERT_TRUE(takeover.ok()) << takeover.error_message();
  SchedulerContext first("first");
  EXPECT_EQ(w.stub->Step(&first, v1::StepRequest(), &response).error_code(),
            grpc::StatusCode::PERMISSION_DENIED);
}

// Reads the worker's log to its end (the worker stopped by SIGTERM): the lines that
// contain `needle` after the one that says it listens.
std::vector<std::string> LogLinesAfterStart(Worker& w, const std::string& needle) {
  // The log's own "listening on" line, after which the warning comes (if it does).
  EXPECT_TRUE(w.process->WaitForLine("] conveyor-worker listening on", 30s).has_value());
  w.process->Signal(SIGTERM);
  std::vector<std::string> lines;
  while (std::optional<std::string> line = w.process->WaitForLine(needle, 30s)) {
    lines.push_back(*std::move(line));
  }
  EXPECT_EQ(w.process->Wait(30s), 0);
  return lines;
}

constexpr char kNoMtlsWarning[] = "no mTLS: any caller that reaches port";

// Without mTLS the worker says once, at start, that the first caller can bind it and
// which flags close that; with mTLS it does not.
TEST(WorkerStartupWarningTest, WarnsOnceWithoutMtlsOnly) {
  {
    Worker w = StartWorker({}, /*keep_log=*/true);
    ASSERT_TRUE(w.process.has_value());
    ASSERT_TRUE(Init(w, kTestSchedulerId, TestInit()).ok());  // Binding it warns no more.
    const std::vector<std::string> warnings = LogLinesAfterStart(w, kNoMtlsWarning);
    ASSERT_EQ(warnings.size(), 1u);
    EXPECT_THAT(warnings[0], HasSubstr("[warning]"));
    EXPECT_THAT(warnings[0], HasSubstr("port " + std::to_string(w.port) + " first can bind"));
    for (const char* flag :
         {"--tls_cert_file", "--tls_key_file", "--tls_ca_file", "--worker_tls_cert_file",
          "--worker_tls_key_file", "--worker_tls_ca_file"}) {
      EXPECT_THAT(warnings[0], HasSubstr(flag));
    }
  }
  TestTempDir certs;
  const std::string command =
      std::string(CONVEYOR_MAKE_TEST_CERTS) + " " + certs.path() + " >/dev/null 2>&1";
  ASSERT_EQ(std::system(command.c_str()), 0) << command;
  Worker w = StartWorker({"--tls_cert_file=" + certs.path() + "/server.crt",
                          "--tls_key_file=" + certs.path() + "/server.key",
                          "--tls_ca_file=" + certs.path() + "/ca.crt"},
                         /*keep_log=*/true);
  ASSERT_TRUE(w.process.has_value());
  EXPECT_THAT(LogLinesAfterStart(w, kNoMtlsWarning), ::testing::IsEmpty());
}

}  // namespace
}  // namespace conveyor::testing
