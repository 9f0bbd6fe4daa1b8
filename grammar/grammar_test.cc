// The grammar form and the matcher. The matcher (a pushdown automaton fed byte by byte)
// is checked against an independent reference: a memoised top-down parser over whole
// strings of code points, on sentences drawn at random from each grammar and on their
// mutations. Parse errors are checked to name what is wrong.
#include "grammar/grammar.h"

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "grammar/matcher.h"
#include "grammar/test_util.h"
#include "grammar/token_mask.h"
#include "gtest/gtest.h"

namespace conveyor::grammar {
namespace {

using ::testing::HasSubstr;

// Whether `s` is a sentence, or the start of one: the set of positions each rule can end
// at from each start, memoised. Independent of the matcher: it reads whole strings, top
// down. For prefixes, running out of input while a rule still wants characters counts
// as the position past the end (every rule derives some finite string, so the rest can
// always be completed).
class Reference {
 public:
  Reference(const Grammar& grammar, std::u32string s) : g_(grammar), s_(std::move(s)) {}
  bool Accepts() { return Ends(g_.root(), 0).contains(s_.size()); }
  bool IsPrefix() {
    const std::set<size_t>& ends = Ends(g_.root(), 0);
    return ends.contains(s_.size()) || ends.contains(s_.size() + 1);
  }

 private:
  const std::set<size_t>& Ends(int rule, size_t pos) {
    if (pos > s_.size()) return past_end_;
    auto key = std::make_pair(rule, pos);
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    std::set<size_t> ends;
    for (const Sequence& alternative : g_.rules()[rule].alternatives) {
      SequenceEnds(alternative, 0, pos, &ends);
    }
    return memo_[key] = std::move(ends);
  }
  void SequenceEnds(const Sequence& seq, size_t k, size_t pos, std::set<size_t>* out) {
    if (k == seq.size()) {
      out->insert(pos);
      return;
    }
    if (pos > s_.size()) {
      out->insert(pos);  // Already past the end: the rest is the completion.
      return;
    }
    const Element& e = seq[k];
    if (e.kind == Element::Kind::kChars) {
      if (pos == s_.size()) {
        out->insert(pos + 1);
      } else if (std::any_of(e.chars.begin(), e.chars.end(), [&](const CharRange& r) {
                   return r.lo <= s_[pos] && s_[pos] <= r.hi;  // Not Element::Matches.
                 })) {
        SequenceEnds(seq, k + 1, pos + 1, out);
      }
      return;
    }
    const std::set<size_t> ends = Ends(e.rule, pos);  // A copy: memo_ may rehash.
    for (size_t end : ends) SequenceEnds(seq, k + 1, end, out);
  }

  const Grammar& g_;
  std::u32string s_;
  std::map<std::pair<int, size_t>, std::set<size_t>> memo_;
  std::set<size_t> past_end_{s_.size() + 1};
};

Grammar MustParse(const std::string& text) {
  absl::StatusOr<Grammar> g = Grammar::Parse(text);
  EXPECT_TRUE(g.ok()) << g.status() << "\n" << text;
  return g.ok() ? *std::move(g) : Grammar();
}

const char* const kJson = R"(# A JSON subset with bounded numbers and whitespace.
root   ::= value
value  ::= object | array | string | number | "true" | "false" | "null"
object ::= "{" ws ( member ( "," ws member )* )? "}"
member ::= string ws ":" ws value ws
array  ::= "[" ws ( value ws ( "," ws value ws )* )? "]"
string ::= "\"" ( [^"\\\x00-\x1f] | "\\" ["\\/bfnrt] )* "\""
number ::= "-"? ( "0" | [1-9] [0-9]{0,3} ) ( "." [0-9]+ )?
ws     ::= [ \t\n]{0,2}
)";

const char* const kUnicode =
    R"(root ::= ( [α-ω] | [一-龥] | "é" | [\U0001F600-\U0001F64F] | [^\x00-\U0010FFFD] )+ ( "!" | "" )
)";

const char* const kCounted = R"(root ::= "a"{2,4} "b"{3} ( "c" | "d" ){0,2} "e"{1,} tail
tail ::= "" |
  "f" tail
)";

const char* const kNullablePrefix = R"(root ::= opt opt "x" root | "y"
opt  ::= "a" | ""
)";

class MatcherDifferentialTest : public ::testing::TestWithParam<const char*> {};

