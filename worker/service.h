// The worker's gRPC service (proto/worker.proto): owns the backend, the communicator to
// the other tensor-parallel ranks, the model shard, the KV cache and the step engine of
// this rank, created by Init on the device the process was started with. Rank 0 also
// creates the group's collective id. A step that fails on the device unloads the model
// (device errors are sticky), so Health says so and the next Init builds it anew.
//
// One scheduler per worker: the first Init (or CreateCollectiveId) binds the worker to
// the identity its caller presents (kSchedulerIdMetadataKey); calls from anyone else are
// PERMISSION_DENIED and change nothing, until the bound scheduler has been silent for the
// binding lease (it renews it with every call, Health included). This keeps stray and
// second schedulers out; authenticating peers is TLS's job (docs/failure-handling.md).
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

#include "common/step_protocol.h"
#include "kernels/backend.h"
#include "model/communicator.h"
#include "model/device.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "worker.grpc.pb.h"
#include "worker/engine.h"
#include "worker/metrics.h"

namespace conveyor::worker {

class WorkerService final : public v1::Worker::Service {
 public:
  struct Options {
    WorkerMetrics* metrics = nullptr;  // Optional; must outlive the service.
    // Longest an Init waits for the other ranks of its group (rank 0 that never joins).
    std::chrono::milliseconds rendezvous_timeout{60'000};
    // The worker serves the scheduler whose Init (or CreateCollectiveId) bound it, and
    // becomes free for another once that one has made no call for this long.
    std::chrono::milliseconds binding_lease{30'000};
  };

  // Computes on `device` (worker/cpu_device.h, model/cuda/cuda_device.h).
  WorkerService(std::unique_ptr<model::Device> device, const Options& options);
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

  // Makes WaitForShutdownRequest return (a signal; the Shutdown call does this for the
  // bound scheduler).
  void RequestShutdown();
  // Blocks until a Shutdown call (or RequestShutdown) arrived.
  void WaitForShutdownRequest();
  bool initialized() const;

 private:
  // Ranks wait for each other in Init until `deadline`.
  absl::Status InitLocked(const v1::InitRequest& request,
                          std::chrono::system_clock::time_point deadline,
                          v1::InitResponse* response);
  absl::StatusOr<std::string> CreateCollectiveIdLocked();
  // Frees the model and everything built with it (after a device error).
  void UnloadLocked();
  // FAILED_PRECONDITION, saying why, if no model is loaded.
  absl::Status CheckInitializedLocked() const;
  // Waits (releasing `lock`) until the step `request` was built on has been handled, the
  // call is cancelled or its deadline passes.
  absl::Status AwaitPreviousStepLocked(std::unique_lock<std::mutex>& lock,
                                       const grpc::ServerContext& context,
                                       const v1::StepRequest& request);
  // OK if the call comes from the scheduler this worker serves (renewing the binding);
  // with `claim`, binds a free worker to the caller; with `allow_unbound`, lets any
  // identified caller through to a worker nobody bound yet. PERMISSION_DENIED otherwise.
  absl::Status AuthorizeLocked(const grpc::ServerContext& context, bool claim,
                               bool allow_unbound = false);

  const std::unique_ptr<model::Device> device_;
  const Options options_;
  mutable std::mutex mu_;  // Serialises Init and Step; guards everything below.
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::Communicator> comm_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<StepEngine> engine_;
  // The Init that built engine_ and its answer: a scheduler that restarts sends the same
  // Init again and gets the same answer with every sequence dropped.
  v1::InitRequest init_request_;
  v1::InitResponse init_response_;
  // Rank 0 before its tensor-parallel Init: the id it created (the device keeps what
  // the rendezvous needs). Both go once Init has tried to connect.
  std::string created_collective_id_;
  // Why the last model was unloaded (a device error), for the next Step's answer.
  absl::Status unload_reason_;
  // The scheduler this worker serves (empty: none yet) and when it last called.
  std::string bound_scheduler_;
  std::chrono::steady_clock::time_point last_contact_;
  bool shutdown_requested_ = false;
  std::condition_variable shutdown_cv_;
  std::condition_variable step_done_;  // A step was handled (or the model unloaded).
};

}  // namespace conveyor::worker
