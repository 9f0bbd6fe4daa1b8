// The worker's gRPC service (proto/worker.proto): owns the backend, the communicator to
// the other tensor-parallel ranks, the model shard, the KV cache and the step engine of
// this rank, created by Init. Rank 0 also creates the group's collective id.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

#include "kernels/backend.h"
#include "worker.grpc.pb.h"
#include "worker/communicator.h"
#include "worker/engine.h"
#include "worker/gloo_communicator.h"
#include "worker/kv_cache.h"
#include "worker/metrics.h"
#include "worker/model.h"

namespace conveyor::worker {

class WorkerService final : public v1::Worker::Service {
 public:
  struct Options {
    std::string backend = "cpu";  // "cpu" or "cuda".
    int num_threads = 0;          // CPU backend threads; 0: one per core.
    int device = 0;               // CUDA device.
    // Without an explicit kv_cache_bytes, the CUDA backend gives the KV cache this share
    // of the device memory left after the weights.
    double gpu_memory_fraction = 0.85;
    // cuda: sample on the device (only token ids leave it) rather than copying every
    // sampled row's logits to the host.
    bool device_sampling = true;
    // cuda: run decode steps of up to max_step_sequences sequences as CUDA graphs.
    bool cuda_graphs = false;
    // Address the other ranks reach this one at for collectives (cpu: the rendezvous
    // store and Gloo's TCP pairs).
    std::string collective_host = "127.0.0.1";
    WorkerMetrics* metrics = nullptr;  // Optional; must outlive the service.
  };
  explicit WorkerService(const Options& options);
  ~WorkerService() override;

  grpc::Status Init(grpc::ServerContext* context, const v1::InitRequest* request,
                    v1::InitResponse* response) override;
  grpc::Status Step(grpc::ServerContext* context, const v1::StepRequest* request,
                    v1::StepResponse* response) override;
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response) override;
  grpc::Status Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest* request,
                        v1::ShutdownResponse* response) override;
  grpc::Status CreateCollectiveId(grpc::ServerContext* context,
                                  const v1::CreateCollectiveIdRequest* request,
                                  v1::CreateCollectiveIdResponse* response) override;

  // Blocks until a Shutdown call arrived.
  void WaitForShutdownRequest();
  bool initialized() const;

 private:
  // Ranks wait for each other in Init until `deadline`.
  absl::Status InitLocked(const v1::InitRequest& request,
                          std::chrono::system_clock::time_point deadline,
                          v1::InitResponse* response);
  absl::StatusOr<std::string> CreateCollectiveIdLocked();
  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend() const;
  // Joins the request's tensor-parallel group (or makes the single-rank communicator).
  absl::StatusOr<std::unique_ptr<Communicator>> Connect(
      const v1::InitRequest& request, kernels::Backend* backend,
      std::chrono::system_clock::time_point deadline) const;
  // KV-cache bytes to allocate when the request leaves the budget to the worker.
  absl::StatusOr<uint64_t> DefaultKvBudget() const;

  const Options options_;
  mutable std::mutex mu_;  // Serialises Init and Step; guards everything below.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<StepEngine> engine_;
  // The Init that built engine_ and its answer: a scheduler that restarts sends the same
  // Init again and gets the same answer with every sequence dropped.
  v1::InitRequest init_request_;
  v1::InitResponse init_response_;
  // Rank 0 before its tensor-parallel Init: the id it created, and for the CPU backend
  // the rendezvous store behind it. Both go once Init has tried to connect.
  std::string created_collective_id_;
  std::unique_ptr<GlooRendezvousServer> gloo_rendezvous_;
  bool shutdown_requested_ = false;
  std::condition_variable shutdown_cv_;
};

}  // namespace conveyor::worker
