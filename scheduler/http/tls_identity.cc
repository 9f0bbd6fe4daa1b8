#include "scheduler/http/tls_identity.h"

#include <openssl/err.h>
#include <openssl/pem.h>
#include <sys/stat.h>

#include "absl/strings/str_cat.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {

// A certificate chain and its key, as one PEM chain file and one key file hold them.
struct ReloadingTlsIdentity::Pair {
  X509* cert = nullptr;
  STACK_OF(X509) * chain = nullptr;  // The certificates after the first.
  EVP_PKEY* key = nullptr;
  ~Pair() {
    X509_free(cert);
    sk_X509_pop_free(chain, X509_free);
    EVP_PKEY_free(key);
  }
};

namespace {

absl::Status FileError(const std::string& what, const std::string& path) {
  ERR_clear_error();
  return absl::InvalidArgumentError(absl::StrCat("HTTPS: ", what, " ", path));
}

}  // namespace

ReloadingTlsIdentity::ReloadingTlsIdentity(std::string cert_file, std::string key_file,
                                           int refresh_s)
    : cert_file_(std::move(cert_file)),
      key_file_(std::move(key_file)),
      refresh_(std::max(1, refresh_s)) {}

ReloadingTlsIdentity::~ReloadingTlsIdentity() = default;

absl::StatusOr<std::unique_ptr<ReloadingTlsIdentity>> ReloadingTlsIdentity::Load(
    std::string cert_file, std::string key_file, int refresh_s) {
  std::unique_ptr<ReloadingTlsIdentity> identity(
      new ReloadingTlsIdentity(std::move(cert_file), std::move(key_file), refresh_s));
  std::lock_guard<std::mutex> lock(identity->mu_);
  if (absl::Status loaded = identity->Reload(); !loaded.ok()) return loaded;
  return identity;
}

// Size, mtime and inode of both files: a Secret update swaps a symlink, which changes them.
std::string ReloadingTlsIdentity::Stamp() const {
  std::string stamp;
  for (const std::string& path : {cert_file_, key_file_}) {
    struct stat info {};
    if (::stat(path.c_str(), &info) != 0) return "";
    absl::StrAppend(&stamp, info.st_size, ":", info.st_mtim.tv_sec, ".", info.st_mtim.tv_nsec, ":",
                    info.st_ino, ";");
  }
  return stamp;
}

// Called with mu_ held.
absl::Status ReloadingTlsIdentity::Reload() {
  const std::string stamp = Stamp();
  auto pair = std::make_shared<Pair>();
  FILE* certs = std::fopen(cert_file_.c_str(), "r");
  if (certs == nullptr) return FileError("cannot read the certificate", cert_file_);
  pair->cert = PEM_read_X509(certs, nullptr, nullptr, nullptr);
  pair->chain = sk_X509_new_null();
  while (X509* next = PEM_read_X509(certs, nullptr, nullptr, nullptr))
    sk_X509_push(pair->chain, next);
  std::fclose(certs);
  if (pair->cert == nullptr) return FileError("no PEM certificate in", cert_file_);
  FILE* key = std::fopen(key_file_.c_str(), "r");
  if (key == nullptr) return FileError("cannot read the private key", key_file_);
  pair->key = PEM_read_PrivateKey(key, nullptr, nullptr, nullptr);
  std::fclose(key);
  if (pair->key == nullptr) return FileError("no unencrypted PEM private key in", key_file_);
  if (X509_check_private_key(pair->cert, pair->key) != 1) {
    return FileError(absl::StrCat("the key ", key_file_, " does not belong to the certificate"),
                     cert_file_);
  }
  ERR_clear_error();  // The chain loop ends on a "no start line" error.
  pair_ = std::move(pair);
  stamp_ = stamp;
  next_check_ = std::chrono::steady_clock::now() + refresh_;
  return absl::OkStatus();
}

std::shared_ptr<const ReloadingTlsIdentity::Pair> ReloadingTlsIdentity::Current() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = std::chrono::steady_clock::now();
  if (now >= next_check_) {
    next_check_ = now + refresh_;
    if (Stamp() != stamp_) {
      if (absl::Status loaded = Reload(); loaded.ok()) {
        spdlog::info("HTTPS: certificate {} reloaded", cert_file_);
      } else {
        spdlog::error("{}; the previous certificate stays in use", std::string(loaded.message()));
      }
    }
  }
  return pair_;
}

int ReloadingTlsIdentity::OnHandshake(SSL* ssl, void* self) {
  const std::shared_ptr<const Pair> pair = static_cast<ReloadingTlsIdentity*>(self)->Current();
  // With override=1 the pair replaces whatever the connection had; OpenSSL takes its own
  // references, so the pair may be dropped by a later reload.
  return SSL_use_cert_and_key(ssl, pair->cert, pair->key, pair->chain, 1);
}

void ReloadingTlsIdentity::Install(SSL_CTX* ctx) { SSL_CTX_set_cert_cb(ctx, OnHandshake, this); }

}  // namespace conveyor::scheduler
