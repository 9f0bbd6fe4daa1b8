// The worker ranks of one model replica, over gRPC: initialises them together (and again
// after a failure), sends every step to all of them on one step stream per rank
// (scheduler/worker_step_stream.h), and checks while idle that they are still up and
// initialised. Every call carries the scheduler's identity
// (rpc/scheduler_id_metadata.h), which binds the workers to this scheduler.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "grpcpp/security/credentials.h"
#include "scheduler/step_executor.h"
#include "scheduler/worker_step_stream.h"
#include "text/token_bytes.h"
#include "worker.grpc.pb.h"

namespace conveyor::scheduler {

class WorkerGroup final : public StepExecutor {
 public:
  struct Options {
    std::vector<std::string> addresses;  // host:port of rank 0, 1, …
    // Presented to the workers on every call. A scheduler that restarts with the same
    // id takes its workers back at once; with another, once their binding lease lapses.
    std::string scheduler_id;
    std::string model_path;
    std::string draft_model_path;  // Speculative decoding's draft model; empty: none.
    int block_size = 16;
    uint64_t kv_cache_bytes = 0;  // Per rank; 0 lets each worker choose.
    int max_step_tokens = 0;
    int max_num_seqs = 0;
    // Each token's bytes and the control tokens, for structured output's grammars
    // (InitRequest.token_bytes); shared, as every rank gets the same (MiBs for a large
    // vocabulary). Null: the workers refuse constrained sequences.
    std::shared_ptr<const conveyor::TokenByteTable> token_bytes;
    std::chrono::milliseconds step_timeout{60'000};
    // How the channels to the ranks are secured; null: plaintext. With TLS, each rank's
    // certificate must name its host in `addresses`, or `tls_server_name` when set.
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    std::string tls_server_name;
  };

  // What the ranks agreed on at Init.
  struct Info {
    worker::v1::ModelInfo model;
    int num_kv_blocks = 0;  // The minimum over ranks.
    int block_size = 0;
    std::string backend;
    // Every rank runs steps in previous_step_id order, so two may be in flight.
    bool orders_steps = false;
    // Some rank computes on its host's CPU cores (InitResponse.computes_on_host_cores).
    bool computes_on_host_cores = false;
  };

  explicit WorkerGroup(Options options);
  ~WorkerGroup() override;
  WorkerGroup(const WorkerGroup&) = delete;
  WorkerGroup& operator=(const WorkerGroup&) = delete;

  // Calls Init on every rank in parallel, waiting for ranks that are still starting
  // until `deadline`; with several ranks, first asks rank 0 for the collective id that
  // every Init carries. An Init that a worker rejects (bad model path, …) is returned.
  absl::StatusOr<Info> Initialize(std::chrono::system_clock::time_point deadline);
  // Makes a running or later Initialize return CANCELLED promptly (from any thread; a
  // SIGTERM while the workers are still starting).
  void CancelInitialize();

  absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& request) override;
  std::unique_ptr<StepCall> StartStep(const worker::v1::StepRequest& request) override;
  absl::StatusOr<RecoveredWorkers> Recover(std::chrono::system_clock::time_point deadline) override;
  absl::Status CheckAlive(std::chrono::milliseconds timeout) override;
  bool can_recover() const override { return true; }
  void CancelRecovery() override { CancelInitialize(); }

  // Asks every rank to exit (best effort).
  void ShutdownWorkers();

  int world_size() const { return static_cast<int>(stubs_.size()); }

 private:
  class PendingStep;

  // Every rank's answer to step `step_id`: rank 0's response, or the first rank's error.
  // Reads every rank's answer, so that the streams stay in step.
  absl::StatusOr<worker::v1::StepResponse> ReceiveStep(uint64_t step_id);
  // Ends the step streams whose oldest step is overdue, until the group goes.
  void WatchStepTimeouts();

  template <typename Call>
  grpc::Status CallUntil(std::chrono::system_clock::time_point deadline, bool retry, Call call);

  Options options_;
  std::vector<std::unique_ptr<worker::v1::Worker::Stub>> stubs_;
  const worker::v1::HealthRequest health_request_;
  std::atomic<bool> init_cancelled_{false};
  std::mutex init_mu_;
  std::set<grpc::ClientContext*> init_calls_;  // Guarded by init_mu_.

  std::vector<std::unique_ptr<WorkerStepStream>> step_streams_;  // One per rank.
  std::mutex watchdog_mu_;
  std::condition_variable watchdog_cv_;
  bool stopping_ = false;  // Guarded by watchdog_mu_.
  std::thread watchdog_;   // Runs WatchStepTimeouts.
};

}  // namespace conveyor::scheduler
