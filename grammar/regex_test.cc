// Regular expressions to grammar: the compiled grammar accepts exactly what Python's `re`
// (the independent reference) matches, on sentences drawn from the grammar and on their
// mutations, for whole-text matching and for JSON string content under search; refusals
// name the construct and its position.
//
// Python's `re` is not ECMA-262: the test runs it with re.ASCII (ECMA's \d \w are ASCII)
// and rewrites `.`, \s and \S to ECMA's sets, `(?<name>` to `(?P<name>` and a final `$` to
// \Z (Python's `$` also matches before a final newline).
#include "grammar/regex.h"

#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/test_temp_dir.h"
#include "common/utf8.h"
#include "gmock/gmock.h"
#include "grammar/grammar.h"
#include "grammar/matcher.h"
#include "grammar/test_util.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::grammar {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

const char* const kPatterns[] = {
    "abc",
    "a|b|cd",
    "[a-c]+x?",
    "(ab|c)*d",
    R"(\d{3}-\d{2,4})",
    R"([^a-c\n]{1,3}z)",
    "(?:a|)*b",
    "(a?)+",
    "(a*b?)*c",
    R"(^\w+@\w+\.com$)",
    R"(\s*\S+\s*)",
    ".{2,5}",
    "x{3,}",
    R"([\d\-_]+)",
    "a{2}b{0,2}?c+?",
    "(?:(?:a|b)c){2}",
    R"(\x41\u00e9[\u4e00-\u4e0f]!)",
    R"([^\w]\D\W)",
    "a{",
    "a{1,2}}",
    R"([.]\.[\]\[-])",
    R"((?<year>\d{4})-(?<m>\d\d))",
    "(|a)(b|)",
    "(()|a)*",
    R"(["\\]+\/)",
    R"(\cJ\t\0)",
    "^a|b$|^c$|d",
    "(a|b){0,3}(c(d|e)?)+",
    R"([^"\\]*)",
    "é+中?",
    "",
};

// Characters mutations insert: from the patterns, plus the escaping and line-terminator
// edge cases.
const std::u32string kAlphabet =
    U"abcdexz0159 -_.@!\n\r\t\"\\\x0b\x1c\u00a0\u00e9\u2028\u4e00\u4e10\u0663{}[]AJ";

std::u32string Mutate(std::u32string s, std::mt19937& rng) {
  auto pick = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  const int edits = 1 + static_cast<int>(pick(2));
  for (int e = 0; e < edits; ++e) {
    const size_t kind = pick(4);
    const char32_t c = kAlphabet[pick(kAlphabet.size())];
    if (kind == 0 || s.empty()) {
      s.insert(s.begin() + static_cast<ptrdiff_t>(pick(s.size() + 1)), c);
    } else if (kind == 1) {
      s.erase(pick(s.size()), 1);
    } else if (kind == 2) {
      s[pick(s.size())] = c;
    } else {
      const size_t at = pick(s.size());
      s.insert(at, s.substr(at, 1 + pick(3)));
    }
  }
  return s;
}

// JSON string content as RegexEncoding::kJsonStringContent writes it.
std::string JsonContent(const std::u32string& s) {
  std::string out;
  for (char32_t c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c < 0x20) {
          const char* hex = "0123456789abcdef";
          out += "\\u00";
          out += hex[c >> 4];
          out += hex[c & 15];
        } else {
          AppendUtf8(c, &out);
        }
    }
  }
  return out;
}

bool Accepts(const std::shared_ptr<const Grammar>& g, const std::string& text) {
  Matcher m(g);
  return m.Accept(text) && m.CanEnd();
}

// The reference: reads lines {"pattern", "text", "search", "accepted"} and reports every
// line where Python's verdict differs.
constexpr const char* kReference = R"(import json, re, sys
WS = '\\t\\n\\v\\f\\r \\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000\\ufeff'