TEST_P(MatcherDifferentialTest, AgreesWithTheReferenceOnDrawnAndMutatedStrings) {
  auto grammar = std::make_shared<const Grammar>(MustParse(GetParam()));
  std::mt19937 rng(42);
  // Code points to mutate with: what the grammar uses, and some it does not.
  std::vector<char32_t> alphabet = {U'x', U'"', U'\\', U'{',    U'}', U'0',
                                    U'a', U'é', U'ω',  0x1F600, U' '};
  int positives = 0, negatives = 0;
  for (int round = 0; round < 2000; ++round) {
    std::optional<std::u32string> drawn = Draw(*grammar, rng, 60);
    if (!drawn.has_value()) continue;
    for (char32_t c : *drawn) alphabet.push_back(c);
    std::u32string s = *drawn;
    if (round % 2 == 1 && !s.empty()) {
      const size_t at = std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng);
      const char32_t c =
          alphabet[std::uniform_int_distribution<size_t>(0, alphabet.size() - 1)(rng)];
      switch (round % 3) {
        case 0:
          s.erase(at, 1);
          break;
        case 1:
          s.insert(s.begin() + at, c);
          break;
        default:
          s[at] = c;
      }
    }
    const bool want = Reference(*grammar, s).Accepts();
    (want ? positives : negatives)++;
    Matcher m(grammar);
    bool all_accepted = true;
    for (size_t i = 0; i < s.size() && all_accepted; ++i) {
      // Character by character, byte by byte: accepted exactly while the text so far can
      // still become a sentence.
      const std::string bytes = Utf8(s.substr(i, 1));
      for (char b : bytes) all_accepted = all_accepted && m.AcceptByte(static_cast<uint8_t>(b));
      ASSERT_EQ(all_accepted, Reference(*grammar, s.substr(0, i + 1)).IsPrefix())
          << "after " << i + 1 << " characters of " << Utf8(s);
    }
    EXPECT_EQ(all_accepted && m.CanEnd(), want) << Utf8(s);
  }
  EXPECT_GT(positives, 100);
  EXPECT_GT(negatives, 20);
}

INSTANTIATE_TEST_SUITE_P(Grammars, MatcherDifferentialTest,
                         ::testing::Values(kJson, kUnicode, kCounted, kNullablePrefix));

TEST(MatcherTest, AcceptsOnlyWhatCanStillBecomeASentence) {
  auto g = std::make_shared<const Grammar>(MustParse(kJson));
  Matcher m(g);
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept(R"({"a": [1, tr)"));
  EXPECT_FALSE(m.CanEnd());
  EXPECT_FALSE(m.Accept("x"));  // Refused, and nothing changed:
  EXPECT_TRUE(m.Accept("ue]}"));
  EXPECT_TRUE(m.CanEnd());
  EXPECT_FALSE(m.CanContinue());  // No whitespace after the root value in this grammar.
  m.Rollback(2);
  EXPECT_FALSE(m.CanEnd());
  EXPECT_TRUE(m.Accept("]}"));
  EXPECT_TRUE(m.CanEnd());
  m.Reset();
  EXPECT_EQ(m.num_accepted(), 0u);
  EXPECT_TRUE(m.Accept("12.5"));
  EXPECT_TRUE(m.CanEnd());
  m.Reset();
  EXPECT_FALSE(m.Accept("12345"));  // Five digits before the point: past {0,3}.
  EXPECT_EQ(m.num_accepted(), 0u);  // A refused Accept takes back its accepted bytes.
}

TEST(MatcherTest, ReadsACharacterByteByByteAndRefusesIllFormedUtf8) {
  auto g = std::make_shared<const Grammar>(MustParse("root ::= [é-ê] \"!\"\n"));  // U+00E9..U+00EA
  Matcher m(g);
  EXPECT_FALSE(m.AcceptByte(0xC4));  // Starts U+0100..U+013F: none allowed.
  EXPECT_TRUE(m.AcceptByte(0xC3));   // Starts U+00C0..U+00FF: é and ê among them.
  EXPECT_FALSE(m.CanEnd());          // Half a character is never a sentence.
  EXPECT_FALSE(m.AcceptByte(0xA8));  // è
  EXPECT_FALSE(m.AcceptByte('!'));   // Not a continuation byte.
  EXPECT_TRUE(m.AcceptByte(0xAA));   // ê
  EXPECT_TRUE(m.Accept("!"));
  EXPECT_TRUE(m.CanEnd());

  auto any = std::make_shared<const Grammar>(MustParse("root ::= [^a]*\n"));
  Matcher n(any);
  for (uint8_t bad : {0xC0, 0xC1, 0xF5, 0xFF, 0x80}) EXPECT_FALSE(n.AcceptByte(bad)) << int{bad};
  EXPECT_TRUE(n.AcceptByte(0xE0));
  EXPECT_FALSE(n.AcceptByte(0x80));  // Overlong.
  EXPECT_TRUE(n.AcceptByte(0xA0));
  n.Reset();
  EXPECT_TRUE(n.AcceptByte(0xED));
  EXPECT_FALSE(n.AcceptByte(0xA0));  // A surrogate.
  n.Reset();
  EXPECT_TRUE(n.AcceptByte(0xF4));
  EXPECT_FALSE(n.AcceptByte(0x90));  // Past U+10FFFF.
}

