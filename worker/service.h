// The worker's gRPC service (proto/worker.proto): owns the backend, the communicator to
// the other tensor-parallel ranks, the model shard, the KV cache and the step runner of
// this rank, created by Init on the device the process was started with. Rank 0 also
// creates the group's collective id. A step that fails on the device unloads the model
// (device errors are sticky), so Health says so and the next Init builds it anew.
//
// One scheduler per worker: an Init that succeeds binds the worker to the identity its
// caller presents (kSchedulerIdMetadataKey); calls from anyone else are
// PERMISSION_DENIED and change nothing, until the bound scheduler has been silent for the
// binding lease (it renews it with every call, Health included). A failed Init binds
// nothing, nor does CreateCollectiveId (rank 0 answers it before its group's Init), so
// no caller holds a free worker without loading it. This keeps stray and second
// schedulers out; authenticating peers is TLS's job (docs/security.md): without it,
// whoever reaches a free worker's port first can bind it.
//
// The methods take their requests as bytes (grpc::ByteBuffer) and decide from the call's
// metadata and the binding alone, before parsing anything, whether to answer at once: a
// refused caller's request (up to --max_receive_bytes, which gRPC still receives) costs
// no parse (but for an Init of at most 64 KiB, read to say whether waiting could help).
// A request that does not parse is INVALID_ARGUMENT naming its message type.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "grpcpp/impl/service_type.h"
#include "grpcpp/server_context.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/sync_stream.h"

#include "model/device.h"
#include "model/rank.h"
#include "rpc/scheduler_id_metadata.h"
#include "worker.pb.h"
#include "worker/metrics.h"
#include "worker/step_runner.h"

namespace conveyor::worker {

class WorkerService final : public grpc::Service {
 public:
  struct Options {
    WorkerMetrics* metrics = nullptr;  // Optional; must outlive the service.
    // Longest an Init waits for the other ranks of its group (rank 0 that never joins).
    std::chrono::milliseconds rendezvous_timeout{60'000};
    // The worker serves the scheduler whose Init bound it, and becomes free for another
    // once that one has made no call for this long.
    std::chrono::milliseconds binding_lease{30'000};
  };

  // Computes on `device` (model/cpu/cpu_device.h, model/cuda/cuda_device.h). Registers the
  // six methods of proto/worker.proto with gRPC (ServerBuilder::RegisterService).
  WorkerService(std::unique_ptr<model::Device> device, const Options& options);
  ~WorkerService() override;
  WorkerService(const WorkerService&) = delete;
  WorkerService& operator=(const WorkerService&) = delete;

  // The calls once parsed: what the gRPC methods run after their caller was admitted, and
  // what an in-process caller (the fuzzer) may call directly. Each checks its caller
  // again, the same way.
  grpc::Status Init(grpc::ServerContext* context, const v1::InitRequest* request,
                    v1::InitResponse* response);
  grpc::Status Step(grpc::ServerContext* context, const v1::StepRequest* request,
                    v1::StepResponse* response);
  // Worker.StepStream: each StepRequest read runs as Step runs it and is answered in
  // order; ends when the caller closes or cancels the stream.
  grpc::Status StepStream(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::StepStreamResponse, grpc::ByteBuffer>* stream);
  grpc::Status Health(grpc::ServerContext* context, const v1::HealthRequest* request,
                      v1::HealthResponse* response);
  grpc::Status Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest* request,
                        v1::ShutdownResponse* response);
  grpc::Status CreateCollectiveId(grpc::ServerContext* context,
                                  const v1::CreateCollectiveIdRequest* request,
                                  v1::CreateCollectiveIdResponse* response);

  // Makes WaitForShutdownRequest return (a signal; the Shutdown call does this for the
  // bound scheduler) and ends the open step streams: call it before the gRPC server's
  // Shutdown, which waits for every call (a scheduler's stream) to end.
  void RequestShutdown();
  // Blocks until a Shutdown call (or RequestShutdown) arrived.
  void WaitForShutdownRequest();
  bool initialized() const;

