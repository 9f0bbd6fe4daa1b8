// The worker's gRPC service (proto/worker.proto): owns the backend, the model shard, the
// KV cache and the step engine of this rank, created by Init.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

#include "kernels/backend.h"
#include "worker.grpc.pb.h"
#include "worker/engine.h"
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

  // Blocks until a Shutdown call arrived.
  void WaitForShutdownRequest();
  bool initialized() const;

 private:
  absl::Status InitLocked(const v1::InitRequest& request, v1::InitResponse* response);
  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend() const;
  // KV-cache bytes to allocate when the request leaves the budget to the worker.
  absl::StatusOr<uint64_t> DefaultKvBudget() const;

  const Options options_;
  mutable std::mutex mu_;  // Serialises Init and Step; guards everything below.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<StepEngine> engine_;
  // The Init that built engine_ and its answer: a scheduler that restarts sends the same
  // Init again and gets the same answer with every sequence dropped.
  v1::InitRequest init_request_;
  v1::InitResponse init_response_;
  bool shutdown_requested_ = false;
  std::condition_variable shutdown_cv_;
};

}  // namespace conveyor::worker
