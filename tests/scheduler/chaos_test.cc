// Worker failures on real processes: a worker killed (kill -9) and restarted under 8
// streams, a tensor-parallel rank killed, a worker that never returns, a frozen worker
// (SIGSTOP), and a rogue client on the worker port. Every accepted stream either
// completes exactly as its uninterrupted twin (greedy and seeded sampling alike: a
// resumed sequence is recomputed, and its random draws depend only on seed and position)
// or ends with a status that says why. The failure tests run with one step in flight and
// with two (a step sent before the last one's answer, abandoned when that one fails); the
// twin always runs with the scheduler's default.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <mutex>
#include <thread>

#include "conveyor.grpc.pb.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "health.grpc.pb.h"
#include "rpc/scheduler_id_metadata.h"
#include "testing/subprocess.h"
#include "tests/support/server_process.h"
#include "tests/support/test_support.h"
#include "worker.grpc.pb.h"

namespace conveyor::testing {
namespace {

using namespace std::chrono_literals;
using ::testing::HasSubstr;
using Clock = std::chrono::steady_clock;
using HealthStatus = grpc::health::v1::HealthCheckResponse;
namespace wv1 = worker::v1;

constexpr int kNewTokens = 600;

// A conveyor-worker on a fixed port, so that a restarted one is found where the dead one
// was.
Subprocess StartWorker(int port, std::vector<std::string> flags = {}) {
  std::vector<std::string> argv = {WorkerBinary(), "--port=" + std::to_string(port),
                                   "--metrics_port=0", "--threads=1"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  std::optional<Subprocess> worker = Subprocess::Start(argv);
  EXPECT_TRUE(worker.has_value());
  EXPECT_TRUE(worker->WaitForLine("listening on", 30s).has_value());
  worker->DrainStdout();
  return std::move(*worker);
}

// A scheduler (tests/support/server_process.h, started without a worker of its own) over
// workers on fixed ports, with gRPC health and a client stub.
class Scheduler {
 public:
  Scheduler(const std::vector<int>& worker_ports, std::vector<std::string> flags)
      : server_(WithWorkers(worker_ports, std::move(flags)), /*start_worker=*/false),
        stub_(v1::Conveyor::NewStub(server_.channel())) {}

  bool WaitServing(std::chrono::milliseconds timeout = 60s) {
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      if (Health() == HealthStatus::SERVING) return true;
      std::this_thread::sleep_for(50ms);
    }
    return false;
  }

  HealthStatus::ServingStatus Health() {
    auto stub = grpc::health::v1::Health::NewStub(server_.channel());
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    HealthStatus response;
    if (!stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response).ok()) {
      return HealthStatus::UNKNOWN;
    }
    return response.status();
  }

  double Metric(const std::string& name) { return server_.Metric(name); }
  v1::Conveyor::Stub* stub() { return stub_.get(); }

 private:
  // `flags` with --workers naming `ports` (it overrides the Server's own, a later flag
  // winning).
  static std::vector<std::string> WithWorkers(const std::vector<int>& ports,
                                              std::vector<std::string> flags) {
    std::string workers;
    for (int port : ports) {
      workers += (workers.empty() ? "" : ",") + std::string("127.0.0.1:") + std::to_string(port);
    }
    flags.push_back("--workers=" + workers);
    return flags;
  }

  Server server_;
  std::unique_ptr<v1::Conveyor::Stub> stub_;
};

// Streams of one run: tokens as they arrive (with when), the final status.
struct Streams {
  std::vector<std::vector<int>> tokens;
  std::vector<std::vector<Clock::time_point>> arrivals;
  std::vector<grpc::Status> statuses;
  std::vector<std::atomic<int>> progress;
  // Room for every token up front: the main thread reads arrivals while streams append.
  explicit Streams(size_t n) : tokens(n), arrivals(n), statuses(n), progress(n) {
    for (size_t i = 0; i < n; ++i) {
      tokens[i].reserve(kNewTokens);
      arrivals[i].reserve(kNewTokens);
    }
  }

