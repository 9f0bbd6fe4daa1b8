// How a scheduler names itself to its workers, beyond the messages of the step protocol
// (proto/worker.proto, docs/step-protocol.md): both sides must agree on the key.
#pragma once

namespace conveyor {

// gRPC metadata key under which every call a scheduler makes to a worker carries the
// scheduler's identity (its --scheduler_id). A worker serves the scheduler that bound it
// (Init) and refuses everyone else.
inline constexpr char kSchedulerIdMetadataKey[] = "x-conveyor-scheduler-id";

}  // namespace conveyor
