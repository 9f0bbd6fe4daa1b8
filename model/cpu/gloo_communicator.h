// Gloo over TCP: the communicator of the CPU backend, whose activations are float32 host
// memory.
//
// Rendezvous: rank 0 serves a small key-value store (model/rendezvous.h; the worker's is
// a gRPC service, over mTLS with the workers' certificates), whose address the collective
// id carries ("gloo:HOST:PORT"). Every rank publishes the addresses of its TCP pairs there
// and reads the others', so ranks need no shared filesystem, only TCP between them (as
// Gloo's pairs do anyway). Gloo's pairs themselves are plain TCP (docs/security.md).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/communicator.h"
#include "model/rendezvous.h"

namespace conveyor::model {

// Rank 0's side: serves a new store through `rendezvous` on `host` and returns it; its
// collective id is GlooCollectiveId(*store).
absl::StatusOr<std::unique_ptr<Rendezvous::ServedStore>> ServeGlooStore(Rendezvous& rendezvous,
                                                                        const std::string& host);
std::string GlooCollectiveId(const Rendezvous::ServedStore& store);

// Connects `rank` of `world_size` through the store `collective_id` names, listening for
// its peers on `host`. Waits for every rank until `deadline`; when it returns OK every
// rank has connected, so rank 0 may stop its store.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    std::string_view collective_id, int rank, int world_size, const std::string& host,
    std::chrono::system_clock::time_point deadline, Rendezvous& rendezvous);

}  // namespace conveyor::model
