#include "scheduler/token_auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <sys/stat.h>

#include <fstream>
#include <map>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace conveyor::scheduler {
namespace {

constexpr size_t kMinTokenChars = 16;

std::array<unsigned char, 32> Sha256(absl::string_view text) {
  std::array<unsigned char, 32> digest{};
  unsigned int size = 0;
  EVP_Digest(text.data(), text.size(), digest.data(), &size, EVP_sha256(), nullptr);
  return digest;
}

absl::Status Unauthenticated(absl::string_view why) {
  return absl::UnauthenticatedError(
      absl::StrCat(why,
                   ": send \"authorization: Bearer <token>\" with a token the server "
                   "was given (--auth_tokens_file)"));
}

}  // namespace

TokenAuthenticator::Grant::Grant(Grant&& other) noexcept
    : client_(std::move(other.client_)), holds_slot_(other.holds_slot_) {
  other.holds_slot_ = false;
}

TokenAuthenticator::Grant& TokenAuthenticator::Grant::operator=(Grant&& other) noexcept {
  if (this != &other) {
    Release();
    client_ = std::move(other.client_);
    holds_slot_ = other.holds_slot_;
    other.holds_slot_ = false;
  }
  return *this;
}

const std::string& TokenAuthenticator::Grant::client() const {
  static const std::string kNone;
  return client_ == nullptr ? kNone : client_->name;
}

void TokenAuthenticator::Grant::Release() {
  if (holds_slot_) client_->in_flight.fetch_sub(1);
  holds_slot_ = false;
}

absl::StatusOr<std::unique_ptr<TokenAuthenticator>> TokenAuthenticator::Create(Options options) {
  if (options.default_max_concurrent < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the per-token concurrency limit must be 0 (none) or positive, got ",
                     options.default_max_concurrent));
  }
  std::unique_ptr<TokenAuthenticator> auth(new TokenAuthenticator(std::move(options)));
  std::lock_guard<std::mutex> lock(auth->mu_);
  RETURN_IF_ERROR(auth->Load());
  return auth;
}

// Reads and parses the file into a new table; keeps each client's state (its count of
// calls in flight) when its name is still there. Called with mu_ held.
absl::Status TokenAuthenticator::Load() {
  const std::string& path = options_.tokens_file;
  struct stat info {};
  if (::stat(path.c_str(), &info) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the tokens file ", path));
  }
  std::ifstream in(path);
  if (!in) return absl::InvalidArgumentError(absl::StrCat("cannot read the tokens file ", path));

  std::map<std::string, std::shared_ptr<Client>> previous;
  if (entries_ != nullptr) {
    for (const Entry& e : *entries_) previous[e.client->name] = e.client;
  }
  auto entries = std::make_shared<std::vector<Entry>>();
  std::map<std::string, int> names;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    const absl::string_view content = absl::StripAsciiWhitespace(
        absl::string_view(line).substr(0, std::min(line.find('#'), line.size())));
    if (content.empty()) continue;
    const std::vector<absl::string_view> fields =
        absl::StrSplit(content, absl::ByAnyChar(" \t"), absl::SkipEmpty());
    auto error = [&](absl::string_view what) {
      return absl::InvalidArgumentError(absl::StrCat(path, ":", number, ": ", what,
                                                     " (a line is: <token> [<name> "
                                                     "[<max_concurrent>]])"));
    };
    if (fields.size() > 3) return error("too many fields");
    const absl::string_view token = fields[0];
    if (token.size() < kMinTokenChars) {
      return error(absl::StrCat("the token is shorter than ", kMinTokenChars, " characters"));
    }
    const std::string name =
        fields.size() > 1 ? std::string(fields[1]) : absl::StrCat("client-", number);
    int max_concurrent = options_.default_max_concurrent;
    if (fields.size() > 2 &&
        (!absl::SimpleAtoi(fields[2], &max_concurrent) || max_concurrent < 0)) {
      return error("max_concurrent must be 0 (no limit) or a positive integer");
    }
    if (auto [it, added] = names.emplace(name, number); !added) {
      return error(absl::StrCat("the name \"", name, "\" is already used on line ", it->second));
    }
    const Digest digest = Sha256(token);
    for (const Entry& e : *entries) {
      if (e.digest == digest) return error("the same token is listed twice");
    }
    std::shared_ptr<Client> client = previous.count(name) ? previous[name] : nullptr;
    if (client == nullptr) {
      client = std::make_shared<Client>();
      client->name = name;
    }
    client->max_concurrent.store(max_concurrent);
    entries->push_back(Entry{digest, std::move(client)});
  }
  if (entries->empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the tokens file ", path, " lists no token: nobody could call the server"));
  }
  entries_ = std::move(entries);
  stamp_ =
      FileStamp{static_cast<int64_t>(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec,
                static_cast<int64_t>(info.st_size), static_cast<uint64_t>(info.st_ino)};
  next_check_ = std::chrono::steady_clock::now() + options_.reload_interval;
  return absl::OkStatus();
}