  int MinProgress() const {
    int least = 1 << 30;
    for (const auto& p : progress) least = std::min(least, p.load());
    return least;
  }
};

// 4 greedy and 4 seeded-sampling requests, each with its own prompt.
std::vector<v1::GenerateRequest> EightRequests() {
  std::vector<v1::GenerateRequest> requests;
  for (int i = 0; i < 8; ++i) {
    v1::GenerateRequest r;
    for (int t = 0; t < 5 + 3 * i; ++t) r.mutable_token_ids()->add_ids(3 + (t * 37 + i * 11) % 500);
    r.set_max_new_tokens(kNewTokens);
    r.set_ignore_eos(true);
    if (i < 4) {
      r.set_temperature(0);
    } else {
      r.set_temperature(0.9f);
      r.set_top_p(0.95f);
      r.set_seed(1000 + i);
    }
    r.set_request_id("stream-" + std::to_string(i));
    requests.push_back(r);
  }
  return requests;
}

// Starts every request on its own thread; the threads fill `streams`.
std::vector<std::thread> StartStreams(Scheduler& scheduler,
                                      const std::vector<v1::GenerateRequest>& requests,
                                      Streams& streams) {
  std::vector<std::thread> threads;
  for (size_t i = 0; i < requests.size(); ++i) {
    threads.emplace_back([&, i] {
      grpc::ClientContext context;  // No deadline: a hung worker must not look like one.
      auto reader = scheduler.stub()->Generate(&context, requests[i]);
      v1::GenerateResponse response;
      while (reader->Read(&response)) {
        for (int id : response.token_ids()) {
          streams.tokens[i].push_back(id);
          streams.arrivals[i].push_back(Clock::now());
        }
        streams.progress[i] = static_cast<int>(streams.tokens[i].size());
      }
      streams.statuses[i] = reader->Finish();
      streams.progress[i] = 1 << 30;
    });
  }
  return threads;
}

void Join(std::vector<std::thread>& threads) {
  for (std::thread& t : threads) t.join();
}

bool WaitProgress(const Streams& streams, int tokens, std::chrono::milliseconds timeout = 60s) {
  const auto until = Clock::now() + timeout;
  while (streams.MinProgress() < tokens) {
    if (Clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// The uninterrupted twin of a run: the same requests on fresh processes (a scheduler
// with `flags`).
std::vector<std::vector<int>> TwinRun(int world, std::vector<std::string> flags = {}) {
  std::vector<Subprocess> workers;
  std::vector<int> ports;
  for (int r = 0; r < world; ++r) {
    ports.push_back(FreePort());
    workers.push_back(StartWorker(ports.back()));
  }
  Scheduler scheduler(ports, std::move(flags));
  EXPECT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);
  Join(threads);
  for (const grpc::Status& s : streams.statuses) EXPECT_TRUE(s.ok()) << s.error_message();
  return streams.tokens;
}

void ExpectSameAsTwin(const Streams& streams, const std::vector<std::vector<int>>& twin) {
  for (size_t i = 0; i < twin.size(); ++i) {
    EXPECT_TRUE(streams.statuses[i].ok())
        << "stream " << i << ": " << streams.statuses[i].error_message();
    EXPECT_EQ(streams.tokens[i].size(), static_cast<size_t>(kNewTokens)) << "stream " << i;
    EXPECT_TRUE(streams.tokens[i] == twin[i])
        << "stream " << i << " differs from its uninterrupted twin (duplicated, missing or "
        << "different tokens)";
  }
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// The parameter: the scheduler's --max_steps_in_flight.
class ChaosStepsTest : public ::testing::TestWithParam<int> {
 protected:
  std::string InFlight() const { return "--max_steps_in_flight=" + std::to_string(GetParam()); }
};

TEST_P(ChaosStepsTest, WorkerKilledAndRestartedFiveTimesLosesNothing) {
  const std::vector<std::vector<int>> twin = TwinRun(1);
  const int port = FreePort();
  std::optional<Subprocess> worker(StartWorker(port));
  Scheduler scheduler({port}, {"--worker_recovery_timeout_s=60", InFlight()});
  ASSERT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);

  std::vector<double> recovery_ms;
  for (int kill = 0; kill < 5; ++kill) {
    // Mid-generation: every stream has made progress and none is near its end.
    if (!WaitProgress(streams, 40 + 100 * kill) || streams.MinProgress() >= kNewTokens - 50) {
      ADD_FAILURE() << "the streams did not reach kill " << kill << " mid-generation";
      break;
    }
    worker->Signal(SIGKILL);
    worker->Wait(10s);
    worker.reset();
    std::this_thread::sleep_for(200ms);
    const auto restarted = Clock::now();
    worker.emplace(StartWorker(port));
    // Recovery time: from the restart to the first token any stream receives after it.
    const auto until = Clock::now() + 60s;
    std::optional<Clock::time_point> first;
    while (!first && Clock::now() < until) {
      for (size_t i = 0; i < streams.arrivals.size() && !first; ++i) {
        const int n = std::min<int>(streams.progress[i], kNewTokens);
        if (n > 0 && n <= static_cast<int>(streams.arrivals[i].size()) &&
            streams.arrivals[i][n - 1] > restarted) {
          first = streams.arrivals[i][n - 1];
        }
      }
      std::this_thread::sleep_for(1ms);
    }
    if (!first.has_value()) {
      ADD_FAILURE() << "no stream resumed after restart " << kill;
      break;
    }
    recovery_ms.push_back(std::chrono::duration<double, std::milli>(*first - restarted).count());
  }
  Join(threads);
  ExpectSameAsTwin(streams, twin);
  std::printf("[ RECOVERY ] restart to first resumed token over %zu kills: p50 %.0f ms (",
              recovery_ms.size(), Median(recovery_ms));
  for (double ms : recovery_ms) std::printf(" %.0f", ms);
  std::printf(" )\n");
  EXPECT_GE(scheduler.Metric("conveyor_worker_failures_total"), 5);
  EXPECT_GE(scheduler.Metric("conveyor_worker_recoveries_total"), 5);
  EXPECT_GE(scheduler.Metric("conveyor_resumed_requests_total"), 8);
  EXPECT_GT(scheduler.Metric("conveyor_recomputed_tokens_total"), 0);
  EXPECT_EQ(scheduler.Health(), HealthStatus::SERVING);
}

// Two ranks serving the eight requests under a scheduler with `flags`; rank 1 is killed
// mid-generation and restarted. Every stream must equal its uninterrupted twin.
void KillRankOneMidRunLosesNothing(const std::vector<std::string>& flags) {
  const std::vector<std::vector<int>> twin = TwinRun(2, flags);
  const std::vector<int> ports = {FreePort(), FreePort()};
  Subprocess rank0 = StartWorker(ports[0]);
  std::optional<Subprocess> rank1(StartWorker(ports[1]));
  std::vector<std::string> recovering = flags;
  recovering.emplace_back("--worker_recovery_timeout_s=60");
  Scheduler scheduler(ports, recovering);
  ASSERT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);
  EXPECT_TRUE(WaitProgress(streams, 40));
  rank1->Signal(SIGKILL);
  rank1->Wait(10s);
  rank1.reset();
  std::this_thread::sleep_for(200ms);
  rank1.emplace(StartWorker(ports[1]));
  Join(threads);
  ExpectSameAsTwin(streams, twin);
  EXPECT_GE(scheduler.Metric("conveyor_worker_recoveries_total"), 1);
}

TEST_P(ChaosStepsTest, TensorParallelRankOneKilledAndRestartedLosesNothing) {
  KillRankOneMidRunLosesNothing({InFlight()});
}

// Recovery by recompute on a mixture-of-experts model, each expert sharded over two ranks:
// the replayed prompts and outputs route to the same experts, so nothing changes.
TEST(ChaosTest, MixtureOfExpertsRankKilledAndRestartedLosesNothing) {
  KillRankOneMidRunLosesNothing({"--model=" + TestModelDir("qwen3_moe")});
}

// Speculative decoding through a lost rank: two tensor-parallel ranks verify drafts, rank
// 1 is killed mid-run, and recovery by recompute (drafts in flight dropped, each request's
// tokens replayed) still gives every stream its uninterrupted twin's tokens.
TEST(ChaosTest, SpeculatingTensorParallelRankKilledAndRestartedLosesNothing) {
  KillRankOneMidRunLosesNothing({"--speculative_method=suffix", "--prompt_lookup_min=1"});
}

TEST_P(ChaosStepsTest, FrozenWorkerIsAWorkerFailureNotAClientDeadline) {
  const std::vector<std::vector<int>> twin = TwinRun(1);
  const int port = FreePort();
  Subprocess worker = StartWorker(port);
  Scheduler scheduler({port}, {"--step_timeout_s=1", "--worker_recovery_timeout_s=60", InFlight()});
  ASSERT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);
  EXPECT_TRUE(WaitProgress(streams, 40));
  worker.Signal(SIGSTOP);
  std::this_thread::sleep_for(2500ms);
  EXPECT_EQ(scheduler.Health(), HealthStatus::NOT_SERVING);
  worker.Signal(SIGCONT);
  Join(threads);
  ExpectSameAsTwin(streams, twin);
  EXPECT_GE(scheduler.Metric("conveyor_worker_failures_total"), 1);
  EXPECT_EQ(scheduler.Health(), HealthStatus::SERVING);
}

TEST_P(ChaosStepsTest, WorkerThatNeverReturnsEndsEveryStreamThenServesWhenBack) {
  const int port = FreePort();
  std::optional<Subprocess> worker(StartWorker(port));
  Scheduler scheduler({port}, {"--worker_recovery_timeout_s=2", InFlight()});
  ASSERT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);
  EXPECT_TRUE(WaitProgress(streams, 20));
  worker->Signal(SIGKILL);
  worker->Wait(10s);
  worker.reset();
  Join(threads);  // None hangs: each ends once recovery outlasts its timeout.
  for (const grpc::Status& s : streams.statuses) {
    EXPECT_EQ(s.error_code(), grpc::StatusCode::UNAVAILABLE) << s.error_message();
    EXPECT_THAT(s.error_message(), HasSubstr("worker_recovery_timeout_s"));
  }
  EXPECT_EQ(scheduler.Health(), HealthStatus::NOT_SERVING);
  EXPECT_EQ(scheduler.Metric("conveyor_workers_ready"), 0);
  // New requests are refused at once while the outage lasts.
  {
    grpc::ClientContext context;
    auto reader = scheduler.stub()->Generate(&context, requests[0]);
    v1::GenerateResponse response;
    while (reader->Read(&response)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
  }
  worker.emplace(StartWorker(port));
  ASSERT_TRUE(scheduler.WaitServing());
  EXPECT_EQ(scheduler.Metric("conveyor_workers_ready"), 1);
  Streams again(1);
  const std::vector<v1::GenerateRequest> first_request = {requests[0]};
  std::vector<std::thread> one = StartStreams(scheduler, first_request, again);
  Join(one);
  EXPECT_TRUE(again.statuses[0].ok()) << again.statuses[0].error_message();
  EXPECT_EQ(again.tokens[0].size(), static_cast<size_t>(kNewTokens));
}

INSTANTIATE_TEST_SUITE_P(StepsInFlight, ChaosStepsTest, ::testing::Values(1, 2),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == 1 ? std::string("OneStepInFlight")
                                                  : std::string("TwoStepsInFlight");
                         });

