#include "scheduler/ngram_proposer.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(NgramProposerTest, ProposesWhatFollowedTheLatestEarlierOccurrence) {
  const std::vector<int32_t> t = {5, 6, 7, 8, 9, 1, 6, 7, 2, 3, 6, 7};
  // "6 7" occurred at 1 (then 8 9 1) and at 6 (then 2 3 6): the latest wins.
  EXPECT_THAT(ProposeNgram(t, {2, 2}, 3), ElementsAre(2, 3, 6));
  // Fewer tokens than k follow: what there is.
  EXPECT_THAT(ProposeNgram(t, {2, 2}, 10), ElementsAre(2, 3, 6, 7));
  EXPECT_THAT(ProposeNgram(t, {2, 2}, 0), IsEmpty());
}

TEST(NgramProposerTest, LongerSuffixesFirst) {
  // "1 2" last occurred at 5 (then 9); "0 1 2" only at 0 (then 3): max_n 3 prefers it.
  const std::vector<int32_t> t = {0, 1, 2, 3, 4, 1, 2, 9, 0, 1, 2};
  EXPECT_THAT(ProposeNgram(t, {2, 3}, 2), ElementsAre(3, 4));
  EXPECT_THAT(ProposeNgram(t, {2, 2}, 2), ElementsAre(9, 0));
}

TEST(NgramProposerTest, NothingWithoutAMatch) {
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{1, 2, 3, 4}, {1, 3}, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{}, {1, 3}, 4), IsEmpty());
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{7}, {1, 3}, 4), IsEmpty());
  // min_n 2: a repeated single token is not enough.
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{3, 1, 2, 3}, {2, 3}, 4), IsEmpty());
}

TEST(NgramProposerTest, ARunProposesMoreOfItself) {
  // The latest earlier "4 4" starts at 1: one token follows it; in the second, at 2.
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{4, 4, 4, 4}, {1, 2}, 3), ElementsAre(4));
  EXPECT_THAT(ProposeNgram(std::vector<int32_t>{4, 4, 4, 4, 5, 4, 4}, {2, 2}, 3),
              ElementsAre(5, 4, 4));
}

// Against a brute force over random short alphabets (many matches).
TEST(NgramProposerTest, MatchesABruteForce) {
  std::mt19937 rng(3);
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<int32_t> t(rng() % 40);
    for (int32_t& v : t) v = static_cast<int32_t>(rng() % 4);
    const int min_n = 1 + static_cast<int>(rng() % 3);
    const NgramOptions options{min_n, min_n + static_cast<int>(rng() % 3)};
    const int k = 1 + static_cast<int>(rng() % 6);
    std::vector<int32_t> want;
    const int len = static_cast<int>(t.size());
    for (int n = options.max_n; n >= options.min_n && want.empty(); --n) {
      if (n >= len) continue;
      for (int i = len - n - 1; i >= 0 && want.empty(); --i) {
        bool same = true;
        for (int j = 0; j < n; ++j) same = same && t[i + j] == t[len - n + j];
        if (same) {
          for (int j = i + n; j < std::min(len, i + n + k); ++j) want.push_back(t[j]);
        }
      }
    }
    EXPECT_EQ(ProposeNgram(t, options, k), want) << "trial " << trial;
  }
}

}  // namespace
}  // namespace conveyor::scheduler
