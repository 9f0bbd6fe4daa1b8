#include "text/bounded_json.h"

#include <random>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;

// A random document with its true depth and value count (counted as the generator
// builds it, independently of the scanner): strings full of brackets, quotes and
// backslashes, so a scanner that miscounts inside strings gets a different depth.
struct Generated {
  std::string text;
  int depth = 0;
  size_t values = 0;
};

class Generator {
 public:
  explicit Generator(uint32_t seed) : rng_(seed) {}

  Generated Make(int max_depth) {
    Generated g;
    Value(0, max_depth, &g);
    return g;
  }

 private:
  int Pick(int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng_); }

  void String(std::string* out) {
    static constexpr const char* kPieces[] = {"[", "]", "{", "}",       "\\\"", "\\\\", ",",
                                              ":", "a", " ", "\\u005b", "\\n",  "é"};
    *out += '"';
    for (int i = Pick(6); i > 0; --i) *out += kPieces[Pick(std::size(kPieces))];
    *out += '"';
  }

  void Value(int depth, int max_depth, Generated* g) {
    ++g->values;
    g->depth = std::max(g->depth, depth);
    // Containers twice as likely as scalars below the maximum, so documents get deep.
    const int kind = depth >= max_depth ? Pick(3) : Pick(7);
    switch (kind) {
      case 0:
        String(&g->text);
        return;
      case 1:
        g->text += std::to_string(Pick(1000) - 500);
        return;
      case 2:
        g->text += Pick(2) ? "true" : "null";
        return;
      case 3:
      case 4: {
        g->text += '[';
        for (int i = 0, n = Pick(4); i < n; ++i) {
          if (i > 0) g->text += ',';
          Value(depth + 1, max_depth, g);
        }
        g->text += ']';
        g->depth = std::max(g->depth, depth + 1);
        return;
      }
      default: {
        g->text += '{';
        for (int i = 0, n = Pick(4); i < n; ++i) {
          if (i > 0) g->text += ',';
          String(&g->text);
          g->text += ':';
          Value(depth + 1, max_depth, g);
        }
        g->text += '}';
        g->depth = std::max(g->depth, depth + 1);
        return;
      }
    }
  }

  std::mt19937 rng_;
};

TEST(BoundedJsonTest, AgreesWithTheGeneratorsDepthAndWithNlohmannsParse) {
  Generator generator(7);
  int refused = 0;
  for (int i = 0; i < 3000; ++i) {
    const Generated g = generator.Make(1 + i % 12);
    const JsonLimits limits{.max_depth = 1 + i % 9, .max_values = 1 << 20};
    const absl::StatusOr<Json> parsed = ParseBoundedJson(g.text, limits, "doc");
    ASSERT_EQ(parsed.ok(), g.depth <= limits.max_depth)
        << g.text << " depth " << g.depth << " limit " << limits.max_depth << ": "
        << parsed.status();
    if (parsed.ok()) {
      EXPECT_EQ(*parsed, Json::parse(g.text)) << g.text;
    } else {
      ++refused;
      EXPECT_THAT(parsed.status().message(), HasSubstr("levels deep"));
    }
  }
  EXPECT_GT(refused, 150);  // Both verdicts are well covered.
  EXPECT_LT(refused, 2700);
}

TEST(BoundedJsonTest, ValueCountIsAnUpperBoundThatRefusesOnlyLargeDocuments) {
  Generator generator(11);
  for (int i = 0; i < 2000; ++i) {
    const Generated g = generator.Make(6);
    // Never refused at the true count plus one per container ("[]" counts one too many).
    const JsonLimits generous{.max_depth = 64, .max_values = 2 * g.values};
    EXPECT_TRUE(CheckJsonBounds(g.text, generous, "doc").ok()) << g.text;
    if (g.values > 1) {
      const JsonLimits tight{.max_depth = 64, .max_values = g.values - 1};
      EXPECT_FALSE(CheckJsonBounds(g.text, tight, "doc").ok()) << g.text;
    }
  }
}

TEST(BoundedJsonTest, AHundredThousandLevelsAreRefusedNamingTheLimitWithoutEchoingTheInput) {
  for (const std::string& open : {std::string("["), std::string("{\"a\":")}) {
    std::string body = "{\"prompt\": [1, ";
    for (int i = 0; i < 100000; ++i) body += open;
    const absl::StatusOr<Json> parsed = ParseBoundedJson(body, JsonLimits{}, "the request body");
    ASSERT_FALSE(parsed.ok());
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(parsed.status().message(),
                HasSubstr("the request body nests arrays and objects more than 64 levels deep"));
    EXPECT_LT(parsed.status().message().size(), 200u);
  }
}

TEST(BoundedJsonTest, ExactlyTheLimitIsAccepted) {
  std::string at_limit(64, '[');
  at_limit += std::string(64, ']');
  EXPECT_TRUE(ParseBoundedJson(at_limit, JsonLimits{}, "doc").ok());
  const std::string over = "[" + at_limit + "]";
  EXPECT_FALSE(ParseBoundedJson(over, JsonLimits{}, "doc").ok());
}

TEST(BoundedJsonTest, BracketsInsideStringsDoNotCount) {
  const std::string text = R"({"a": "[[[[[[[[[[\"[[[[\\", "b": ["]]]]{{{{"]})";
  const absl::StatusOr<Json> parsed =
      ParseBoundedJson(text, JsonLimits{.max_depth = 2, .max_values = 100}, "doc");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ((*parsed)["a"], "[[[[[[[[[[\"[[[[\\");
}

TEST(BoundedJsonTest, SyntaxErrorsSayWhere) {
  const absl::StatusOr<Json> parsed =
      ParseBoundedJson(R"({"a": [1, 2,, 3]})", JsonLimits{}, "the request body");
  ASSERT_FALSE(parsed.ok());
  EXPECT_THAT(parsed.status().message(),
              HasSubstr("the request body is not valid JSON (a syntax error at byte 13)"));
}

TEST(BoundedJsonTest, ANulByteIsNeverJson) {
  // nlohmann alone would accept "1" and ignore the rest.
  using std::string_view_literals::operator""sv;
  for (const std::string_view text : {"1\0[[["sv, "{\"a\": \"x\0\"}"sv}) {
    const absl::StatusOr<Json> parsed = ParseBoundedJson(text, JsonLimits{}, "doc");
    ASSERT_FALSE(parsed.ok());
    EXPECT_THAT(parsed.status().message(), HasSubstr("a NUL byte"));
  }
}

TEST(BoundedJsonTest, ExcerptsAreCutAndSayHowLongTheValueWas) {
  const Json big = std::string(100000, 'x');
  const std::string excerpt = JsonExcerpt(big, 40);
  EXPECT_LT(excerpt.size(), 80u);
  EXPECT_THAT(excerpt, HasSubstr("100002 bytes in all"));
  EXPECT_EQ(JsonExcerpt(Json::array({1, 2})), "[1,2]");
  // A cut never splits a UTF-8 character.
  EXPECT_THAT(JsonExcerpt(Json("ééééééééééééééé"), 6), ::testing::StartsWith("\"éé… ("));
}

}  // namespace
}  // namespace conveyor
