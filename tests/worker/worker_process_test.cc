// A real conveyor-worker process driven over gRPC on loopback: Init, a greedy generation
// equal to the reference, a rejected step that leaves it serving, Health, Shutdown, and
// its metrics page.
#include <grpcpp/grpcpp.h>

#include <unistd.h>

#include <csignal>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "testing/subprocess.h"
#include "tests/support/scheduler_context.h"
#include "tests/support/test_support.h"
#include "worker.grpc.pb.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
namespace v1 = worker::v1;

class WorkerProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    metrics_port_ = FreePort();
    auto process =
        Subprocess::Start({WorkerBinary(), "--port=0",
                           "--metrics_port=" + std::to_string(metrics_port_), "--threads=2"});
    ASSERT_TRUE(process.has_value());
    process_.emplace(std::move(*process));
    const auto line = process_->WaitForLine("listening on", 30s);
    ASSERT_TRUE(line.has_value()) << "worker did not start";
    const int port = PortFromListeningLine(*line);
    ASSERT_GT(port, 0) << *line;
    process_->DrainStdout();
    auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                       grpc::InsecureChannelCredentials());
    stub_ = v1::Worker::NewStub(channel);
  }

  grpc::Status Call(const v1::StepRequest& request, v1::StepResponse* response) {
    SchedulerContext context;
    context.set_deadline(std::chrono::system_clock::now() + 30s);
    return stub_->Step(&context, request, response);
  }

  // Initialises the worker with the llama3_gqa test model, 16-token blocks, 8 MiB of KV.
  bool InitGqa(v1::InitResponse* init) {
    v1::InitRequest request;
    request.set_model_path(TestModelDir("llama3_gqa"));
    request.set_block_size(16);
    request.set_kv_cache_bytes(8 << 20);
    SchedulerContext context;
    const grpc::Status status = stub_->Init(&context, request, init);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return status.ok();
  }

  std::optional<Subprocess> process_;
  std::unique_ptr<v1::Worker::Stub> stub_;
  int metrics_port_ = 0;
};

// The metrics page is served, also by a worker built with CUDA, whose libraries' static
// TLS once left prometheus-cpp's small-stack threads unable to start; after Init it
// carries the model's metrics.
TEST_F(WorkerProcessTest, ServesItsMetricsPage) {
  ASSERT_TRUE(HttpGet(metrics_port_, "/metrics").has_value())
      << "no metrics page on port " << metrics_port_;
  v1::InitRequest init_request;
  init_request.set_model_path(TestModelDir("llama3_gqa"));
  init_request.set_kv_cache_bytes(8 << 20);
  v1::InitResponse init;
  SchedulerContext context;
  ASSERT_TRUE(stub_->Init(&context, init_request, &init).ok());
  const std::optional<std::string> page = HttpGet(metrics_port_, "/metrics");
  ASSERT_TRUE(page.has_value());
  EXPECT_NE(page->find("conveyor_worker_steps_total{"), std::string::npos) << *page;
  EXPECT_NE(page->find("conveyor_worker_weight_bytes{"), std::string::npos) << *page;
}