def to_python(p):
    out, i, in_class = [], 0, False
    while i < len(p):
        c = p[i]
        if c == '\\':
            e = p[i + 1]
            if e == 's':
                out.append(WS if in_class else '[' + WS + ']')
            elif e == 'S':
                assert not in_class
                out.append('[^' + WS + ']')
            elif e == 'c':
                out.append('\\x%02x' % (ord(p[i + 2]) % 32))
                i += 1
            elif e == '/':
                out.append('/')
            else:
                out.append(c + e)
            i += 2
            continue
        if in_class:
            if c == ']':
                in_class = False
            out.append('\\[' if c == '[' else c)
        elif c == '[':
            in_class = True
            out.append(c)
            if p[i + 1:i + 2] == '^':
                out.append('^')
                i += 1
        elif c == '.':
            out.append('[^\\n\\r\\u2028\\u2029]')
        elif c == '(' and p[i + 1:i + 3] == '?<' and p[i + 3:i + 4] not in ('=', '!'):
            out.append('(?P<')
            i += 3
            continue
        elif c == '$' and (i + 1 == len(p) or p[i + 1] == '|'):
            out.append('\\Z')
        else:
            out.append(c)
        i += 1
    return ''.join(out)

bad = checked = accepted = 0
for line in open(sys.argv[1]):
    case = json.loads(line)
    p = re.compile(to_python(case['pattern']), re.ASCII)
    text = json.loads('"' + case['text'] + '"') if case['search'] else case['text']
    want = bool(p.search(text) if case['search'] else p.fullmatch(text))
    checked += 1
    accepted += want
    if want != case['accepted']:
        bad += 1
        if bad <= 20:
            print('differs:', repr(case['pattern']), repr(case['text']), 'python', want)
print('checked', checked, 'accepted', accepted, 'bad', bad)
sys.exit(1 if bad else 0)
)";

TEST(RegexTest, AcceptsWhatPythonMatches) {
  TestTempDir dir;
  const std::string lines_path = dir.path() + "/cases.jsonl";
  std::ofstream lines(lines_path);
  std::mt19937 rng(5);
  int cases = 0;
  for (const char* pattern : kPatterns) {
    // The whole text, raw.
    absl::StatusOr<std::string> text = RegexToGrammar(pattern);
    ASSERT_TRUE(text.ok()) << pattern << ": " << text.status();
    absl::StatusOr<Grammar> parsed = Grammar::Parse(*text);
    ASSERT_TRUE(parsed.ok()) << pattern << ": " << parsed.status() << "\n" << *text;
    auto whole = std::make_shared<const Grammar>(*std::move(parsed));
    // A JSON string whose content contains a match.
    absl::StatusOr<std::string> rules =
        RegexToRules(pattern, "re", RegexMatch::kSearch, RegexEncoding::kJsonStringContent);
    ASSERT_TRUE(rules.ok()) << pattern << ": " << rules.status();
    parsed = Grammar::Parse("root ::= \"\\\"\" re \"\\\"\"\n" + *rules);
    ASSERT_TRUE(parsed.ok()) << pattern << ": " << parsed.status() << "\n" << *rules;
    auto search = std::make_shared<const Grammar>(*std::move(parsed));

    for (int i = 0; i < 60; ++i) {
      std::optional<std::u32string> s = Draw(*whole, rng, 40);
      if (!s.has_value()) continue;
      for (int k = 0; k < 4; ++k) {
        const std::u32string t = k == 0 ? *s : Mutate(*s, rng);
        lines << json{{"pattern", pattern},
                      {"text", Utf8(t)},
                      {"search", false},
                      {"accepted", Accepts(whole, Utf8(t))}}
                     .dump()
              << "\n";
        ++cases;
      }
      std::optional<std::u32string> j = Draw(*search, rng, 60);
      if (!j.has_value()) continue;
      // Drawn sentences are accepted; the reference decodes and searches them.
      ASSERT_TRUE(Accepts(search, Utf8(*j))) << Utf8(*j);
      const std::string content = Utf8(j->substr(1, j->size() - 2));
      lines << json{{"pattern", pattern}, {"text", content}, {"search", true}, {"accepted", true}}
                   .dump()
            << "\n";
      const std::string mutated = JsonContent(Mutate(*s, rng));
      lines << json{{"pattern", pattern},
                    {"text", mutated},
                    {"search", true},
                    {"accepted", Accepts(search, "\"" + mutated + "\"")}}
                   .dump()
            << "\n";
      cases += 2;
    }
  }
  lines.close();
  const std::string script = dir.WriteFile("reference.py", kReference);
  std::string output;
  const int status = RunCommand(
      std::string(CONVEYOR_TEST_VENV "/bin/python ") + script + " " + lines_path, &output);
  EXPECT_EQ(status, 0) << output;
  EXPECT_THAT(output, HasSubstr(" bad 0")) << output;
  EXPECT_GT(cases, 5000);
  std::printf("%s", output.c_str());
}