absl::Status TokenAuthenticator::ReloadIfChanged() {
  std::lock_guard<std::mutex> lock(mu_);
  next_check_ = std::chrono::steady_clock::now() + options_.reload_interval;
  struct stat info {};
  // A Kubernetes Secret update swaps a symlink: stat follows it, so the inode changes.
  if (::stat(options_.tokens_file.c_str(), &info) == 0) {
    const FileStamp now{
        static_cast<int64_t>(info.st_mtim.tv_sec) * 1'000'000'000 + info.st_mtim.tv_nsec,
        static_cast<int64_t>(info.st_size), static_cast<uint64_t>(info.st_ino)};
    if (now == stamp_) return absl::OkStatus();
  }
  const size_t before = entries_->size();
  if (absl::Status loaded = Load(); !loaded.ok()) {
    spdlog::error("tokens file not reloaded, the previous {} token(s) stay in force: {}", before,
                  loaded.ToString());
    return loaded;
  }
  spdlog::info("tokens file {} reloaded: {} token(s)", options_.tokens_file, entries_->size());
  return absl::OkStatus();
}

void TokenAuthenticator::MaybeReload() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (std::chrono::steady_clock::now() < next_check_) return;
  }
  ReloadIfChanged().IgnoreError();  // Logged; the old tokens stay.
}

std::shared_ptr<const std::vector<TokenAuthenticator::Entry>> TokenAuthenticator::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_;
}

absl::StatusOr<TokenAuthenticator::Grant> TokenAuthenticator::Authenticate(
    std::string_view authorization_header) {
  MaybeReload();
  const absl::string_view authorization(authorization_header.data(), authorization_header.size());
  if (authorization.empty()) return Unauthenticated("the request carries no token");
  // The scheme is case-insensitive (RFC 6750).
  constexpr absl::string_view kScheme = "bearer ";
  if (authorization.size() <= kScheme.size() ||
      !absl::EqualsIgnoreCase(authorization.substr(0, kScheme.size()), kScheme)) {
    return Unauthenticated("the authorization is not of the form \"Bearer <token>\"");
  }
  const Digest digest = Sha256(absl::StripAsciiWhitespace(authorization.substr(kScheme.size())));
  // Compare with every token, whatever matches, so the time taken tells nothing.
  const std::shared_ptr<const std::vector<Entry>> table = entries();
  const Entry* match = nullptr;
  for (const Entry& e : *table) {
    const bool equal = CRYPTO_memcmp(e.digest.data(), digest.data(), digest.size()) == 0;
    match = equal ? &e : match;
  }
  if (match == nullptr) return Unauthenticated("the token is not valid");
  Grant grant;
  grant.client_ = match->client;
  return grant;
}

absl::StatusOr<TokenAuthenticator::Grant> TokenAuthenticator::Admit(
    std::string_view authorization) {
  ASSIGN_OR_RETURN(Grant grant, Authenticate(authorization));
  Client& client = *grant.client_;
  const int limit = client.max_concurrent.load();
  if (limit == 0) {
    client.in_flight.fetch_add(1);
  } else {
    int current = client.in_flight.load();
    do {
      if (current >= limit) {
        return absl::ResourceExhaustedError(
            absl::StrCat("client \"", client.name, "\" already has ", current,
                         " generations running, its limit; retry when one has finished"));
      }
    } while (!client.in_flight.compare_exchange_weak(current, current + 1));
  }
  grant.holds_slot_ = true;
  return grant;
}

}  // namespace conveyor::scheduler
