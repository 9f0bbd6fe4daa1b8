#include "worker/grpc_rendezvous.h"

#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "worker.grpc.pb.h"

namespace conveyor::worker {
namespace {

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

class GrpcServedStore final : public model::Rendezvous::ServedStore {
 public:
  GrpcServedStore(std::unique_ptr<grpc::Server> server, std::unique_ptr<StoreService> service,
                  std::string address)
      : service_(std::move(service)), server_(std::move(server)), address_(std::move(address)) {}
  ~GrpcServedStore() override {
    // Waiting Gets see their calls cancelled and return.
    server_->Shutdown(std::chrono::system_clock::now());
  }
  const std::string& address() const override { return address_; }

 private:
  std::unique_ptr<StoreService> service_;  // Outlives the server that calls it.
  std::unique_ptr<grpc::Server> server_;
  const std::string address_;
};

class GrpcReachedStore final : public model::RendezvousStore {
 public:
  GrpcReachedStore(const std::string& address,
                   const std::shared_ptr<grpc::ChannelCredentials>& credentials,
                   std::chrono::system_clock::time_point deadline)
      : stub_(v1::CollectiveStore::NewStub(grpc::CreateChannel(address, credentials))),
        deadline_(deadline) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    grpc::ClientContext context;
    context.set_deadline(deadline_);
    v1::StoreSetRequest request;
    request.set_key(key);
    request.set_value(value);
    v1::StoreSetResponse response;
    return FromGrpcStatus(stub_->Set(&context, request, &response));
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  std::chrono::system_clock::time_point deadline) override {
    grpc::ClientContext context;
    context.set_deadline(std::min(deadline, deadline_));
    v1::StoreGetRequest request;
    request.set_key(key);
    v1::StoreGetResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub_->Get(&context, request, &response)));
    return response.value();
  }

 private:
  std::unique_ptr<v1::CollectiveStore::Stub> stub_;
  const std::chrono::system_clock::time_point deadline_;
};

class GrpcRendezvous final : public model::Rendezvous {
 public:
  explicit GrpcRendezvous(TlsFiles tls) : tls_(std::move(tls)) {}

  absl::StatusOr<std::unique_ptr<ServedStore>> Serve(const std::string& host) override {
    std::shared_ptr<grpc::ServerCredentials> credentials = grpc::InsecureServerCredentials();
    if (tls_.any()) {
      ASSIGN_OR_RETURN(credentials, MakeTlsServerCredentials(tls_, ClientCertificates::kRequired));
    }
    auto service = std::make_unique<StoreService>();
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort(host + ":0", credentials, &port);
    builder.RegisterService(service.get());
    std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
    if (server == nullptr || port == 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot serve the rendezvous store on ", host, ":0"));
    }
    return std::unique_ptr<ServedStore>(
        new GrpcServedStore(std::move(server), std::move(service), absl::StrCat(host, ":", port)));
  }

  absl::StatusOr<std::unique_ptr<model::RendezvousStore>> Reach(
      const std::string& address, std::chrono::system_clock::time_point deadline) override {
    std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
    if (tls_.any()) {
      ASSIGN_OR_RETURN(credentials, MakeTlsChannelCredentials(tls_));
    }
    return std::unique_ptr<model::RendezvousStore>(
        new GrpcReachedStore(address, credentials, deadline));
  }

 private:
  const TlsFiles tls_;
};

}  // namespace

std::shared_ptr<model::Rendezvous> MakeGrpcRendezvous(const TlsFiles& tls) {
  return std::make_shared<GrpcRendezvous>(tls);
}

}  // namespace conveyor::worker
