#include "rpc/grpc_servers.h"

#include <algorithm>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/impl/server_builder_option.h"
#include "grpcpp/impl/server_builder_plugin.h"

namespace conveyor {
namespace {

// Removes the plugins of one name from a builder as it builds.
class RemovePlugin final : public grpc::ServerBuilderOption {
 public:
  explicit RemovePlugin(std::string name) : name_(std::move(name)) {}
  void UpdateArguments(grpc::ChannelArguments* /*args*/) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [&](const auto& plugin) { return plugin->name() == name_; }),
                   plugins->end());
  }

 private:
  const std::string name_;
};

}  // namespace

void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

void WithoutReflection(grpc::ServerBuilder* builder) {
  // The name grpc::reflection::ProtoServerReflectionPlugin gives itself.
  builder->SetOption(std::make_unique<RemovePlugin>("proto_server_reflection"));
}

absl::StatusOr<std::unique_ptr<HealthOnlyServer>> HealthOnlyServer::Start(
    const std::string& address) {
  std::unique_ptr<HealthOnlyServer> health(new HealthOnlyServer());
  health->unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  grpc::ServerBuilder builder;
  WithoutReflection(&builder);
  int port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(health->unimplemented_.get());
  health->server_ = builder.BuildAndStart();
  if (health->server_ == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat("cannot serve gRPC health on ", address));
  }
  return health;
}

HealthOnlyServer::~HealthOnlyServer() {
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
}

void HealthOnlyServer::SetServing(bool serving) {
  server_->GetHealthCheckService()->SetServingStatus(serving);
}

}  // namespace conveyor
