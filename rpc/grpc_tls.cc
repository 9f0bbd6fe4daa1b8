#include "rpc/grpc_tls.h"

#include <openssl/pem.h>
#include <openssl/x509.h>

#include <fstream>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"

namespace conveyor {
namespace {

using grpc::experimental::FileWatcherCertificateProvider;

struct BioDeleter {
  void operator()(BIO* bio) const { BIO_free(bio); }
};
struct X509Deleter {
  void operator()(X509* cert) const { X509_free(cert); }
};
struct KeyDeleter {
  void operator()(EVP_PKEY* key) const { EVP_PKEY_free(key); }
};
using BioPtr = std::unique_ptr<BIO, BioDeleter>;
using X509Ptr = std::unique_ptr<X509, X509Deleter>;

absl::StatusOr<std::string> ReadFile(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " ", path));
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

BioPtr MemoryBio(const std::string& data) {
  return BioPtr(BIO_new_mem_buf(data.data(), static_cast<int>(data.size())));
}

// The first certificate of a PEM file; refuses one that has expired.
absl::StatusOr<X509Ptr> ReadCertificate(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string pem, ReadFile(path, "certificate"));
  BioPtr bio = MemoryBio(pem);
  X509Ptr cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds no PEM certificate (\"-----BEGIN CERTIFICATE-----\")"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate in ", path, " has expired: issue a new one"));
  }
  return cert;
}

absl::Status CheckKeyMatches(const std::string& key_path, X509* cert,
                             const std::string& cert_path) {
  ASSIGN_OR_RETURN(const std::string pem, ReadFile(key_path, "private key"));
  BioPtr bio = MemoryBio(pem);
  std::unique_ptr<EVP_PKEY, KeyDeleter> key(
      PEM_read_bio_PrivateKey(bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(key_path, " holds no unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert, key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the private key ", key_path, " does not belong to the certificate ", cert_path));
  }
  return absl::OkStatus();
}

absl::Status CheckCaBundle(const std::string& path) {
  ASSIGN_OR_RETURN(const std::string pem, ReadFile(path, "CA bundle"));
  BioPtr bio = MemoryBio(pem);
  STACK_OF(X509_INFO)* infos = PEM_X509_INFO_read_bio(bio.get(), nullptr, nullptr, nullptr);
  int certs = 0;
  if (infos != nullptr) {
    for (int i = 0; i < sk_X509_INFO_num(infos); ++i) {
      if (sk_X509_INFO_value(infos, i)->x509 != nullptr) ++certs;
    }
    sk_X509_INFO_pop_free(infos, X509_INFO_free);
  }
  if (certs == 0) {
    return absl::InvalidArgumentError(absl::StrCat(path, " holds no PEM CA certificate"));
  }
  return absl::OkStatus();
}

absl::Status CheckIdentity(const TlsFiles& files) {
  if (files.cert_file.empty() || files.key_file.empty()) {
    return absl::InvalidArgumentError("TLS needs both a certificate file and its private key file");
  }
  ASSIGN_OR_RETURN(X509Ptr cert, ReadCertificate(files.cert_file));
  return CheckKeyMatches(files.key_file, cert.get(), files.cert_file);
}

absl::Status CheckRefresh(const TlsFiles& files) {
  if (files.refresh_s <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the certificate refresh interval must be positive, got ", files.refresh_s));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> MakeTlsServerCredentials(
    const TlsFiles& files, ClientCertificates client_certificates) {
  RETURN_IF_ERROR(CheckRefresh(files));
  RETURN_IF_ERROR(CheckIdentity(files));
  const bool verify_clients = client_certificates == ClientCertificates::kRequired;
  if (verify_clients && files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "verifying client certificates (mTLS) needs the CA file that issued them");
  }
  if (verify_clients) RETURN_IF_ERROR(CheckCaBundle(files.ca_file));
  auto provider =
      verify_clients ? std::make_shared<FileWatcherCertificateProvider>(
                           files.key_file, files.cert_file, files.ca_file,
                           static_cast<unsigned>(files.refresh_s))
                     : std::make_shared<FileWatcherCertificateProvider>(
                           files.key_file, files.cert_file, static_cast<unsigned>(files.refresh_s));
  grpc::experimental::TlsServerCredentialsOptions options(provider);
  options.watch_identity_key_cert_pairs();
  if (verify_clients) {
    options.watch_root_certs();
    options.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  } else {
    options.set_cert_request_type(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE);
  }
  return grpc::experimental::TlsServerCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> MakeTlsChannelCredentials(
    const TlsFiles& files) {
  RETURN_IF_ERROR(CheckRefresh(files));
  if (files.ca_file.empty()) {
    return absl::InvalidArgumentError(
        "a TLS channel needs the CA file that issued the server's certificate");
  }
  RETURN_IF_ERROR(CheckCaBundle(files.ca_file));
  const bool present_identity = !files.cert_file.empty() || !files.key_file.empty();
  if (present_identity) RETURN_IF_ERROR(CheckIdentity(files));
  auto provider = present_identity ? std::make_shared<FileWatcherCertificateProvider>(
                                         files.key_file, files.cert_file, files.ca_file,
                                         static_cast<unsigned>(files.refresh_s))
                                   : std::make_shared<FileWatcherCertificateProvider>(
                                         files.ca_file, static_cast<unsigned>(files.refresh_s));
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(provider);
  options.watch_root_certs();
  if (present_identity) options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  std::shared_ptr<grpc::ChannelCredentials> credentials =
      grpc::experimental::TlsCredentials(options);
  if (credentials == nullptr) {
    return absl::InternalError("gRPC could not make TLS channel credentials");
  }
  return credentials;
}

}  // namespace conveyor
