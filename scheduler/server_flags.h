// Reads conveyor-scheduler's command line (after absl::ParseCommandLine) into its
// configuration: the flags are defined in server_flags.cc, the binary's only reader.
#pragma once

#include "absl/status/statusor.h"
#include "scheduler/server_config.h"

namespace conveyor::scheduler {

// The configuration the flags describe, checked (ValidateServerConfig). A scheduler
// without --scheduler_id gets a random one here.
absl::StatusOr<ServerConfig> ServerConfigFromFlags();

}  // namespace conveyor::scheduler
