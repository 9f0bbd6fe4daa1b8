// The rendezvous store of model/rendezvous.h over gRPC: rank 0 serves the CollectiveStore
// service of proto/worker.proto on an ephemeral port of its collective host; every rank
// reaches it there. With the workers' TLS files it is served and reached over mTLS, so only
// holders of a certificate from the deployment's CA take part (docs/security.md).
#pragma once

#include <memory>

#include "model/rendezvous.h"
#include "rpc/grpc_tls.h"

namespace conveyor::worker {

// Plaintext when `tls` has no files.
std::shared_ptr<model::Rendezvous> MakeGrpcRendezvous(const TlsFiles& tls);

}  // namespace conveyor::worker