 private:
  // Who may make a call: decided from its metadata and the binding alone, so before its
  // request is parsed (CheckCallerLocked).
  enum class Callers {
    kAnyone,  // Health: it changes nothing.
    // Init, CreateCollectiveId: the bound scheduler, or any identified caller while the
    // worker is free (nobody bound it, or the bound scheduler's lease lapsed).
    kClaimants,
    // Step: the bound scheduler; on a worker nobody bound (so nobody initialised), any
    // identified caller is told FAILED_PRECONDITION, not initialised.
    kBoundOrNotInitialised,
    kBound,  // Shutdown: the bound scheduler only.
  };
  // A typed call (Init, Step, ...) that a raw gRPC method runs once its request parsed.
  template <class Request, class Response>
  using TypedCall = grpc::Status (WorkerService::*)(grpc::ServerContext*, const Request*,
                                                    Response*);

  // Registers `path` ("/conveyor.worker.v1.Worker/Step") with gRPC as a method whose
  // request arrives as bytes: HandleRaw admits `callers`, parses, runs `call`.
  template <class Request, class Response>
  void AddRawMethod(const char* path, Callers callers, TypedCall<Request, Response> call);
  // The one adapter of the five unary methods: refuses (or answers) from the metadata alone,
  // then parses `raw` (INVALID_ARGUMENT if it is no Request), runs `call` and serialises
  // its answer into `response`.
  template <class Request, class Response>
  grpc::Status HandleRaw(Callers callers, TypedCall<Request, Response> call,
                         grpc::ServerContext* context, const grpc::ByteBuffer& raw,
                         grpc::ByteBuffer* response);

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

  // OK if the caller `id` (empty: none) may make a call of `callers` now; otherwise
  // PERMISSION_DENIED saying when the worker could become free (or, for a Step to a
  // worker nobody initialised, FAILED_PRECONDITION). Changes nothing. Needs binding_mu_.
  absl::Status CheckCallerLocked(std::string_view id, Callers callers,
                                 std::chrono::steady_clock::time_point now) const;
  // CheckCallerLocked for a call before its request is parsed (takes binding_mu_ only, so
  // it never waits for a step or an Init).
  absl::Status AdmitCaller(const grpc::ServerContext& context, Callers callers) const;
  // The refusal of an Init whose request is `raw`, completed when the request is small
  // enough to read: an Init for another model or layout than the one loaded would fail
  // even once the worker is free.
  absl::Status ExplainInitRefusal(absl::Status refusal, const grpc::ByteBuffer& raw) const;
  // The check of the typed calls (held with mu_): CheckCallerLocked, and on success from
  // the bound scheduler, renews its binding.
  absl::Status AuthorizeLocked(const grpc::ServerContext& context, Callers callers);
  // Binds the worker to `id`, whose Init `request` just succeeded.
  void Bind(std::string_view id, const v1::InitRequest& request);

  const std::unique_ptr<model::Device> device_;
  const Options options_;
  mutable std::mutex mu_;  // Serialises Init and Step; guards the members up to binding_mu_.
  std::unique_ptr<model::Rank> rank_;  // The loaded model: runner_ runs on it.
  std::unique_ptr<StepRunner> runner_;
  // The Init that built runner_ and its answer: a scheduler that restarts sends the same
  // Init again and gets the same answer with every sequence dropped.
  v1::InitRequest init_request_;
  v1::InitResponse init_response_;
  // Rank 0 before its tensor-parallel Init: the id it created (the device keeps what
  // the rendezvous needs). Both go once Init has tried to connect.
  std::string created_collective_id_;
  // Why the last model was unloaded (a device error), for the next Step's answer.
  absl::Status unload_reason_;
  bool shutdown_requested_ = false;
  std::condition_variable shutdown_cv_;
  std::condition_variable step_done_;  // A step was handled (or the model unloaded).

  // Taken alone: the open step streams, cancelled by RequestShutdown.
  std::mutex streams_mu_;
  std::set<grpc::ServerContext*> step_streams_;  // Guarded by streams_mu_.
  bool streams_closed_ = false;                  // Guarded by streams_mu_.

  // Taken alone, or inside mu_ (never the other way round): a caller is checked before
  // its request is parsed without waiting for a step or an Init. Guards what follows.
  mutable std::mutex binding_mu_;
  // The scheduler this worker serves (empty: none yet; once bound, never empty again)
  // and when it last called.
  std::string bound_scheduler_;
  std::chrono::steady_clock::time_point last_contact_;
  // The Init the loaded model was built with (as init_request_), for refusals.
  std::optional<v1::InitRequest> loaded_init_;
};

}  // namespace conveyor::worker