// A client that is not the scheduler, on the worker's port.
class Rogue {
 public:
  explicit Rogue(int port, std::string id = "")
      : stub_(wv1::Worker::NewStub(grpc::CreateChannel("127.0.0.1:" + std::to_string(port),
                                                       grpc::InsecureChannelCredentials()))),
        id_(std::move(id)) {}

  template <typename Call>
  grpc::Status Do(Call call) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + 5s);
    if (!id_.empty()) context.AddMetadata(kSchedulerIdMetadataKey, id_);
    return call(stub_.get(), &context);
  }

 private:
  std::unique_ptr<wv1::Worker::Stub> stub_;
  std::string id_;
};

TEST(ChaosTest, RogueClientOnTheWorkerPortChangesNothing) {
  const std::vector<std::vector<int>> twin = TwinRun(1);
  const int port = FreePort();
  Subprocess worker = StartWorker(port);
  Scheduler scheduler({port}, {});
  ASSERT_TRUE(scheduler.WaitServing());
  const auto requests = EightRequests();
  Streams streams(requests.size());
  std::vector<std::thread> threads = StartStreams(scheduler, requests, streams);
  EXPECT_TRUE(WaitProgress(streams, 20));

  for (const std::string& id : {std::string(), std::string("not-the-scheduler")}) {
    Rogue rogue(port, id);
    wv1::InitRequest init;
    init.set_model_path(TestModelDir("llama3_gqa"));
    init.set_block_size(4);
    wv1::InitResponse init_response;
    grpc::Status s = rogue.Do([&](wv1::Worker::Stub* stub, grpc::ClientContext* c) {
      return stub->Init(c, init, &init_response);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "Init: " << s.error_message();
    EXPECT_THAT(s.error_message(), ::testing::Not(HasSubstr("llama3_gqa")));

    // A step that would overwrite every block: foreign blocks, and a reset.
    wv1::StepRequest step;
    step.set_reset(true);
    wv1::NewSequence* seq = step.add_new_sequences();
    seq->set_seq_id(1);
    for (int t = 0; t < 64; ++t) seq->add_token_ids(7);
    seq->set_num_tokens(64);
    for (int b = 0; b < 16; ++b) seq->add_block_ids(b);
    wv1::StepResponse step_response;
    s = rogue.Do([&](wv1::Worker::Stub* stub, grpc::ClientContext* c) {
      return stub->Step(c, step, &step_response);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << "Step: " << s.error_message();

    wv1::CreateCollectiveIdResponse collective;
    s = rogue.Do([&](wv1::Worker::Stub* stub, grpc::ClientContext* c) {
      return stub->CreateCollectiveId(c, wv1::CreateCollectiveIdRequest(), &collective);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);

    wv1::ShutdownResponse shutdown;
    s = rogue.Do([&](wv1::Worker::Stub* stub, grpc::ClientContext* c) {
      return stub->Shutdown(c, wv1::ShutdownRequest(), &shutdown);
    });
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  }
  Join(threads);
  ExpectSameAsTwin(streams, twin);
  EXPECT_EQ(scheduler.Metric("conveyor_worker_failures_total"), 0);
  EXPECT_EQ(scheduler.Health(), HealthStatus::SERVING);
}

TEST(ChaosTest, SecondSchedulerCannotTakeAWorkerInUse) {
  const int port = FreePort();
  Subprocess worker = StartWorker(port);
  Scheduler first({port}, {});
  ASSERT_TRUE(first.WaitServing());
  // Same flags, another identity: it must wait (NOT_SERVING), never share the KV cache.
  Scheduler second({port}, {});
  std::this_thread::sleep_for(1500ms);
  EXPECT_EQ(second.Health(), HealthStatus::NOT_SERVING);
  EXPECT_EQ(first.Health(), HealthStatus::SERVING);
}

TEST(ChaosTest, RankWhoseGroupNeverFormsTimesOutOnItsOwn) {
  const int port = FreePort();
  Subprocess worker = StartWorker(port, {"--rendezvous_timeout_s=1"});
  Rogue scheduler(port, "a-scheduler");
  wv1::InitRequest init;
  init.set_model_path(TestModelDir("llama3_gqa"));
  init.set_tp_rank(1);
  init.set_tp_world_size(2);
  init.set_collective_id("gloo:127.0.0.1:" + std::to_string(FreePort()));  // Nobody there.
  wv1::InitResponse response;
  const auto start = Clock::now();
  grpc::Status s = scheduler.Do([&](wv1::Worker::Stub* stub, grpc::ClientContext* c) {
    c->set_deadline(std::chrono::system_clock::now() + 60s);
    return stub->Init(c, init, &response);
  });
  EXPECT_FALSE(s.ok());
  EXPECT_LT(Clock::now() - start, 20s) << s.error_message();
}

}  // namespace
}  // namespace conveyor::testing
