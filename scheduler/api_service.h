// The client-facing gRPC service (proto/conveyor.proto) on the callback API: each
// Generate call becomes a Request handed to the Engine, and the Engine's messages are
// written back as the client can take them. No thread is held per stream.
//
// The methods take their messages raw (grpc::ByteBuffer) and parse them here, so that a
// malformed message or a string field that is not UTF-8 is INVALID_ARGUMENT with a
// message (and counted as rejected), not gRPC's bare UNIMPLEMENTED. Tokenizing, whose
// cost grows with the prompt, runs on a few preparation threads of the service's own,
// never on gRPC's callback threads or the engine's.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "conveyor.grpc.pb.h"
#include "scheduler/engine.h"
#include "scheduler/metrics.h"
#include "scheduler/request_builder.h"
#include "scheduler/token_auth.h"
#include "text/tokenizer.h"

namespace conveyor::scheduler {

class ApiService final
    : public v1::Conveyor::WithRawCallbackMethod_Generate<
          v1::Conveyor::WithRawCallbackMethod_Tokenize<
              v1::Conveyor::WithRawCallbackMethod_GetModelInfo<v1::Conveyor::CallbackService>>> {
 public:
  // All pointers must outlive the service; `metrics` may be null. The engine may be set
  // later (SetEngine): until then Generate answers UNAVAILABLE. Prompts are tokenized on
  // `prepare_threads` threads.
  ApiService(const Tokenizer* tokenizer, v1::ModelInfoResponse info, SchedulerMetrics* metrics,
             int prepare_threads = 2);
  ~ApiService() override;

  // Runs what the preparation threads still hold (each job ends its call) and stops
  // them. Call after the server has shut down and before the engine goes.
  void StopPreparing();

  // Waits until every Generate stream has written its final status (the engine has ended
  // each one) or `timeout` passes; false on the timeout.
  bool WaitForStreamsToEnd(std::chrono::milliseconds timeout);

  // Requires a bearer token on every call (UNAUTHENTICATED without a valid one) and holds
  // one of the token's concurrent-call slots per Generate. Call before serving;
  // `authenticator` must outlive the service.
  void SetAuthenticator(TokenAuthenticator* authenticator);

  // Makes the service ready to generate with `engine` under `limits`.
  void SetEngine(Engine* engine, const ServingLimits& limits, v1::ModelInfoResponse info);

  grpc::ServerWriteReactor<grpc::ByteBuffer>* Generate(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request) override;
  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetModelInfo(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;

 private:
  // Runs `job` on a preparation thread.
  void Prepare(std::function<void()> job);
  void PrepareLoop();
  void CountRejected(absl::StatusCode code);
  // OK when no authenticator is set or the call carries a valid token.
  absl::Status Authenticate(const grpc::CallbackServerContext& context);

  const Tokenizer* tokenizer_;
  SchedulerMetrics* metrics_;
  TokenAuthenticator* authenticator_ = nullptr;  // Set before serving; null: no tokens.
  std::atomic<Engine*> engine_{nullptr};
  std::atomic<int> open_streams_{0};  // Generate streams gRPC has not called OnDone for.
  // Written once by SetEngine before engine_ is published.
  ServingLimits limits_;
  v1::ModelInfoResponse info_;

  std::mutex jobs_mu_;
  std::condition_variable jobs_cv_;
  std::deque<std::function<void()>> jobs_;  // Guarded by jobs_mu_.
  bool stopping_ = false;                   // Guarded by jobs_mu_.
  std::vector<std::thread> threads_;
};

}  // namespace conveyor::scheduler
