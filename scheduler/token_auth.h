// Bearer tokens for the client APIs (gRPC `authorization` metadata, HTTP `Authorization`
// header, both "Bearer <token>"), with an optional limit on each token's concurrent
// Generate calls. Health and reflection are not guarded: probes carry no token.
//
// The tokens file (--auth_tokens_file) has one client per line, '#' starts a comment:
//
//   <token> [<name> [<max_concurrent>]]
//
// `name` (default "client-<line>") is what logs show instead of the token;
// `max_concurrent` (default: the server-wide limit, 0 = none) caps that token's Generate
// calls in flight. Tokens are at least 16 characters. The file is re-read when it changes
// (checked at most every reload interval), so tokens rotate without a restart; a file that
// no longer parses is logged and the previous tokens stay in force.
//
// Only SHA-256 digests of the tokens are kept, and a presented token is compared with
// every one of them in constant time (CRYPTO_memcmp, no early exit), so neither the
// answer's timing nor a memory dump gives a token away.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor::scheduler {

class TokenAuthenticator {
 public:
  struct Options {
    std::string tokens_file;
    // Concurrent Generate calls per token where its line sets none; 0 = unlimited.
    int default_max_concurrent = 0;
    // Shortest time between two checks of the file for changes.
    std::chrono::milliseconds reload_interval{10'000};
  };

  // What one client (a token) is allowed, and how much of it is in use. Shared with the
  // grants that hold a slot, so a reload never loses the count of calls in flight.
  struct Client {
    std::string name;
    std::atomic<int> max_concurrent{0};
    std::atomic<int> in_flight{0};
  };

  // An authenticated caller; holds one of its concurrent-call slots if Admit gave it.
  // The slot is released when the grant is destroyed or Release() is called.
  class Grant {
   public:
    Grant() = default;
    Grant(Grant&& other) noexcept;
    Grant& operator=(Grant&& other) noexcept;
    Grant(const Grant&) = delete;
    Grant& operator=(const Grant&) = delete;
    ~Grant() { Release(); }

    // The client's name ("" for an empty grant: no authentication configured).
    const std::string& client() const;
    void Release();

   private:
    friend class TokenAuthenticator;
    std::shared_ptr<Client> client_;
    bool holds_slot_ = false;
  };

  // Reads the tokens file; INVALID_ARGUMENT names the line that is wrong.
  static absl::StatusOr<std::unique_ptr<TokenAuthenticator>> Create(Options options);

  // Checks an Authorization value. UNAUTHENTICATED when it is missing, not "Bearer ...",
  // or not a known token.
  absl::StatusOr<Grant> Authenticate(std::string_view authorization);
  // Authenticate, then takes one of the token's concurrent-call slots:
  // RESOURCE_EXHAUSTED when all of them are in use.
  absl::StatusOr<Grant> Admit(std::string_view authorization);

  // Re-reads the file now if it changed. Errors leave the current tokens in force.
  absl::Status ReloadIfChanged();

 private:
  using Digest = std::array<unsigned char, 32>;
  struct Entry {
    Digest digest;
    std::shared_ptr<Client> client;
  };
  struct FileStamp {
    int64_t mtime_ns = 0;
    int64_t size = 0;
    uint64_t inode = 0;
    bool operator==(const FileStamp&) const = default;
  };

  explicit TokenAuthenticator(Options options) : options_(std::move(options)) {}
  absl::Status Load();
  void MaybeReload();
  std::shared_ptr<const std::vector<Entry>> entries() const;

  const Options options_;
  mutable std::mutex mu_;
  std::shared_ptr<const std::vector<Entry>> entries_;  // Guarded by mu_.
  FileStamp stamp_;                                    // Guarded by mu_.
  std::chrono::steady_clock::time_point next_check_;   // Guarded by mu_.
};

}  // namespace conveyor::scheduler
