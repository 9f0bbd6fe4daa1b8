#include "scheduler/api_service.h"

#include <algorithm>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"
#include "rpc/grpc_status.h"

namespace conveyor::scheduler {
namespace {

// Parses a raw request; false if the bytes are not a valid `Message` (malformed, or a
// string field that is not UTF-8, which proto3 refuses to parse).
template <typename Message>
bool ParseRaw(const grpc::ByteBuffer& raw, Message* message) {
  std::vector<grpc::Slice> slices;
  if (!raw.Dump(&slices).ok()) return false;
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return message->ParseFromString(bytes);
}

grpc::ByteBuffer Serialize(const google::protobuf::Message& message) {
  grpc::Slice slice(message.SerializeAsString());
  return grpc::ByteBuffer(&slice, 1);
}

// The call's "authorization" metadata ("" when it has none).
std::string_view Authorization(const grpc::CallbackServerContext& context) {
  const auto& metadata = context.client_metadata();
  auto it = metadata.find("authorization");
  if (it == metadata.end()) return {};
  return std::string_view(it->second.data(), it->second.size());
}

absl::Status MalformedError(const char* type) {
  return absl::InvalidArgumentError(
      absl::StrCat("the request is not a valid ", type,
                   " message: it is malformed, or one of its string fields is not valid UTF-8"));
}

// One Generate stream. The engine's delivery thread pushes messages into the sink; the
// reactor writes them one at a time (gRPC allows one outstanding write) and finishes the
// call after the last one. The reactor lives until gRPC calls OnDone, which can only happen
// after Finish, and Finish is only called with no write in flight.
class GenerateStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer>,
                             public ResponseSink {
 public:
  // `open` counts the streams gRPC has not yet called OnDone for.
  GenerateStream(Engine* engine, std::atomic<int>* open) : engine_(engine), open_(open) {
    open_->fetch_add(1);
  }

  void Send(v1::GenerateResponse message) override {
    const grpc::ByteBuffer* next = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (client_gone_) return;
      queue_.push_back(Serialize(message));
      if (writing_) return;
      writing_ = true;
      next = &queue_.front();
    }
    StartWrite(next);
  }

  void Finish(const absl::Status& status) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      grant_.Release();  // The call has ended: its client may start another.
      final_status_ = ToGrpcStatus(status);
      finished_ = true;
      if (writing_) return;  // OnWriteDone finishes after the last write.
    }
    ServerWriteReactor::Finish(final_status_);
  }

  void OnWriteDone(bool ok) override {
    const grpc::ByteBuffer* next = nullptr;
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
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancelled_ = true;
    }
    CancelAll();
  }

  // Cancels the request's choices in the engine (those it accepted).
  void CancelAll() {
    std::vector<uint64_t> ids;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids = ids_;
    }
    for (uint64_t id : ids) engine_->Cancel(id);
  }

  // The engine and gRPC both hold the stream: gRPC's reference ends here.
  void OnDone() override {
    open_->fetch_sub(1);
    self_.reset();
  }

  // The engine accepted the request's choices as `ids`; a cancel that came first
  // applies now.
  void set_ids(std::vector<uint64_t> ids) {
    bool cancelled = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_ = std::move(ids);
      cancelled = cancelled_;
    }
    if (cancelled) CancelAll();
  }
  bool cancelled() {
    std::lock_guard<std::mutex> lock(mu_);
    return cancelled_;
  }
  void set_self(std::shared_ptr<GenerateStream> self) { self_ = std::move(self); }
  void set_grant(TokenAuthenticator::Grant grant) {
    std::lock_guard<std::mutex> lock(mu_);
    grant_ = std::move(grant);
  }

 private:
  Engine* engine_;
  std::atomic<int>* const open_;
  std::shared_ptr<GenerateStream> self_;  // Keeps the stream alive until OnDone.
  std::mutex mu_;
  std::vector<uint64_t> ids_;           // Guarded by mu_; empty until submitted.
  bool cancelled_ = false;              // Guarded by mu_.
  std::deque<grpc::ByteBuffer> queue_;  // Front is being written while writing_.
  bool writing_ = false;
  bool finished_ = false;
  bool client_gone_ = false;
  grpc::Status final_status_;
  TokenAuthenticator::Grant grant_;  // Guarded by mu_; holds the client's slot until Finish.
};

