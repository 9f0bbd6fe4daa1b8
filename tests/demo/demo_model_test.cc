// The committed demo model (demo/model, trained by demo/train.py) served by real
// conveyor-worker and conveyor-scheduler processes: its greedy continuation must be
// English (at least 90 % of its words in Debian's word list, package wamerican, and not
// a loop over a handful of them), and seeded sampling must be reproducible, vary with the
// seed and differ from greedy. Served with its draft model (demo/draft) for speculative
// decoding, the texts are the same and the draft's proposals are kept.
//
// CONVEYOR_DEMO_MODEL_DIR overrides the model directory, e.g. to see a random-weight
// checkpoint from tests/model_gen/make_test_model.py fail the word check.
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "conveyor.grpc.pb.h"
#include "gtest/gtest.h"
#include "tests/support/server_process.h"

namespace conveyor::testing {
namespace {

constexpr char kWordList[] = "/usr/share/dict/american-english";
// Greedy decoding of a model this small soon loops; this prompt's continuation stays
// varied for its 64 tokens.
constexpr char kPrompt[] = "In the beginning God created the heaven and the earth.";
constexpr int kNewTokens = 64;
// A text that loops over fewer words ("and thy servant, and thy servant, ...") is not
// readable English, however well each word spells.
constexpr size_t kMinDistinctWords = 12;

std::string DemoModelDir() {
  const char* dir = std::getenv("CONVEYOR_DEMO_MODEL_DIR");
  return dir != nullptr ? dir : CONVEYOR_DEMO_MODEL_DIR_DEFAULT;
}

std::string DemoDraftDir() {
  const char* dir = std::getenv("CONVEYOR_DEMO_DRAFT_DIR");
  return dir != nullptr ? dir : CONVEYOR_DEMO_DRAFT_DIR_DEFAULT;
}

// The runs of ASCII letters in `text`, lower-cased: "LORD's" gives "lord" and "s".
std::vector<std::string> Words(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  for (const char c : text + ' ') {
    if (std::isalpha(static_cast<unsigned char>(c))) {
      word += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    } else if (!word.empty()) {
      words.push_back(word);
      word.clear();
    }
  }
  return words;
}

// Every word of the word list, split the same way (so "Aaron's" also admits "s").
std::set<std::string> Dictionary() {
  std::ifstream in(kWordList);
  std::set<std::string> words;
  for (std::string line; std::getline(in, line);) {
    for (std::string& w : Words(line)) words.insert(std::move(w));
  }
  return words;
}

v1::GenerateRequest Request(float temperature, float top_p, uint64_t seed) {
  v1::GenerateRequest r;
  r.set_text(kPrompt);
  r.set_max_new_tokens(kNewTokens);
  r.set_ignore_eos(true);  // Always kNewTokens tokens, so every check sees a full text.
  r.set_temperature(temperature);
  if (temperature > 0) {
    r.set_top_p(top_p);
    r.set_seed(seed);
  }
  return r;
}

class DemoModelTest : public ::testing::Test {
 protected:
  // One server for every test: start-up dominates the run time. The flag given here
  // comes after Server's own --model, and the last occurrence of a flag wins.
  static void SetUpTestSuite() { server_ = new Server({"--model=" + DemoModelDir()}); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }

  static std::string Text(const v1::GenerateRequest& request) {
    const Stream s = server_->Generate(request);
    EXPECT_TRUE(s.status.ok()) << s.status.error_message();
    EXPECT_EQ(s.tokens.size(), static_cast<size_t>(kNewTokens));
    return s.text;
  }

  static Server* server_;
};

Server* DemoModelTest::server_ = nullptr;

TEST_F(DemoModelTest, GreedyContinuationIsEnglish) {
  ASSERT_TRUE(server_->WaitReady());
  const std::set<std::string> dictionary = Dictionary();
  ASSERT_GT(dictionary.size(), 50000u) << kWordList << " is missing (apt-get install wamerican)";

  const std::string text = Text(Request(0, 1, 0));
  const std::vector<std::string> words = Words(text);
  ASSERT_GE(words.size(), 20u) << text;
  int known = 0;
  std::string unknown;
  for (const std::string& w : words) {
    if (dictionary.count(w) != 0) {
      ++known;
    } else {
      unknown += " " + w;
    }
  }
  const double fraction = static_cast<double>(known) / words.size();
  std::cout << "greedy: " << kPrompt << text << "\nin the word list: " << known << "/"
            << words.size() << " (" << fraction << "); not:" << unknown << "\n";
  EXPECT_GE(fraction, 0.9) << text;
  EXPECT_GE(std::set<std::string>(words.begin(), words.end()).size(), kMinDistinctWords) << text;
}

TEST_F(DemoModelTest, SeededSamplingIsReproducibleAndVaries) {
  ASSERT_TRUE(server_->WaitReady());
  const std::string greedy = Text(Request(0, 1, 0));
  const std::string first = Text(Request(0.8f, 0.95f, 1));
  const std::string again = Text(Request(0.8f, 0.95f, 1));
  const std::string other = Text(Request(0.8f, 0.95f, 2));
  std::cout << "seed 1: " << kPrompt << first << "\nseed 2: " << kPrompt << other << "\n";
  EXPECT_EQ(first, again) << "the same seed must give the same text";
  EXPECT_NE(first, other) << "different seeds gave the same text";
  EXPECT_NE(first, greedy) << "sampling gave the greedy text";
}

TEST_F(DemoModelTest, ServedWithItsDraftModelTheTextsAreTheSame) {
  ASSERT_TRUE(server_->WaitReady());
  Server speculative({"--model=" + DemoModelDir(), "--speculative_method=draft",
                      "--speculative_model=" + DemoDraftDir(), "--num_speculative_tokens=4"});
  ASSERT_TRUE(speculative.WaitReady());
  for (const v1::GenerateRequest& request : {Request(0, 1, 0), Request(0.8f, 0.95f, 1)}) {
    const Stream plain = server_->Generate(request);
    const Stream drafted = speculative.Generate(request);
    ASSERT_TRUE(drafted.status.ok()) << drafted.status.error_message();
    EXPECT_EQ(drafted.tokens, plain.tokens) << "temperature " << request.temperature();
    EXPECT_EQ(drafted.text, plain.text);
  }
  const double drafted = speculative.Metric("conveyor_spec_draft_tokens_total");
  const double kept = speculative.Metric("conveyor_spec_accepted_tokens_total");
  std::cout << "draft tokens " << drafted << ", kept " << kept << "\n";
  EXPECT_GT(kept, 0) << "the draft model's proposals were never kept";
}

}  // namespace
}  // namespace conveyor::testing
