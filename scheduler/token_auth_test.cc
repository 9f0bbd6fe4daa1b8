#include "scheduler/token_auth.h"

#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/test_temp_dir.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using Auth = TokenAuthenticator;

constexpr char kAlice[] = "alice-token-0123456789";
constexpr char kBob[] = "bob-token-abcdefghijkl";

class TokenAuthTest : public ::testing::Test {
 protected:
  std::string Write(const std::string& text) {
    std::ofstream(path_) << text;
    return path_;
  }
  absl::StatusOr<std::unique_ptr<Auth>> Make(const std::string& text, int default_limit = 0) {
    Auth::Options options;
    options.tokens_file = Write(text);
    options.default_max_concurrent = default_limit;
    options.reload_interval = std::chrono::milliseconds(0);
    return Auth::Create(options);
  }

  TestTempDir dir_;
  std::string path_ = dir_.path() + "/tokens";
};

TEST_F(TokenAuthTest, AcceptsListedTokensAndNamesTheClient) {
  auto auth = Make(absl::StrCat("# clients\n", kAlice, " alice\n\n  ", kBob, "   # no name\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  auto alice = (*auth)->Authenticate(absl::StrCat("Bearer ", kAlice));
  ASSERT_TRUE(alice.ok()) << alice.status();
  EXPECT_EQ(alice->client(), "alice");
  auto bob = (*auth)->Authenticate(absl::StrCat("bearer ", kBob));  // Scheme: any case.
  ASSERT_TRUE(bob.ok()) << bob.status();
  EXPECT_EQ(bob->client(), "client-4");
}

TEST_F(TokenAuthTest, RefusesMissingMalformedAndUnknownTokens) {
  auto auth = Make(absl::StrCat(kAlice, "\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  for (const std::string& header :
       {std::string(), std::string(kAlice), absl::StrCat("Basic ", kAlice), std::string("Bearer "),
        absl::StrCat("Bearer ", kBob), absl::StrCat("Bearer ", kAlice, "x"),
        absl::StrCat("Bearer ", std::string(kAlice).substr(1))}) {
    auto grant = (*auth)->Authenticate(header);
    EXPECT_EQ(grant.status().code(), absl::StatusCode::kUnauthenticated) << "\"" << header << "\"";
    // The message says what to send, and never echoes the token.
    EXPECT_NE(grant.status().message().find("Bearer <token>"), std::string::npos);
    EXPECT_EQ(grant.status().message().find(kAlice), std::string::npos);
  }
}

TEST_F(TokenAuthTest, BadFilesAreErrorsNamingTheLine) {
  struct Case {
    std::string text;
    std::string expected;
  };
  for (const Case& c : std::vector<Case>{
           {"short\n", ":1: the token is shorter than 16"},
           {absl::StrCat(kAlice, " a 1 extra\n"), ":1: too many fields"},
           {absl::StrCat(kAlice, " a -1\n"), ":1: max_concurrent must be"},
           {absl::StrCat(kAlice, " a\n", kBob, " a\n"), ":2: the name \"a\" is already used"},
           {absl::StrCat(kAlice, " a\n", kAlice, " b\n"), ":2: the same token is listed twice"},
           {"# only a comment\n", "lists no token"},
       }) {
    auto auth = Make(c.text);
    ASSERT_FALSE(auth.ok()) << c.text;
    EXPECT_EQ(auth.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(auth.status().message().find(c.expected), std::string::npos) << auth.status();
  }
  Auth::Options options;
  options.tokens_file = dir_.path() + "/missing";
  EXPECT_EQ(Auth::Create(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(TokenAuthTest, AdmitCapsConcurrentCallsPerTokenAndReleasesSlots) {
  auto auth = Make(absl::StrCat(kAlice, " alice 2\n", kBob, " bob\n"), /*default_limit=*/1);
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string alice = absl::StrCat("Bearer ", kAlice);
  const std::string bob = absl::StrCat("Bearer ", kBob);
  auto a1 = (*auth)->Admit(alice);
  auto a2 = (*auth)->Admit(alice);
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = (*auth)->Admit(alice);
  EXPECT_EQ(a3.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(a3.status().message().find("\"alice\""), std::string::npos);
  // Bob has the server-wide default of 1; his limit is his own.
  auto b1 = (*auth)->Admit(bob);
  ASSERT_TRUE(b1.ok());
  EXPECT_EQ((*auth)->Admit(bob).status().code(), absl::StatusCode::kResourceExhausted);
  // Authenticate (Tokenize, GetModelInfo) takes no slot.
  EXPECT_TRUE((*auth)->Authenticate(bob).ok());
  a1->Release();
  EXPECT_TRUE((*auth)->Admit(alice).ok());  // Released again at once (a temporary).
  { Auth::Grant moved = std::move(*b1); }   // Destroyed: released.
  EXPECT_TRUE((*auth)->Admit(bob).ok());
}

TEST_F(TokenAuthTest, ConcurrentAdmitsNeverExceedTheLimit) {
  auto auth = Make(absl::StrCat(kAlice, " alice 3\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string alice = absl::StrCat("Bearer ", kAlice);
  std::atomic<int> held{0};
  std::atomic<int> most{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 2000; ++i) {
        auto grant = (*auth)->Admit(alice);
        if (!grant.ok()) continue;
        const int now = held.fetch_add(1) + 1;
        int seen = most.load();
        while (now > seen && !most.compare_exchange_weak(seen, now)) {
        }
        held.fetch_sub(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_LE(most.load(), 3);
  EXPECT_GE(most.load(), 1);
}

TEST_F(TokenAuthTest, ReloadsAChangedFileAndKeepsTheOldTokensWhenItIsBad) {
  auto auth = Make(absl::StrCat(kAlice, " alice 1\n"));
  ASSERT_TRUE(auth.ok()) << auth.status();
  const std::string alice = absl::StrCat("Bearer ", kAlice);
  const std::string bob = absl::StrCat("Bearer ", kBob);
  auto held = (*auth)->Admit(alice);
  ASSERT_TRUE(held.ok());

  // Rotation: bob is added; alice keeps her name, so her call in flight still counts.
  Write(absl::StrCat(kAlice, " alice 1\n", kBob, " bob\n"));
  ASSERT_TRUE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Authenticate(bob).ok());
  EXPECT_EQ((*auth)->Admit(alice).status().code(), absl::StatusCode::kResourceExhausted);

  // A broken file is refused and the tokens in force stay.
  Write("broken\n");
  EXPECT_FALSE((*auth)->ReloadIfChanged().ok());
  EXPECT_TRUE((*auth)->Authenticate(bob).ok());

  // Revocation: a token taken out of the file is refused on the next call (the reload
  // interval is 0 here).
  Write(absl::StrCat(kBob, " bob\n"));
  EXPECT_EQ((*auth)->Authenticate(alice).status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE((*auth)->Authenticate(bob).ok());
}

}  // namespace
}  // namespace conveyor::scheduler
