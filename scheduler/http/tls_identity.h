// The HTTPS port's certificate and key, re-read when their files change, so a rotated
// certificate (cert-manager rewriting a mounted Secret) is served by new connections
// without a restart, as gRPC's ports do (rpc/grpc_tls.h).
//
// Installed on an OpenSSL server context with Install: every handshake asks for the
// current pair (SSL_CTX_set_cert_cb), and at most every `refresh_s` seconds a handshake
// first checks the files' size, mtime and inode. A pair that fails to load (a half-written
// file, a key that does not match) is logged and the previous one is kept.
#pragma once

#include <openssl/ssl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor::scheduler {

class ReloadingTlsIdentity {
 public:
  // Loads the pair now; INVALID_ARGUMENT names the file that is wrong.
  static absl::StatusOr<std::unique_ptr<ReloadingTlsIdentity>> Load(std::string cert_file,
                                                                    std::string key_file,
                                                                    int refresh_s);
  ~ReloadingTlsIdentity();
  ReloadingTlsIdentity(const ReloadingTlsIdentity&) = delete;
  ReloadingTlsIdentity& operator=(const ReloadingTlsIdentity&) = delete;

  // Makes `ctx` present the current pair on every handshake. `this` must outlive `ctx`.
  void Install(SSL_CTX* ctx);

 private:
  struct Pair;
  ReloadingTlsIdentity(std::string cert_file, std::string key_file, int refresh_s);
  static int OnHandshake(SSL* ssl, void* self);
  // The pair to present, re-read first if the files changed and a check is due.
  std::shared_ptr<const Pair> Current();
  absl::Status Reload();
  std::string Stamp() const;

  const std::string cert_file_;
  const std::string key_file_;
  const std::chrono::seconds refresh_;
  std::mutex mu_;
  std::shared_ptr<const Pair> pair_;                  // Guarded by mu_.
  std::string stamp_;                                 // Guarded by mu_.
  std::chrono::steady_clock::time_point next_check_;  // Guarded by mu_.
};

}  // namespace conveyor::scheduler
