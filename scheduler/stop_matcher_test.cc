#include "scheduler/stop_matcher.h"

#include <ostream>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"

namespace conveyor::scheduler {

// Found by argument-dependent lookup, so it sits in Result's namespace.
void PrintTo(const StopMatcher::Result& result, std::ostream* os) {
  *os << "{\"" << result.emit << "\", " << (result.stopped ? "stopped" : "running") << "}";
}

namespace {

using Result = StopMatcher::Result;

TEST(StopMatcherTest, EmitsEverythingWithoutStopStrings) {
  StopMatcher matcher({});
  EXPECT_EQ(matcher.Feed("hello "), (Result{"hello ", false}));
  EXPECT_EQ(matcher.Feed("wörld"), (Result{"wörld", false}));
  EXPECT_EQ(matcher.Flush(), "");
  EXPECT_FALSE(matcher.stopped());
}

TEST(StopMatcherTest, IgnoresEmptyStopStrings) {
  StopMatcher matcher({"", "zz"});
  EXPECT_EQ(matcher.Feed("abc"), (Result{"abc", false}));
  EXPECT_EQ(matcher.Feed("xzz"), (Result{"x", true}));
}

TEST(StopMatcherTest, StopStringSpansFeeds) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Feed("go ST"), (Result{"go ", false}));
  EXPECT_EQ(matcher.Feed("O"), (Result{"", false}));
  EXPECT_EQ(matcher.Feed("P and the rest"), (Result{"", true}));
  EXPECT_TRUE(matcher.stopped());
  EXPECT_EQ(matcher.Feed("more"), (Result{"", true}));
  EXPECT_EQ(matcher.Flush(), "");
}

TEST(StopMatcherTest, StopsWithinOneFeed) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Feed("go STOP STOP"), (Result{"go ", true}));
}

TEST(StopMatcherTest, StopStringAtTheVeryBeginning) {
  StopMatcher matcher({"<end>"});
  EXPECT_EQ(matcher.Feed("<end>tail"), (Result{"", true}));
}

TEST(StopMatcherTest, ReleasesAPrefixOnceItCannotComplete) {
  StopMatcher matcher({"STOP"});
  EXPECT_EQ(matcher.Feed("a STO"), (Result{"a ", false}));
  EXPECT_EQ(matcher.Feed("NE "), (Result{"STONE ", false}));
  EXPECT_EQ(matcher.Feed("ST"), (Result{"", false}));
  EXPECT_EQ(matcher.Flush(), "ST");
}

TEST(StopMatcherTest, LongerCandidateDoesNotHideShorterStop) {
  StopMatcher matcher({"abc", "ab"});
  EXPECT_EQ(matcher.Feed("xa"), (Result{"x", false}));
  EXPECT_EQ(matcher.Feed("bc"), (Result{"", true}));
}

TEST(StopMatcherTest, ShorterCandidateDoesNotReleaseLonger) {
  StopMatcher matcher({"abc", "xyz"});
  EXPECT_EQ(matcher.Feed("-ab"), (Result{"-", false}));
  EXPECT_EQ(matcher.Feed("d"), (Result{"abd", false}));
  EXPECT_EQ(matcher.Feed("ab"), (Result{"", false}));
  EXPECT_EQ(matcher.Feed("c"), (Result{"", true}));
}

TEST(StopMatcherTest, SelfOverlappingStopString) {
  StopMatcher matcher({"aab"});
  EXPECT_EQ(matcher.Feed("aa"), (Result{"", false}));
  EXPECT_EQ(matcher.Feed("a"), (Result{"a", false}));
  EXPECT_EQ(matcher.Feed("b"), (Result{"", true}));
}

TEST(StopMatcherTest, FirstCompletedStopStringWins) {
  StopMatcher matcher({"world", "lo w"});
  EXPECT_EQ(matcher.matched(), "");
  EXPECT_EQ(matcher.Feed("hello world"), (Result{"hel", true}));
  EXPECT_EQ(matcher.matched(), "lo w");
}

TEST(StopMatcherTest, LongerStopStringWinsATie) {
  StopMatcher matcher({"bc", "abc"});
  EXPECT_EQ(matcher.Feed("xabc"), (Result{"x", true}));
  EXPECT_EQ(matcher.matched(), "abc");
}

