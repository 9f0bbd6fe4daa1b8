// The key-value store the ranks of a tensor-parallel group meet through where their
// collectives need one (Gloo on CPUs: each rank publishes its TCP pairs' addresses and
// reads the others'). The model runtime sees only this interface; the worker serves and
// reaches the store over gRPC, with its TLS (worker/grpc_rendezvous.h).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace conveyor::model {

// One rank's connection to the group's store.
class RendezvousStore {
 public:
  virtual ~RendezvousStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // The value of `key` once some rank has set it; DEADLINE_EXCEEDED (or UNAVAILABLE) if
  // none has by `deadline`.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          std::chrono::system_clock::time_point deadline) = 0;
};

// Serves stores (rank 0, one per group it forms) and reaches them (every rank).
class Rendezvous {
 public:
  // A store being served; destroying it stops serving (waiting Gets end).
  class ServedStore {
   public:
    virtual ~ServedStore() = default;
    // "host:port" where the other ranks reach it: what the collective id carries.
    virtual const std::string& address() const = 0;
  };

  virtual ~Rendezvous() = default;
  // Serves a new, empty store on `host` (the address other ranks reach this one at).
  virtual absl::StatusOr<std::unique_ptr<ServedStore>> Serve(const std::string& host) = 0;
  // Reaches the store at `address`; its calls give up at `deadline`.
  virtual absl::StatusOr<std::unique_ptr<RendezvousStore>> Reach(
      const std::string& address, std::chrono::system_clock::time_point deadline) = 0;
};

}  // namespace conveyor::model
