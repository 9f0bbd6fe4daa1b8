#include "worker/gloo_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"
#include "grpcpp/grpcpp.h"
#include "worker.grpc.pb.h"

namespace conveyor::worker {
namespace {

// A collective waits this long for its slowest peer before failing the step; long,
// because a peer may legitimately be busy with a large prefill on CPU.
constexpr std::chrono::minutes kOperationTimeout{2};

// How often a waiting Get checks whether its call was cancelled.
constexpr std::chrono::milliseconds kStorePollInterval{50};

class StoreService final : public v1::CollectiveStore::Service {
 public:
  grpc::Status Set(grpc::ServerContext*, const v1::StoreSetRequest* request,
                   v1::StoreSetResponse*) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[request->key()] = request->value();
    }
    cv_.notify_all();
    return grpc::Status::OK;
  }

  grpc::Status Get(grpc::ServerContext* context, const v1::StoreGetRequest* request,
                   v1::StoreGetResponse* response) override {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (auto it = values_.find(request->key()); it != values_.end()) {
        response->set_value(it->second);
        return grpc::Status::OK;
      }
      // Cancelled covers a passed deadline and the server shutting down.
      if (context->IsCancelled()) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            absl::StrCat("key \"", request->key(), "\" was never set"));
      }
      cv_.wait_for(lock, kStorePollInterval);
    }
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> values_;
};

// Gloo's view of rank 0's store. Gloo's Store interface returns nothing, so failures
// are thrown as gloo::IoException, which ConnectGloo catches (Gloo itself throws too).
class GrpcStore final : public gloo::rendezvous::Store {
 public:
  GrpcStore(const std::string& address,
            const std::shared_ptr<grpc::ChannelCredentials>& credentials,
            std::chrono::system_clock::time_point deadline)
      : address_(address),
        stub_(v1::CollectiveStore::NewStub(grpc::CreateChannel(address, credentials))),
        deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    grpc::ClientContext context;
    context.set_deadline(deadline_);
    v1::StoreSetRequest request;
    request.set_key(key);
    request.set_value(std::string(data.begin(), data.end()));
    v1::StoreSetResponse response;
    Check(stub_->Set(&context, request, &response), "set", key);
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = Get(key, deadline_);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) Get(key, deadline_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::min(deadline_, std::chrono::system_clock::now() + timeout);
    for (const std::string& key : keys) Get(key, deadline);
  }

 private:
  std::string Get(const std::string& key, std::chrono::system_clock::time_point deadline) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    v1::StoreGetRequest request;
    request.set_key(key);
    v1::StoreGetResponse response;
    Check(stub_->Get(&context, request, &response), "get", key);
    return response.value();
  }

  void Check(const grpc::Status& status, const char* op, const std::string& key) const {
    if (!status.ok()) {
      throw gloo::IoException(absl::StrCat("rendezvous store at ", address_, ": ", op, " \"", key,
                                           "\": ", status.error_message()));
    }
  }

  const std::string address_;
  std::unique_ptr<v1::CollectiveStore::Stub> stub_;
  const std::chrono::system_clock::time_point deadline_;
};

class GlooCommunicator final : public model::Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  // The CPU backend's operations are complete when they return, so `data` is ready.
  absl::Status AllReduceSum(void* data, size_t count) override {
    gloo::AllreduceOptions options(context_);
    options.setOutput(static_cast<float*>(data), count);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    return Run("all-reduce", [&] { gloo::allreduce(options); });
  }

  absl::Status AllGather(void* data, size_t count) override {
    gloo::AllgatherOptions options(context_);
    // No input buffer: Gloo gathers in place around this rank's part of the output.
    options.setOutput(static_cast<float*>(data), count * context_->size);
    return Run("all-gather", [&] { gloo::allgather(options); });
  }

 private:
  template <typename Fn>
  absl::Status Run(const char* what, Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("Gloo ", what, " on rank ", context_->rank, " failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

class GlooRendezvousServer::Impl {
 public:
  StoreService service;
  std::unique_ptr<grpc::Server> server;
};

absl::StatusOr<std::unique_ptr<GlooRendezvousServer>> GlooRendezvousServer::Start(
    const std::string& host, const TlsFiles& tls) {
  std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
  if (tls.any()) {
    ASSIGN_OR_RETURN(credentials, MakeTlsServerCredentials(tls, ClientCertificates::kRequired));
  }
  auto impl = std::make_unique<Impl>();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(host + ":0", credentials, &port);
  builder.RegisterService(&impl->service);
  impl->server = builder.BuildAndStart();
  if (impl->server == nullptr || port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve the Gloo rendezvous store on ", host, ":0"));
  }
  std::string id = absl::StrCat(std::string(model::kGlooIdPrefix), host, ":", port);
  return std::unique_ptr<GlooRendezvousServer>(
      new GlooRendezvousServer(std::move(impl), std::move(id)));
}

GlooRendezvousServer::GlooRendezvousServer(std::unique_ptr<Impl> impl, std::string collective_id)
    : impl_(std::move(impl)), collective_id_(std::move(collective_id)) {}

GlooRendezvousServer::~GlooRendezvousServer() {
  // Waiting Gets see their calls cancelled and return.
  impl_->server->Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<std::unique_ptr<model::Communicator>> ConnectGloo(
    std::string_view collective_id, int rank, int world_size, const std::string& host,
    std::chrono::system_clock::time_point deadline, const TlsFiles& tls) {
  ASSIGN_OR_RETURN(const std::string_view address,
                   model::CollectiveIdPayload(collective_id, model::kGlooIdPrefix));
  const std::string store_address(address);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (tls.any()) {
    ASSIGN_OR_RETURN(credentials, MakeTlsChannelCredentials(tls));
  }
  GrpcStore store(store_address, credentials, deadline);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::system_clock::now())));
    context->connectFullMesh(store, device);
    // A rank that connected may still be reading the store for its other peers; once
    // the barrier passes, all are done with it and rank 0 may stop serving it.
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    context->setTimeout(kOperationTimeout);
    return std::unique_ptr<model::Communicator>(new GlooCommunicator(std::move(context)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("Gloo rendezvous of rank ", rank, " of ", world_size,
                                               " through ", store_address, " failed: ", e.what()));
  }
}

}  // namespace conveyor::worker