TEST(StopMatcherTest, MultiByteStopString) {
  StopMatcher matcher({"世界", "🚀!"});
  EXPECT_EQ(matcher.Feed("你好"), (Result{"你好", false}));
  EXPECT_EQ(matcher.Feed("世"), (Result{"", false}));
  EXPECT_EQ(matcher.Feed("🚀"), (Result{"世", false}));
  EXPECT_EQ(matcher.Feed("世界 more"), (Result{"🚀", true}));
}

TEST(StopMatcherTest, MultiBytePrefixIsReleased) {
  StopMatcher matcher({"好吗"});
  EXPECT_EQ(matcher.Feed("你好"), (Result{"你", false}));
  EXPECT_EQ(matcher.Feed("世界"), (Result{"好世界", false}));
  EXPECT_EQ(matcher.Feed("好"), (Result{"", false}));
  EXPECT_EQ(matcher.Flush(), "好");
}

// "\xA9" is the last byte of "é" (C3 A9); a cut there would leave half a character.
TEST(StopMatcherTest, StopStringStartingMidCharacterNeverSplitsIt) {
  StopMatcher stops_at_byte({"\xA9"});
  EXPECT_EQ(stops_at_byte.Feed("caf"), (Result{"caf", false}));
  EXPECT_EQ(stops_at_byte.Feed("é!"), (Result{"", true}));

  StopMatcher holds_byte({"\xA9x"});
  EXPECT_EQ(holds_byte.Feed("café"), (Result{"caf", false}));
  EXPECT_EQ(holds_byte.Flush(), "é");
}

// What the matcher should have emitted after seeing `text`: all of it up to the first
// completed stop string, less any tail that is a proper prefix of a stop string.
Result Expected(std::string_view text, const std::vector<std::string>& stops) {
  for (size_t end = 1; end <= text.size(); ++end) {
    size_t start = std::string::npos;
    for (const std::string& stop : stops) {
      if (stop.size() <= end && text.substr(0, end).ends_with(stop)) {
        start = std::min(start, end - stop.size());
      }
    }
    if (start != std::string::npos) return {std::string(text.substr(0, start)), true};
  }
  for (size_t held = text.size(); held > 0; --held) {
    for (const std::string& stop : stops) {
      if (stop.size() > held && stop.starts_with(text.substr(text.size() - held))) {
        return {std::string(text.substr(0, text.size() - held)), false};
      }
    }
  }
  return {std::string(text), false};
}

TEST(StopMatcherTest, RandomTextInRandomPiecesMatchesReference) {
  const std::vector<std::string> alphabet = {"a", "b", "c", " ", "é", "你", "🚀"};
  std::mt19937 rng(42);
  auto uniform = [&rng](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
  auto random_text = [&](int min_chars, int max_chars) {
    std::string text;
    for (int i = uniform(min_chars, max_chars); i > 0; --i) {
      text += alphabet[uniform(0, static_cast<int>(alphabet.size()) - 1)];
    }
    return text;
  };
  for (int round = 0; round < 5000; ++round) {
    std::vector<std::string> stops;
    for (int i = uniform(0, 3); i > 0; --i) stops.push_back(random_text(1, 4));
    // Pieces of whole characters, as the detokenizer emits them.
    std::vector<std::string> pieces;
    for (int i = uniform(0, 12); i > 0; --i) pieces.push_back(random_text(0, 3));
    SCOPED_TRACE(absl::StrCat("stops: [", absl::StrJoin(stops, "|"), "] pieces: [",
                              absl::StrJoin(pieces, "|"), "]"));

    StopMatcher matcher(stops);
    std::string fed;
    std::string emitted;
    bool stopped = false;
    for (const std::string& piece : pieces) {
      fed += piece;
      const Result result = matcher.Feed(piece);
      emitted += result.emit;
      const Result expected = Expected(fed, stops);
      EXPECT_EQ((Result{emitted, result.stopped}), expected);
      stopped = expected.stopped;
      if (stopped) break;
    }
    if (!stopped) {
      EXPECT_EQ(emitted + matcher.Flush(), fed);
    }
    if (HasFailure()) break;
  }
}

}  // namespace
}  // namespace conveyor::scheduler
