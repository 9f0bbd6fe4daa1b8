// Gloo over TCP: the communicator of the CPU backend, whose activations are float32 host
// memory.
//
// Rendezvous: rank 0 serves a small key-value store (the CollectiveStore gRPC service of
// proto/worker.proto) on an ephemeral port; the collective id is "gloo:HOST:PORT". Every
// rank publishes the addresses of its TCP pairs there and reads the others', so ranks
// need no shared filesystem, only TCP between them (as Gloo's pairs do anyway). With the
// workers' TLS files the store is served and reached over mTLS, so only holders of a
// certificate from the deployment's CA can take part; Gloo's pairs themselves are plain
// TCP (docs/security.md).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "model/communicator.h"
#include "rpc/grpc_tls.h"

namespace conveyor::worker {

// The rendezvous store that rank 0 serves from CreateCollectiveId until its Init has
// connected every rank. Destroying it stops the server.
class GlooRendezvousServer {
 public:
  // Serves on an ephemeral port of `host`, the address other ranks reach this one at;
  // over mTLS when `tls` has files.
  static absl::StatusOr<std::unique_ptr<GlooRendezvousServer>> Start(const std::string& host,
                                                                     const TlsFiles& tls);
  ~GlooRendezvousServer();
  GlooRendezvousServer(const GlooRendezvousServer&) = delete;
  GlooRendezvousServer& operator=(const GlooRendezvousServer&) = delete;

  const std::string& collective_id() const { return collective_id_; }

 private:
  class Impl;
  explicit GlooRendezvousServer(std::unique_ptr<Impl> impl, std::string collective_id);
  std::unique_ptr<Impl> impl_;
  std::string collective_id_;
};

// Connects `rank` of `world_size` through the store `collective_id` names, listening for
// its peers on `host`. Waits for every rank until `deadline`; when it returns OK every
// rank has connected, so rank 0 may stop its store. The store is reached over mTLS when
// `tls` has files.
absl::StatusOr<std::unique_ptr<model::Communicator>> ConnectGloo(
    std::string_view collective_id, int rank, int world_size, const std::string& host,
    std::chrono::system_clock::time_point deadline, const TlsFiles& tls);

}  // namespace conveyor::worker