TEST(MatcherTest, RightRecursionKeepsStacksShort) {
  // A long repetition must not grow the state with its length (the tail call).
  auto g = std::make_shared<const Grammar>(MustParse("root ::= \"[\" [0-9]* \"]\"\n"));
  Matcher m(g);
  EXPECT_TRUE(m.Accept("["));
  for (int i = 0; i < 100000; ++i) ASSERT_TRUE(m.AcceptByte('7'));
  EXPECT_TRUE(m.Accept("]"));
  EXPECT_TRUE(m.CanEnd());
}

TEST(GrammarTest, PrintsWhatItParses) {
  std::mt19937 rng(1);
  for (const char* text : {kJson, kUnicode, kCounted, kNullablePrefix}) {
    const Grammar g = MustParse(text);
    // Printed and read again: the same rules (numbered in another order: by first mention),
    // the same lines once names are settled, and the same sentences.
    const Grammar again = MustParse(g.ToString());
    EXPECT_EQ(again.num_elements(), g.num_elements());
    EXPECT_EQ(again.rules().size(), g.rules().size());
    auto sorted_lines = [](const std::string& text) {
      std::vector<std::string> lines = absl::StrSplit(text, '\n');
      std::sort(lines.begin(), lines.end());
      return lines;
    };
    const std::string printed = again.ToString();
    EXPECT_EQ(sorted_lines(MustParse(printed).ToString()), sorted_lines(printed));
    for (int i = 0; i < 50; ++i) {
      std::optional<std::u32string> s = Draw(g, rng, 40);
      if (s.has_value()) EXPECT_TRUE(Reference(again, *s).Accepts()) << Utf8(*s);
    }
  }
}

