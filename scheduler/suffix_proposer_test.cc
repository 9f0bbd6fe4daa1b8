#include "scheduler/suffix_proposer.h"

#include <random>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

std::vector<int32_t> Propose(const std::vector<int32_t>& t, int min_match, int k) {
  SuffixIndex index;
  index.Extend(t);
  return index.Propose(t, min_match, k);
}

TEST(SuffixIndexTest, ProposesWhatFollowedTheLongestRepeatedSuffix) {
  // "1 2 3" repeats (first at 0, then 4); the shorter "2 3" and "3" also occur at 6-7,
  // but the longest repeat decides.
  const std::vector<int32_t> t = {1, 2, 3, 4, 5, 9, 2, 3, 7, 1, 2, 3};
  EXPECT_THAT(Propose(t, 1, 3), ElementsAre(4, 5, 9));
  EXPECT_THAT(Propose(t, 3, 2), ElementsAre(4, 5));
  EXPECT_THAT(Propose(t, 4, 2), IsEmpty());  // The repeat is 3 tokens long.
  EXPECT_THAT(Propose(t, 1, 0), IsEmpty());
  EXPECT_THAT(Propose({}, 1, 3), IsEmpty());
  EXPECT_THAT(Propose({5}, 1, 3), IsEmpty());
  EXPECT_THAT(Propose({1, 2, 3, 4}, 1, 3), IsEmpty());
}

TEST(SuffixIndexTest, GrowsWithTheSequence) {
  SuffixIndex index;
  std::vector<int32_t> t = {8, 6, 7, 5, 3, 0, 9};
  index.Extend(t);
  EXPECT_EQ(index.size(), 7);
  t.insert(t.end(), {8, 6});
  index.Extend(t);
  EXPECT_THAT(index.Propose(t, 2, 4), ElementsAre(7, 5, 3, 0));
  t.push_back(7);
  index.Extend(t);
  EXPECT_THAT(index.Propose(t, 2, 4), ElementsAre(5, 3, 0, 9));
}

// Against a brute force on random sequences over small alphabets (many repeats), grown
// token by token as a request's output grows.
TEST(SuffixIndexTest, MatchesABruteForce) {
  std::mt19937 rng(5);
  for (int trial = 0; trial < 300; ++trial) {
    const int alphabet = 2 + static_cast<int>(rng() % 5);
    SuffixIndex index;
    std::vector<int32_t> t;
    for (int len = 1; len <= 60; ++len) {
      t.push_back(static_cast<int32_t>(rng() % alphabet) * 1000003);  // Large ids too.
      index.Extend(t);
      const int min_match = 1 + static_cast<int>(rng() % 3);
      const int k = 1 + static_cast<int>(rng() % 5);
      // The longest suffix that also ends before the last token; its first occurrence.
      std::vector<int32_t> want;
      for (int l = len - 1; l >= min_match && want.empty(); --l) {
        for (int i = 0; i + l < len && want.empty(); ++i) {
          if (std::equal(t.end() - l, t.end(), t.begin() + i)) {
            want.assign(t.begin() + i + l, t.begin() + std::min(len, i + l + k));
          }
        }
      }
      ASSERT_EQ(index.Propose(t, min_match, k), want) << "trial " << trial << " length " << len;
    }
  }
}

}  // namespace
}  // namespace conveyor::scheduler