TEST(RegexTest, AnchorsAndSearch) {
  auto compile = [](const char* pattern, RegexMatch match) {
    absl::StatusOr<std::string> rules = RegexToRules(pattern, "re", match, RegexEncoding::kRaw);
    EXPECT_TRUE(rules.ok()) << rules.status();
    absl::StatusOr<Grammar> g = Grammar::Parse("root ::= re\n" + *rules);
    EXPECT_TRUE(g.ok()) << g.status();
    return std::make_shared<const Grammar>(*std::move(g));
  };
  auto unanchored = compile("b+", RegexMatch::kSearch);
  EXPECT_TRUE(Accepts(unanchored, "abbc\n"));
  EXPECT_FALSE(Accepts(unanchored, "ac"));
  auto start = compile("^b", RegexMatch::kSearch);
  EXPECT_TRUE(Accepts(start, "bz"));
  EXPECT_FALSE(Accepts(start, "ab"));
  auto end = compile("b$", RegexMatch::kSearch);
  EXPECT_TRUE(Accepts(end, "ab"));
  EXPECT_FALSE(Accepts(end, "ba"));
  EXPECT_FALSE(Accepts(end, "ab\n"));
  auto whole = compile("b", RegexMatch::kWhole);
  EXPECT_TRUE(Accepts(whole, "b"));
  EXPECT_FALSE(Accepts(whole, "ab"));
}

TEST(RegexTest, RefusalsNameTheConstructAndWhere) {
  const struct {
    std::string pattern;
    const char* message;
  } cases[] = {
      {R"((a)\1)", "position 3: backreferences (\\1) are not supported"},
      {R"((?<n>a)\k<n>)", "backreferences (\\k)"},
      {"(?=a)b", "position 0: lookaround assertions are not supported"},
      {"a(?<!a)b", "position 1: lookaround"},
      {R"(a\bc)", "position 1: word boundaries (\\b)"},
      {R"(a\B)", "word boundaries (\\B)"},
      {"a^b", "position 1: the anchor `^` is supported only at the start or end"},
      {"(^a)", "the anchor `^`"},
      {"a$b", "the anchor `$`"},
      {R"(\p{L})", "Unicode property escapes"},
      {R"(\q)", "the escape \\q is not supported"},
      {"a**", "position 2: the quantifier `*` repeats nothing"},
      {"+a", "position 0: the quantifier `+` repeats nothing"},
      {"{2}", "the quantifier `{` repeats nothing"},
      {"a{5,3}", "maximum is below its minimum"},
      {"a{1001}", "above the limit of 1000"},
      {"(a", "position 0: the group is not closed"},
      {"a)", "position 1: `)` closes no group"},
      {"[a", "the class is not closed"},
      {"[z-a]", "out of order"},
      {R"([a-\d])", "a range in a class must join two single characters"},
      {"[]", "the empty class"},
      {"(?i)a", "this kind of group"},
      {R"(\u12)", "four hex digits"},
      {R"(\ud800)", "lone surrogate"},
      {"\\", "ends inside an escape"},
      {std::string(40, '(') + std::string(40, ')'), "groups nest deeper than 32"},
      {std::string(5000, 'a'), "longer than 4096 bytes"},
      {"\xff", "not valid UTF-8"},
  };
  for (const auto& c : cases) {
    absl::StatusOr<std::string> text = RegexToGrammar(c.pattern);
    ASSERT_FALSE(text.ok()) << c.pattern;
    EXPECT_EQ(text.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(text.status().message()), HasSubstr(c.message)) << c.pattern;
  }
}

TEST(RegexTest, BigRepeatsStayWithinTheGrammarLimits) {
  for (const char* pattern : {"(a{1000}){1000}", "((a|b){0,1000}c){2,1000}", ".{1000}"}) {
    absl::StatusOr<std::string> text = RegexToGrammar(pattern);
    ASSERT_TRUE(text.ok()) << text.status();
    absl::StatusOr<Grammar> g = Grammar::Parse(*text);
    ASSERT_TRUE(g.ok()) << pattern << ": " << g.status();
  }
}

}  // namespace
}  // namespace conveyor::grammar