TEST_F(WorkerProcessTest, ServesInitStepHealthAndShutdown) {
  {
    SchedulerContext context;
    v1::StepRequest request;
    v1::StepResponse response;
    EXPECT_EQ(stub_->Step(&context, request, &response).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  v1::InitResponse init;
  v1::InitRequest init_request;
  init_request.set_model_path(TestModelDir("llama3_gqa"));
  init_request.set_block_size(16);
  init_request.set_kv_cache_bytes(8 << 20);
  {
    SchedulerContext context;
    ASSERT_TRUE(stub_->Init(&context, init_request, &init).ok());
  }
  EXPECT_GT(init.num_kv_blocks(), 0);
  EXPECT_EQ(init.block_size(), 16);
  EXPECT_EQ(init.model().num_layers(), 2);
  EXPECT_EQ(init.model().num_kv_heads(), 2);

  const Reference ref = LoadReference("llama3_gqa");
  const std::vector<int32_t>& prompt = ref.prompts.back();
  v1::StepRequest step;
  auto* seq = step.add_new_sequences();
  seq->set_seq_id(7);
  seq->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  seq->set_num_tokens(static_cast<int>(prompt.size()));
  for (int b = 0; b * 16 < static_cast<int>(prompt.size() + ref.greedy.back().size()); ++b) {
    seq->add_block_ids(b);
  }
  std::vector<int32_t> generated;
  while (generated.size() < ref.greedy.back().size()) {
    v1::StepResponse response;
    const grpc::Status status = Call(step, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
    ASSERT_EQ(response.tokens_size(), 1);
    generated.push_back(response.tokens(0).token_id());
    step.Clear();
    step.add_running()->set_seq_id(7);
    step.mutable_running(0)->set_num_tokens(1);

    if (generated.size() == 5) {
      // A malformed step in the middle is refused and changes nothing.
      v1::StepRequest bad;
      bad.add_running()->set_seq_id(12345);
      bad.mutable_running(0)->set_num_tokens(1);
      v1::StepResponse unused;
      const grpc::Status refused = Call(bad, &unused);
      EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
      EXPECT_NE(refused.error_message().find("12345"), std::string::npos);
    }
  }
  EXPECT_EQ(generated, ref.greedy.back());

  {
    SchedulerContext context;
    v1::HealthRequest request;
    v1::HealthResponse health;
    ASSERT_TRUE(stub_->Health(&context, request, &health).ok());
    EXPECT_TRUE(health.initialized());
    EXPECT_EQ(health.num_sequences(), 1);
  }
  {
    SchedulerContext context;
    v1::InitRequest request;
    request.set_model_path(TestModelDir("llama3_gqa"));
    v1::InitResponse again;
    EXPECT_EQ(stub_->Init(&context, request, &again).error_code(),
              grpc::StatusCode::FAILED_PRECONDITION);
  }
  {
    // A restarted scheduler repeats the same Init: same answer, sequences dropped.
    SchedulerContext context;
    v1::InitResponse again;
    ASSERT_TRUE(stub_->Init(&context, init_request, &again).ok());
    EXPECT_EQ(again.num_kv_blocks(), init.num_kv_blocks());
    grpc::ClientContext health_context;
    v1::HealthResponse health;
    ASSERT_TRUE(stub_->Health(&health_context, v1::HealthRequest(), &health).ok());
    EXPECT_EQ(health.num_sequences(), 0);
  }
  {
    SchedulerContext context;
    v1::ShutdownRequest request;
    v1::ShutdownResponse response;
    ASSERT_TRUE(stub_->Shutdown(&context, request, &response).ok());
  }
  EXPECT_EQ(process_->Wait(20s), 0);
}

// The scheduler sends a step before the answer to the one before it, and two calls in
// flight may reach the worker in either order: each runs right after the step it was
// built on (previous_step_id), and one built on a refused step is refused too.
TEST_F(WorkerProcessTest, RunsEachStepAfterTheOneItWasBuiltOnWhicheverArrivesFirst) {
  v1::InitResponse init;
  ASSERT_TRUE(InitGqa(&init));
  EXPECT_TRUE(init.orders_steps());
  const Reference ref = LoadReference("llama3_gqa");
  const std::vector<int32_t>& prompt = ref.prompts.back();
  ASSERT_GE(ref.greedy.back().size(), 3u);

  // Steps 1 (the prompt), 2 and 3 (decodes), sent 3, 2, 1.
  std::vector<v1::StepRequest> steps(3);
  auto* seq = steps[0].add_new_sequences();
  seq->set_seq_id(7);
  seq->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  seq->set_num_tokens(static_cast<int>(prompt.size()));
  for (int b = 0; b * 16 < static_cast<int>(prompt.size()) + 3; ++b) seq->add_block_ids(b);
  for (int i = 0; i < 3; ++i) {
    steps[i].set_step_id(i + 1);
    if (i > 0) {
      steps[i].set_previous_step_id(i);
      steps[i].add_running()->set_seq_id(7);
      steps[i].mutable_running(0)->set_num_tokens(1);
    }
  }
  std::vector<v1::StepResponse> responses(3);
  std::vector<grpc::Status> statuses(3);
  std::vector<std::thread> senders;
  for (int i = 2; i >= 0; --i) {
    senders.emplace_back([&, i] { statuses[i] = Call(steps[i], &responses[i]); });
    std::this_thread::sleep_for(100ms);  // Each waits in the worker before the next is sent.
  }
  for (std::thread& t : senders) t.join();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(statuses[i].ok()) << "step " << i + 1 << ": " << statuses[i].error_message();
    ASSERT_EQ(responses[i].tokens_size(), 1);
    EXPECT_EQ(responses[i].tokens(0).token_id(), ref.greedy.back()[i]) << "step " << i + 1;
  }

  v1::StepRequest bad;  // Step 4 names an unknown sequence: refused...
  bad.set_step_id(4);
  bad.set_previous_step_id(3);
  bad.add_running()->set_seq_id(12345);
  bad.mutable_running(0)->set_num_tokens(1);
  v1::StepRequest after_bad = steps[2];  // ...so step 5, a good step built on it, is too.
  after_bad.set_step_id(5);
  after_bad.set_previous_step_id(4);
  v1::StepResponse unused;
  EXPECT_EQ(Call(bad, &unused).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  const grpc::Status aborted = Call(after_bad, &unused);
  EXPECT_EQ(aborted.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(aborted.error_message().find("step 4"), std::string::npos) << aborted.error_message();
  const grpc::Status late = Call(steps[1], &unused);  // Step 2 again: behind step 5.
  EXPECT_EQ(late.error_code(), grpc::StatusCode::ABORTED) << late.error_message();

  // A step whose predecessor never comes waits until its call's deadline.
  v1::StepRequest orphan = steps[2];
  orphan.set_step_id(9);
  orphan.set_previous_step_id(8);
  SchedulerContext context;
  context.set_deadline(std::chrono::system_clock::now() + 300ms);
  EXPECT_EQ(stub_->Step(&context, orphan, &unused).error_code(),
            grpc::StatusCode::DEADLINE_EXCEEDED);

  // A reset step needs no predecessor, and the worker serves on.
  v1::StepRequest reset = steps[0];
  reset.set_step_id(10);
  reset.set_reset(true);
  v1::StepResponse first;
  const grpc::Status status = Call(reset, &first);
  ASSERT_TRUE(status.ok()) << status.error_message();
  ASSERT_EQ(first.tokens_size(), 1);
  EXPECT_EQ(first.tokens(0).token_id(), ref.greedy.back()[0]);
}

// The scheduler's transport: steps as messages on one stream, answered in order, each
// with its own status; a refused step is an answer, not the end of the stream. A caller
// that may not step is refused for the whole stream, and a shutdown ends open streams.
TEST_F(WorkerProcessTest, StepStreamAnswersEachStepInOrderAndSurvivesARefusal) {
  v1::InitResponse init;
  ASSERT_TRUE(InitGqa(&init));
  const Reference ref = LoadReference("llama3_gqa");
  const std::vector<int32_t>& prompt = ref.prompts.back();
  ASSERT_GE(ref.greedy.back().size(), 2u);

  v1::StepRequest prefill;
  prefill.set_step_id(1);
  auto* seq = prefill.add_new_sequences();
  seq->set_seq_id(7);
  seq->mutable_token_ids()->Add(prompt.begin(), prompt.end());
  seq->set_num_tokens(static_cast<int>(prompt.size()));
  for (int b = 0; b * 16 < static_cast<int>(prompt.size()) + 2; ++b) seq->add_block_ids(b);
  v1::StepRequest bad;  // A sequence the worker does not hold.
  bad.set_step_id(2);
  bad.add_running()->set_seq_id(12345);
  bad.mutable_running(0)->set_num_tokens(1);
  v1::StepRequest decode;
  decode.set_step_id(3);
  decode.add_running()->set_seq_id(7);
  decode.mutable_running(0)->set_num_tokens(1);

  SchedulerContext context;
  auto stream = stub_->StepStream(&context);
  // All three written before any answer is read: they wait in the stream.
  ASSERT_TRUE(stream->Write(prefill));
  ASSERT_TRUE(stream->Write(bad));
  ASSERT_TRUE(stream->Write(decode));
  ASSERT_TRUE(stream->WritesDone());
  std::vector<v1::StepStreamResponse> answers(3);
  for (v1::StepStreamResponse& answer : answers) ASSERT_TRUE(stream->Read(&answer));
  v1::StepStreamResponse extra;
  EXPECT_FALSE(stream->Read(&extra));
  EXPECT_TRUE(stream->Finish().ok());

  EXPECT_EQ(answers[0].step_id(), 1u);
  EXPECT_EQ(answers[0].status_code(), grpc::StatusCode::OK);
  ASSERT_EQ(answers[0].response().tokens_size(), 1);
  EXPECT_EQ(answers[0].response().tokens(0).token_id(), ref.greedy.back()[0]);
  EXPECT_EQ(answers[1].step_id(), 2u);
  EXPECT_EQ(answers[1].status_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(answers[1].status_message().find("12345"), std::string::npos)
      << answers[1].status_message();
  EXPECT_FALSE(answers[1].has_response());
  EXPECT_EQ(answers[2].step_id(), 3u);
  EXPECT_EQ(answers[2].status_code(), grpc::StatusCode::OK);
  ASSERT_EQ(answers[2].response().tokens_size(), 1);
  EXPECT_EQ(answers[2].response().tokens(0).token_id(), ref.greedy.back()[1]);

  {
    SchedulerContext stranger("another-scheduler");
    auto refused = stub_->StepStream(&stranger);
    refused->Write(decode);  // May fail already: the stream is refused on arrival.
    v1::StepStreamResponse answer;
    EXPECT_FALSE(refused->Read(&answer));
    EXPECT_EQ(refused->Finish().error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }

  SchedulerContext open_context;
  auto open = stub_->StepStream(&open_context);
  {
    SchedulerContext shutdown_context;
    v1::ShutdownResponse response;
    ASSERT_TRUE(stub_->Shutdown(&shutdown_context, v1::ShutdownRequest(), &response).ok());
  }
  v1::StepStreamResponse answer;
  EXPECT_FALSE(open->Read(&answer));  // Ended by the worker, not left open.
  EXPECT_FALSE(open->Finish().ok());
  EXPECT_EQ(process_->Wait(20s), 0);
}

// A worker on the scheduler's machine also serves on a Unix socket (--unix_socket), the
// cheaper transport for its steps.
TEST(WorkerUnixSocketTest, ServesOnTheSocketBesideItsPort) {
  const std::string socket = ::testing::TempDir() + "/worker-" + std::to_string(getpid()) + ".sock";
  auto process = Subprocess::Start(
      {WorkerBinary(), "--port=0", "--metrics_port=0", "--threads=1", "--unix_socket=" + socket});
  ASSERT_TRUE(process.has_value());
  ASSERT_TRUE(process->WaitForLine("listening on", 30s).has_value());
  process->DrainStdout();
  auto stub = v1::Worker::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  v1::InitRequest request;
  request.set_model_path(TestModelDir("llama3_gqa"));
  request.set_kv_cache_bytes(8 << 20);
  v1::InitResponse init;
  SchedulerContext context;
  context.set_deadline(std::chrono::system_clock::now() + 30s);
  const grpc::Status status = stub->Init(&context, request, &init);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(init.model().num_layers(), 2);
  process->Signal(SIGTERM);
  EXPECT_EQ(process->Wait(20s), 0);
}

TEST_F(WorkerProcessTest, InitErrorsNameTheProblem) {
  SchedulerContext context;
  v1::InitRequest request;
  request.set_model_path(TestDataDir() + "/no_such_model");
  v1::InitResponse response;
  const grpc::Status status = stub_->Init(&context, request, &response);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.error_message().find("no_such_model"), std::string::npos)
      << status.error_message();

  // The worker survives a failed Init and SIGTERM stops it cleanly.
  process_->Signal(SIGTERM);
  EXPECT_EQ(process_->Wait(20s), 0);
}

// Starts a worker with `env` (VAR=value, ...): 0 if it printed `log_line` (by default the
// line that says it serves), else its exit status. Through a shell that sends the
// worker's log (stderr) into the pipe Subprocess reads.
std::optional<int> RunWorkerWith(const std::vector<std::string>& env,
                                 const std::string& log_line = "listening on") {
  std::vector<std::string> argv = {"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", "/usr/bin/env"};
  argv.insert(argv.end(), env.begin(), env.end());
  argv.insert(argv.end(), {WorkerBinary(), "--port=0", "--metrics_port=0", "--threads=1"});
  auto p = Subprocess::Start(argv);
  if (!p.has_value()) return std::nullopt;
  if (p->WaitForLine(log_line, 30s).has_value()) {
    p->Signal(SIGTERM);
    p->DrainStdout();
    p->Wait(30s);
    return 0;  // Started and served.
  }
  return p->Wait(30s);
}

// CONVEYOR_CPU_ISA is read once and could only be ignored later, so a value the worker
// cannot honour stops it at start (exit 2); a level the CPU has starts it.
TEST(WorkerCpuIsaTest, AnUnusableLevelStopsTheWorkerAtStart) {
  auto run = [](const std::string& isa) { return RunWorkerWith({"CONVEYOR_CPU_ISA=" + isa}); };
  EXPECT_EQ(run("avx9"), 2);
  EXPECT_EQ(run("portable"), 0);
  EXPECT_EQ(run(kernels::CpuIsaName(kernels::DetectedCpuIsa())), 0);
  if (kernels::DetectedCpuIsa() < kernels::CpuIsa::kAvx512) {
    EXPECT_EQ(run("avx512"), 2);
  }
  if (kernels::DetectedCpuIsa() < kernels::CpuIsa::kAvx512Bf16) {
    EXPECT_EQ(run("avx512_bf16"), 2);
  }
}

// CONVEYOR_BF16_GEMM likewise: fma runs anywhere, vdpbf16ps only on the avx512_bf16
// level, anything else is refused; the log says which arithmetic runs and why.
TEST(WorkerCpuIsaTest, Bf16ArithmeticIsCheckedAtStartAndLogged) {
  EXPECT_EQ(RunWorkerWith({"CONVEYOR_BF16_GEMM=amx"}), 2);
  EXPECT_EQ(RunWorkerWith({"CONVEYOR_BF16_GEMM=fma"},
                          "bf16 weights multiply with fma (CONVEYOR_BF16_GEMM)"),
            0);
  EXPECT_EQ(RunWorkerWith({"CONVEYOR_BF16_GEMM=auto", "CONVEYOR_CPU_ISA=portable"},
                          "bf16 weights multiply with fma (the portable level has no vdpbf16ps)"),
            0);
  EXPECT_EQ(RunWorkerWith({"CONVEYOR_BF16_GEMM=vdpbf16ps", "CONVEYOR_CPU_ISA=portable"}), 2);
  if (kernels::DetectedCpuIsa() == kernels::CpuIsa::kAvx512Bf16) {
    EXPECT_EQ(RunWorkerWith({"CONVEYOR_BF16_GEMM=vdpbf16ps"},
                            "bf16 weights multiply with vdpbf16ps (CONVEYOR_BF16_GEMM)"),
              0);
    EXPECT_EQ(RunWorkerWith({}, "bf16 weights multiply with"), 0);  // Timed: either.
  }
}

// The CPU storage flags are checked at start: a value the worker does not know stops it
// (exit 2) with a message naming the flag and its values; the known ones start it.
TEST(WorkerCpuStorageFlagsTest, UnknownValuesStopTheWorkerAndSayWhatIsAccepted) {
  struct Case {
    std::string flag;
    std::optional<std::string> message;  // Expected on a refusal; none: it starts.
  };
  const Case cases[] = {
      {"--cpu_kv_dtype=fp8", "--cpu_kv_dtype must be auto, f32 or bf16, got \"fp8\""},
      {"--cpu_weight_dtype=fp4", "--cpu_weight_dtype must be auto, f32, bf16, int8 or gguf"},
      {"--cpu_kv_dtype=bf16", std::nullopt},
      {"--cpu_kv_dtype=f32", std::nullopt},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.flag);
    // Through a shell that sends the worker's log (stderr) into the pipe Subprocess reads.
    auto p = Subprocess::Start({"/bin/sh", "-c", "exec \"$0\" \"$@\" 2>&1", WorkerBinary(),
                                "--port=0", "--metrics_port=0", "--threads=1", c.flag});
    ASSERT_TRUE(p.has_value());
    if (c.message.has_value()) {
      EXPECT_TRUE(p->WaitForLine(*c.message, 30s).has_value());
      p->DrainStdout();
      EXPECT_EQ(p->Wait(30s), 2);
    } else {
      EXPECT_TRUE(p->WaitForLine("listening on", 30s).has_value());
      p->Signal(SIGTERM);
      p->DrainStdout();
      EXPECT_EQ(p->Wait(30s), 0);
    }
  }
}

}  // namespace
}  // namespace conveyor::testing
