// TLS for Conveyor's gRPC servers and channels, from PEM files: the client API (TLS, or
// mTLS when a client CA is given) and the scheduler <-> worker plane (mTLS: each side
// presents a certificate issued by the deployment's CA and verifies the other's).
//
// Files are checked when the credentials are made (they exist, parse, the key matches the
// certificate), so a misconfiguration stops the process at start-up with a message that
// names the file, rather than failing every handshake later. After that gRPC re-reads them
// every `refresh_s` seconds: a rotated certificate (cert-manager rewriting a mounted
// Secret) is used by new connections without a restart.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace conveyor {

struct TlsFiles {
  std::string cert_file;  // PEM certificate (chain) this side presents.
  std::string key_file;   // Its PEM private key.
  std::string ca_file;    // PEM CA bundle that verifies the peer's certificate.
  int refresh_s = 60;     // How often the files are re-read.

  // Whether any file is set: TLS is wanted.
  bool any() const { return !cert_file.empty() || !key_file.empty() || !ca_file.empty(); }
  // Whether all three are set, as mTLS needs.
  bool complete() const { return !cert_file.empty() && !key_file.empty() && !ca_file.empty(); }
};

enum class ClientCertificates {
  kNotRequested,  // TLS: the server proves who it is; clients stay anonymous.
  kRequired,      // mTLS: a client without a certificate from `ca_file` is refused.
};

// Server credentials presenting cert_file/key_file. kRequired needs ca_file.
// INVALID_ARGUMENT names the file and what is wrong with it.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeTlsServerCredentials(
    const TlsFiles& files, ClientCertificates client_certificates);

// Channel credentials that verify the server's certificate against ca_file (required) and
// its host name against the target (or the name given by the channel argument
// GRPC_SSL_TARGET_NAME_OVERRIDE_ARG), presenting cert_file/key_file when both are set.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsChannelCredentials(
    const TlsFiles& files);

}  // namespace conveyor