// The n choices of one request into its stream (n > 1): each message names its choice;
// the stream ends once every choice has, with the first error if one failed (the others
// are cancelled then). The engine's delivery thread calls it.
class ChoiceFanIn final : public std::enable_shared_from_this<ChoiceFanIn> {
 public:
  ChoiceFanIn(std::shared_ptr<GenerateStream> stream, int n)
      : stream_(std::move(stream)), open_(n) {}

  std::shared_ptr<ResponseSink> Sink(int index) {
    class Choice final : public ResponseSink {
     public:
      Choice(std::shared_ptr<ChoiceFanIn> fan_in, int index)
          : fan_in_(std::move(fan_in)), index_(index) {}
      void Send(v1::GenerateResponse message) override {
        message.set_index(index_);
        fan_in_->Send(std::move(message));
      }
      void Finish(const absl::Status& status) override { fan_in_->Finish(status); }

     private:
      const std::shared_ptr<ChoiceFanIn> fan_in_;
      const int index_;
    };
    return std::make_shared<Choice>(shared_from_this(), index);
  }

 private:
  void Send(v1::GenerateResponse message) {
    std::lock_guard<std::mutex> lock(mu_);
    if (status_.ok()) stream_->Send(std::move(message));
  }

  void Finish(const absl::Status& status) {
    bool cancel = false;
    bool last = false;
    absl::Status final_status;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!status.ok() && status_.ok()) {
        status_ = status;
        cancel = true;
      }
      last = --open_ == 0;
      final_status = status_;
    }
    if (cancel) stream_->CancelAll();
    if (last) stream_->Finish(final_status);
  }

  const std::shared_ptr<GenerateStream> stream_;
  std::mutex mu_;
  int open_;             // Guarded by mu_: choices not finished yet.
  absl::Status status_;  // Guarded by mu_: the first error.
};

