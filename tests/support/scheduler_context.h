// A gRPC client context that presents itself to a worker as its scheduler (the identity
// a worker binds to: rpc/scheduler_id_metadata.h), for tests that drive workers directly.
#pragma once

#include <string>

#include "grpcpp/client_context.h"
#include "rpc/scheduler_id_metadata.h"

namespace conveyor::testing {

inline constexpr char kTestSchedulerId[] = "test-scheduler";

class SchedulerContext : public grpc::ClientContext {
 public:
  explicit SchedulerContext(const std::string& id = kTestSchedulerId) {
    AddMetadata(kSchedulerIdMetadataKey, id);
  }
};

}  // namespace conveyor::testing
