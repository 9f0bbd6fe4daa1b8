#include "scheduler/api_service.h"

#include <deque>
#include <memory>
#include <mutex>

#include "common/grpc_status.h"
#include "common/utf8.h"

namespace conveyor::scheduler {
namespace {

// One Generate stream. The engine's thread pushes messages into the sink; the reactor
// writes them one at a time (gRPC allows one outstanding write) and finishes the call
// after the last one. The reactor lives until gRPC calls OnDone, which can only happen
// after Finish, and Finish is only called with no write in flight.
class GenerateStream final : public grpc::ServerWriteReactor<v1::GenerateResponse>,
                             public ResponseSink {
 public:
  explicit GenerateStream(Engine* engine) : engine_(engine) {}

  void Send(v1::GenerateResponse message) override {
    const v1::GenerateResponse* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (client_gone_) return;
      queue_.push_back(std::move(message));
      if (writing_) return;
      writing_ = true;
      next = &queue_.front();
    }
    StartWrite(next);
  }

  void Finish(const absl::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      final_status_ = ToGrpcStatus(status);
      finished_ = true;
      if (writing_) return;  // OnWriteDone finishes after the last write.
    }
    ServerWriteReactor::Finish(final_status_);
  }

  void OnWriteDone(bool ok) override {
    const v1::GenerateResponse* next = nullptr;
    bool finish = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.pop_front();
      if (!ok) {
        // The client went away; OnCancel tells the engine, which then calls Finish.
        client_gone_ = true;
        queue_.clear();
      }
      if (!queue_.empty()) {
        next = &queue_.front();
      } else {
        writing_ = false;
        finish = finished_;
      }
    }
    if (next != nullptr) {
      StartWrite(next);
    } else if (finish) {
      ServerWriteReactor::Finish(final_status_);
    }
  }

  void OnCancel() override {
    const uint64_t id = id_.load();
    if (id != 0) engine_->Cancel(id);
  }

  // The engine and gRPC both hold the stream: gRPC's reference ends here.
  void OnDone() override { self_.reset(); }

  void set_id(uint64_t id) { id_.store(id); }
  void set_self(std::shared_ptr<GenerateStream> self) { self_ = std::move(self); }

 private:
  Engine* engine_;
  std::atomic<uint64_t> id_{0};
  std::shared_ptr<GenerateStream> self_;  // Keeps the stream alive until OnDone.
  std::mutex mu_;
  std::deque<v1::GenerateResponse> queue_;  // Front is being written while writing_.
  bool writing_ = false;
  bool finished_ = false;
  bool client_gone_ = false;
  grpc::Status final_status_;
};

// A stream that ends before reaching the engine.
class RejectedStream final : public grpc::ServerWriteReactor<v1::GenerateResponse> {
 public:
  explicit RejectedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

ApiService::ApiService(const Tokenizer* tokenizer, v1::ModelInfoResponse info,
                       SchedulerMetrics* metrics)
    : tokenizer_(tokenizer), metrics_(metrics), info_(std::move(info)) {}

void ApiService::SetEngine(Engine* engine, const ServingLimits& limits,
                           v1::ModelInfoResponse info) {
  limits_ = limits;
  info_ = std::move(info);
  engine_.store(engine);
}

grpc::ServerWriteReactor<v1::GenerateResponse>* ApiService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  Engine* engine = engine_.load();
  auto reject = [&](const absl::Status& status) {
    if (metrics_ != nullptr) metrics_->CountRejected(status.code());
    return new RejectedStream(ToGrpcStatus(status));
  };
  if (engine == nullptr) {
    return reject(absl::UnavailableError("no model worker is ready yet; retry shortly"));
  }
  absl::StatusOr<std::unique_ptr<Request>> built = BuildRequest(*request, limits_, *tokenizer_);
  if (!built.ok()) return reject(built.status());
  std::unique_ptr<Request> r = std::move(*built);
  const auto deadline = context->deadline();
  if (deadline != std::chrono::system_clock::time_point::max()) {
    r->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     deadline - std::chrono::system_clock::now());
  }
  auto stream = std::make_shared<GenerateStream>(engine);
  stream->set_self(stream);
  r->sink = stream;
  absl::StatusOr<uint64_t> id = engine->Submit(std::move(r));
  if (!id.ok()) {
    if (metrics_ != nullptr) metrics_->CountRejected(id.status().code());
    stream->Finish(id.status());
  } else {
    stream->set_id(*id);
  }
  return stream.get();
}

grpc::ServerUnaryReactor* ApiService::Tokenize(grpc::CallbackServerContext* context,
                                               const v1::TokenizeRequest* request,
                                               v1::TokenizeResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (engine_.load() == nullptr) {  // limits_ (the BOS id) is not known before.
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no model worker is ready yet"));
    return reactor;
  }
  absl::StatusOr<std::vector<int>> ids = tokenizer_->Encode(request->text());
  if (!ids.ok()) {
    reactor->Finish(ToGrpcStatus(ids.status()));
    return reactor;
  }
  const bool add_bos = !request->has_add_bos() || request->add_bos();
  if (add_bos && limits_.bos_token_id >= 0) {
    response->add_token_ids(limits_.bos_token_id);
    response->add_pieces(ValidUtf8(tokenizer_->Piece(limits_.bos_token_id)));
  }
  for (int id : *ids) {
    response->add_token_ids(id);
    response->add_pieces(ValidUtf8(tokenizer_->Piece(id)));
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* ApiService::GetModelInfo(grpc::CallbackServerContext* context,
                                                   const v1::ModelInfoRequest*,
                                                   v1::ModelInfoResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (engine_.load() == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no model worker is ready yet"));
    return reactor;
  }
  *response = info_;
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace conveyor::scheduler
