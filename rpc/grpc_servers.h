// Small pieces both processes' gRPC servers need: a plaintext server that answers only the
// standard health service (for probes that cannot speak TLS, such as the kubelet's), a
// builder option that keeps server reflection off a server, and Abseil's lock debugging
// turned off.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class CallbackGenericService;
class HealthCheckServiceInterface;
class Server;
class ServerBuilder;
}  // namespace grpc

namespace conveyor {

// Turns off Abseil's mutex deadlock detection for the process; call first in main().
// Debian builds Abseil without NDEBUG, which leaves the detection on: every absl::Mutex
// acquisition (gRPC takes several per call) then updates a process-wide lock-order graph
// under one global lock, a debugging aid that costs every thread. Seen in a profile of
// the scheduler under load (GraphCycles::GetId, 1% of its CPU, on the step's path).
void DisableMutexDeadlockDetection();

// Keeps gRPC's reflection plugin off the server `builder` builds. Linking
// grpc++_reflection adds the plugin to every server at static initialisation, so
// reflection is on unless it is taken away again.
void WithoutReflection(grpc::ServerBuilder* builder);

// grpc.health.v1.Health alone, in plaintext; every other method is UNIMPLEMENTED.
// Needs grpc::EnableDefaultHealthCheckService(true) first.
class HealthOnlyServer {
 public:
  static absl::StatusOr<std::unique_ptr<HealthOnlyServer>> Start(const std::string& address);
  ~HealthOnlyServer();
  HealthOnlyServer(const HealthOnlyServer&) = delete;
  HealthOnlyServer& operator=(const HealthOnlyServer&) = delete;

  // What the health service answers for the whole server ("").
  void SetServing(bool serving);

 private:
  HealthOnlyServer() = default;
  // Answers everything but health UNIMPLEMENTED; it also gives the server the polled
  // completion queue it needs when health is its only service.
  std::unique_ptr<grpc::CallbackGenericService> unimplemented_;
  std::unique_ptr<grpc::Server> server_;
};

}  // namespace conveyor
