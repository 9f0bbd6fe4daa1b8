// The client-facing gRPC service (proto/conveyor.proto) on the callback API: each
// Generate call becomes a Request handed to the Engine, and the Engine's messages are
// written back as the client can take them. No thread is held per stream.
#pragma once

#include <atomic>
#include <string>

#include "common/tokenizer.h"
#include "conveyor.grpc.pb.h"
#include "scheduler/engine.h"
#include "scheduler/metrics.h"
#include "scheduler/request_builder.h"

namespace conveyor::scheduler {

class ApiService final : public v1::Conveyor::CallbackService {
 public:
  // All pointers must outlive the service; `metrics` may be null. The engine may be set
  // later (SetEngine): until then Generate answers UNAVAILABLE.
  ApiService(const Tokenizer* tokenizer, v1::ModelInfoResponse info, SchedulerMetrics* metrics);

  // Makes the service ready to generate with `engine` under `limits`.
  void SetEngine(Engine* engine, const ServingLimits& limits, v1::ModelInfoResponse info);

  grpc::ServerWriteReactor<v1::GenerateResponse>* Generate(
      grpc::CallbackServerContext* context, const v1::GenerateRequest* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const v1::TokenizeRequest* request,
                                     v1::TokenizeResponse* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const v1::ModelInfoRequest* request,
                                         v1::ModelInfoResponse* response) override;

 private:
  const Tokenizer* tokenizer_;
  SchedulerMetrics* metrics_;
  std::atomic<Engine*> engine_{nullptr};
  // Written once by SetEngine before engine_ is published.
  ServingLimits limits_;
  v1::ModelInfoResponse info_;
};

}  // namespace conveyor::scheduler