// A stream that ends before reaching the engine.
class RejectedStream final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  explicit RejectedStream(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

ApiService::ApiService(const Tokenizer* tokenizer, v1::ModelInfoResponse info,
                       SchedulerMetrics* metrics, int prepare_threads)
    : tokenizer_(tokenizer), metrics_(metrics), info_(std::move(info)) {
  for (int i = 0; i < std::max(1, prepare_threads); ++i) {
    threads_.emplace_back([this] { PrepareLoop(); });
  }
}

ApiService::~ApiService() { StopPreparing(); }

bool ApiService::WaitForStreamsToEnd(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (open_streams_.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

void ApiService::StopPreparing() {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void ApiService::Prepare(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(jobs_mu_);
    jobs_.push_back(std::move(job));
  }
  jobs_cv_.notify_one();
}

void ApiService::PrepareLoop() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(jobs_mu_);
      jobs_cv_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
      // Jobs left at shutdown still run: each one ends its call.
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

void ApiService::CountRejected(absl::StatusCode code) {
  if (metrics_ != nullptr) metrics_->CountRejected(code);
}

void ApiService::SetAuthenticator(TokenAuthenticator* authenticator) {
  authenticator_ = authenticator;
}

absl::Status ApiService::Authenticate(const grpc::CallbackServerContext& context) {
  if (authenticator_ == nullptr) return absl::OkStatus();
  return authenticator_->Authenticate(Authorization(context)).status();
}

void ApiService::SetEngine(Engine* engine, const ServingLimits& limits,
                           v1::ModelInfoResponse info) {
  limits_ = limits;
  info_ = std::move(info);
  engine_.store(engine);
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* ApiService::Generate(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* raw) {
  Engine* engine = engine_.load();
  auto reject = [&](const absl::Status& status) {
    CountRejected(status.code());
    return new RejectedStream(ToGrpcStatus(status));
  };
  // Credentials first: an unknown caller learns nothing about its request.
  TokenAuthenticator::Grant grant;
  if (authenticator_ != nullptr) {
    absl::StatusOr<TokenAuthenticator::Grant> admitted =
        authenticator_->Admit(Authorization(*context));
    if (!admitted.ok()) return reject(admitted.status());
    grant = std::move(*admitted);
  }
  auto request = std::make_shared<v1::GenerateRequest>();
  if (!ParseRaw(*raw, request.get())) return reject(MalformedError("conveyor.v1.GenerateRequest"));
  if (engine == nullptr) {
    return reject(absl::UnavailableError("no model worker is ready yet; retry shortly"));
  }
  const auto deadline = context->deadline();
  auto stream = std::make_shared<GenerateStream>(engine, &open_streams_);
  stream->set_self(stream);
  stream->set_grant(std::move(grant));
  Prepare([this, engine, stream, request, deadline] {
    if (stream->cancelled()) {
      stream->Finish(absl::CancelledError("the client cancelled the request"));
      return;
    }
    absl::StatusOr<std::vector<std::unique_ptr<Request>>> built =
        BuildChoices(*request, limits_, *tokenizer_);
    if (!built.ok()) {
      CountRejected(built.status().code());
      stream->Finish(built.status());
      return;
    }
    const int n = static_cast<int>(built->size());
    std::shared_ptr<ChoiceFanIn> fan_in =
        n > 1 ? std::make_shared<ChoiceFanIn>(stream, n) : nullptr;
    for (std::unique_ptr<Request>& r : *built) {
      if (deadline != std::chrono::system_clock::time_point::max()) {
        r->deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                         deadline - std::chrono::system_clock::now());
      }
      r->sink = fan_in != nullptr ? fan_in->Sink(static_cast<int>(&r - built->data()))
                                  : std::shared_ptr<ResponseSink>(stream);
    }
    absl::StatusOr<std::vector<uint64_t>> ids = engine->SubmitChoices(*std::move(built));
    if (!ids.ok()) {
      CountRejected(ids.status().code());
      stream->Finish(ids.status());
    } else {
      stream->set_ids(*std::move(ids));
    }
  });
  return stream.get();
}

grpc::ServerUnaryReactor* ApiService::Tokenize(grpc::CallbackServerContext* context,
                                               const grpc::ByteBuffer* raw,
                                               grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = Authenticate(*context); !status.ok()) {
    CountRejected(status.code());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  auto request = std::make_shared<v1::TokenizeRequest>();
  if (!ParseRaw(*raw, request.get())) {
    const absl::Status status = MalformedError("conveyor.v1.TokenizeRequest");
    CountRejected(status.code());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  if (engine_.load() == nullptr) {  // limits_ (the BOS id) is not known before.
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no model worker is ready yet"));
    return reactor;
  }
  if (absl::Status status = CheckPromptBytes(request->text().size(), limits_); !status.ok()) {
    CountRejected(status.code());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  Prepare([this, reactor, request, response] {
    absl::StatusOr<std::vector<int>> ids = tokenizer_->Encode(request->text());
    if (!ids.ok()) {
      reactor->Finish(ToGrpcStatus(ids.status()));
      return;
    }
    v1::TokenizeResponse answer;
    const bool add_bos = !request->has_add_bos() || request->add_bos();
    if (add_bos && limits_.bos_token_id >= 0) {
      answer.add_token_ids(limits_.bos_token_id);
      answer.add_pieces(ValidUtf8(tokenizer_->Piece(limits_.bos_token_id)));
    }
    for (int id : *ids) {
      answer.add_token_ids(id);
      answer.add_pieces(ValidUtf8(tokenizer_->Piece(id)));
    }
    *response = Serialize(answer);
    reactor->Finish(grpc::Status::OK);
  });
  return reactor;
}

grpc::ServerUnaryReactor* ApiService::GetModelInfo(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw,
                                                   grpc::ByteBuffer* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (absl::Status status = Authenticate(*context); !status.ok()) {
    CountRejected(status.code());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  v1::ModelInfoRequest request;
  if (!ParseRaw(*raw, &request)) {
    const absl::Status status = MalformedError("conveyor.v1.ModelInfoRequest");
    CountRejected(status.code());
    reactor->Finish(ToGrpcStatus(status));
    return reactor;
  }
  if (engine_.load() == nullptr) {
    reactor->Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "no model worker is ready yet"));
    return reactor;
  }
  *response = Serialize(info_);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

}  // namespace conveyor::scheduler
