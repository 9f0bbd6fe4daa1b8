// A conveyor-worker and a conveyor-scheduler serving the tiny test model, as real
// processes on loopback, with a client for the tests that drive them.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "testing/subprocess.h"

namespace conveyor::testing {

// What one Generate call returned.
struct Stream {
  std::vector<int> tokens;
  std::string text;
  v1::GenerateResponse last;
  grpc::Status status;
  std::vector<v1::GenerateResponse> messages;  // Every message, in order.
};

class Server {
 public:
  // Starts a worker (unless `start_worker` is false: the scheduler then waits for a
  // worker that never comes) and a scheduler with `flags`. Fails the test if they do not
  // come up.
  explicit Server(std::vector<std::string> flags, bool start_worker = true);

  // Waits until the workers are initialised (GetModelInfo stops being UNAVAILABLE).
  bool WaitReady();

  // GetModelInfo's answer, or nullopt while it fails (the workers are not ready).
  std::optional<v1::ModelInfoResponse> ModelInfo();

  // Streams one generation; `cancel_when` is asked after each message.
  Stream Generate(const v1::GenerateRequest& request,
                  std::chrono::milliseconds timeout = std::chrono::seconds(120),
                  const std::function<bool(const Stream&)>& cancel_when = {});

  // The value of the first sample of metric `name`, or -1.
  double Metric(const std::string& name);
  // Metric(name) once it equals `expected`, or its last value after `timeout`. For gauges
  // the engine publishes once per loop iteration: a stream's last message can arrive
  // just before the iteration that retires the request and updates them.
  double MetricSettled(const std::string& name, double expected,
                       std::chrono::milliseconds timeout = std::chrono::seconds(5));
  // The sum over every labelled sample of metric `name` (0 if none).
  double MetricSum(const std::string& name);
  // The whole metrics page, or nullopt.
  std::optional<std::string> MetricsPage();

  std::shared_ptr<grpc::Channel> channel() const { return channel_; }
  // host:port the scheduler expects its worker at.
  const std::string& worker_address() const { return worker_address_; }
  Subprocess& worker() { return *worker_; }
  Subprocess& scheduler() { return *scheduler_; }

 private:
  std::optional<Subprocess> worker_;
  std::optional<Subprocess> scheduler_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Conveyor::Stub> stub_;
  int metrics_port_ = 0;
  std::string worker_address_;
};

// A greedy request over token ids that ignores EOS.
v1::GenerateRequest Greedy(std::vector<int32_t> prompt, int max_new);

// `n` greedy requests with seeded random prompts (1-40 tokens) and outputs (1-24).
std::vector<v1::GenerateRequest> MixedRequests(int n, uint32_t seed);

// Runs every request at once, one client thread each.
std::vector<Stream> RunConcurrently(Server& server,
                                    const std::vector<v1::GenerateRequest>& requests);

}  // namespace conveyor::testing