TEST(GrammarTest, RefusalsSayWhatAndWhere) {
  const struct {
    const char* text;
    const char* message;
  } cases[] = {
      {"root ::= value\n", "rule value is used but not defined"},
      {"start ::= \"a\"\n", "no rule `root`"},
      {"root ::= \"a\"\nroot ::= \"b\"\n", "rule root is defined twice"},
      {"root ::= root \"a\" | \"b\"\n", "left-recursive"},
      {"root ::= opt root \"a\" | \"b\"\nopt ::= \"\" | \"c\"\n", "left-recursive"},
      {"root ::= \"a\" root\n", "derives no finite string"},
      {"root ::= \"abc\n", "unterminated string literal"},
      {"root ::= [ab\n", "unterminated character class"},
      {"root ::= [z-a]\n", "end is below its start"},
      {"root ::= \"\\q\"\n", "unknown escape \\q"},
      {"root ::= \"\\uD800\"\n", "no Unicode scalar value"},
      {"root ::= * \"a\"\n", "repeats nothing"},
      {"root ::= \"a\"{3,2}\n", "below the minimum"},
      {"root ::= \"a\"{5000}\n", "above the limit of 1000"},
      {"root ::= (\"a\"\n", "grammar 2:1: expected )"},
      {"root \"a\"\n", "expected ::="},
      {"root ::= \"a\" x ::= \"b\"\n", "one rule per line"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<Grammar> g = Grammar::Parse(c.text);
    ASSERT_FALSE(g.ok()) << c.text;
    EXPECT_EQ(g.status().code(), absl::StatusCode::kInvalidArgument) << c.text;
    EXPECT_THAT(g.status().message(), HasSubstr(c.message)) << c.text;
  }
}

TEST(GrammarTest, LimitsAreCheckedBeforeAnythingGrows) {
  std::string deep = "root ::= ";
  for (int i = 0; i < 100; ++i) deep += "(";
  deep += "\"a\"";
  for (int i = 0; i < 100; ++i) deep += ")";
  EXPECT_THAT(Grammar::Parse(deep + "\n").status().message(), HasSubstr("nest deeper than 64"));

  Limits small;
  small.max_elements = 100;
  EXPECT_THAT(Grammar::Parse("root ::= \"a\"{500}\n", small).status().message(),
              HasSubstr("more than 100 elements"));
  small.max_text_bytes = 10;
  EXPECT_THAT(Grammar::Parse("root ::= \"a\"\n", small).status().message(),
              HasSubstr("more than the limit of 10"));
  EXPECT_THAT(Grammar::Parse(std::string("root ::= \"\xC3\"\n")).status().message(),
              HasSubstr("not valid UTF-8"));
}

// The masker against the plainest reference: each token's bytes fed to a fresh copy of the
// matcher. Random vocabularies (byte strings cut anywhere, so tokens end inside UTF-8
// characters; shared prefixes; a special token and two EOS ids), at states reached by
// drawn prefixes of sentences.
TEST(TokenMaskTest, EqualsFeedingEveryTokenAlone) {
  std::mt19937 rng(3);
  for (const char* text : {kJson, kUnicode, kCounted}) {
    auto grammar = std::make_shared<const Grammar>(MustParse(text));
    std::vector<std::string> sentences;
    for (int i = 0; i < 200; ++i) {
      if (auto s = Draw(*grammar, rng, 30); s.has_value() && !s->empty()) {
        sentences.push_back(Utf8(*s));
      }
    }
    ASSERT_GT(sentences.size(), 50u);
    // Tokens: pieces of sentences, single bytes, and a few strings no sentence holds.
    std::vector<std::string> tokens = {"", "<|special|>", "<eos>", "\xff", "zz"};
    for (int b = 0; b < 256; ++b) tokens.emplace_back(1, static_cast<char>(b));
    for (const std::string& s : sentences) {
      for (int k = 0; k < 6; ++k) {
        const size_t from = std::uniform_int_distribution<size_t>(0, s.size() - 1)(rng);
        const size_t len = std::uniform_int_distribution<size_t>(1, 6)(rng);
        tokens.push_back(s.substr(from, len));
      }
    }
    std::vector<bool> special(tokens.size(), false);
    special[1] = true;
    const Vocabulary vocabulary(tokens, special, {2, 0});
    const TokenMasker masker(&vocabulary);
    // The cached masker shares its positions across sentences (small, so some are not kept).
    MaskCache cache(grammar, &vocabulary, /*max_contexts=*/8);
    const TokenMasker cached(&vocabulary, &cache);
    int checked = 0, allowed = 0;
    for (const std::string& s : sentences) {
      Matcher m(grammar);
      const size_t cut = std::uniform_int_distribution<size_t>(0, s.size())(rng);
      ASSERT_TRUE(m.Accept(s.substr(0, cut)));
      const Bitmask mask = masker.Compute(m);
      EXPECT_EQ(m.num_accepted(), cut);  // The matcher ends as it began.
      ASSERT_EQ(cached.Compute(m), mask) << "cached, after [" << s.substr(0, cut) << "]";
      EXPECT_EQ(m.num_accepted(), cut);
      for (int32_t id = 0; id < vocabulary.size(); ++id) {
        bool want;
        if (id == 2 || id == 0) {
          want = m.CanEnd();  // EOS (id 0 also has no bytes).
        } else if (special[id] || tokens[id].empty()) {
          want = false;
        } else {
          Matcher alone = m;
          want = alone.Accept(tokens[id]);
        }
        ASSERT_EQ(Allowed(mask, id), want)
            << "token " << id << " [" << tokens[id] << "] after [" << s.substr(0, cut) << "]";
        ++checked;
        allowed += want;
      }
    }
    EXPECT_GT(allowed, 100) << text;
    EXPECT_GT(checked, 10000);
    EXPECT_GT(cache.num_contexts(), 0u) << text;
    EXPECT_LE(cache.num_contexts(), 8u) << text;
  }
}

// Positions deep inside a long run of one element share their cache entry, and the masks
// stay those of the walk at every position of the run, its end included.
TEST(TokenMaskTest, ALongRunSharesItsContexts) {
  auto grammar = std::make_shared<const Grammar>(
      MustParse("root ::= [a-c]{40} item{30} \"x\"\nitem ::= \"d\" | \"ee\"\n"));
  std::vector<std::string> tokens = {"<eos>", "a", "b",  "ab", "abc", "ca", "x",   "cx",
                                     "d",     "e", "ee", "de", "eed", "dx", "eex", "bbbb"};
  const Vocabulary vocabulary(tokens, std::vector<bool>(tokens.size(), false), {0});
  const TokenMasker walk(&vocabulary);
  MaskCache cache(grammar, &vocabulary);
  const TokenMasker cached(&vocabulary, &cache);
  Matcher m(grammar);
  const std::string sentence = std::string(40, 'b') + std::string(30, 'd') + "x";
  for (size_t i = 0; i <= sentence.size(); ++i) {
    ASSERT_EQ(cached.Compute(m), walk.Compute(m)) << "after " << i << " bytes";
    if (i < sentence.size()) ASSERT_TRUE(m.AcceptByte(static_cast<uint8_t>(sentence[i])));
  }
  EXPECT_TRUE(m.CanEnd());
  // 71 positions; the runs' starts stand for all but their last (longest token + 1).
  EXPECT_LT(cache.num_contexts(), 20u);
}

}  // namespace
}  // namespace conveyor::grammar
