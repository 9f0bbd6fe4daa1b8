#include "grammar/regex.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/utf8.h"
#include "grammar/grammar.h"

namespace conveyor::grammar {
namespace {

constexpr char32_t kMaxChar = 0x10FFFF;
using CharSet = std::vector<CharRange>;  // Sorted, disjoint, not adjacent.

CharSet Normalize(CharSet set) {
  std::sort(set.begin(), set.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  CharSet out;
  for (const CharRange& r : set) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  // No surrogates: they are not characters, and UTF-8 cannot carry them.
  CharSet clean;
  for (const CharRange& r : out) {
    if (r.lo < 0xD800) clean.push_back({r.lo, std::min<char32_t>(r.hi, 0xD7FF)});
    if (r.hi > 0xDFFF) clean.push_back({std::max<char32_t>(r.lo, 0xE000), r.hi});
  }
  return clean;
}

CharSet Complement(const CharSet& set) {
  CharSet out;
  char32_t next = 0;
  for (const CharRange& r : set) {
    if (r.lo > next) out.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxChar) out.push_back({next, kMaxChar});
  return Normalize(out);
}

CharSet Digits() { return {{'0', '9'}}; }
CharSet Word() { return Normalize({{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}}); }
// ECMA-262's WhiteSpace and LineTerminator.
CharSet Space() {
  return Normalize({{'\t', '\r'},
                    {' ', ' '},
                    {0xA0, 0xA0},
                    {0x1680, 0x1680},
                    {0x2000, 0x200A},
                    {0x2028, 0x2029},
                    {0x202F, 0x202F},
                    {0x205F, 0x205F},
                    {0x3000, 0x3000},
                    {0xFEFF, 0xFEFF}});
}
CharSet AnyChar() { return Normalize({{0, kMaxChar}}); }
CharSet Dot() { return Complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}); }

// The syntax tree: nodes in an arena, children before their parents.
struct Node {
  enum class Kind { kChars, kConcat, kAlt, kRepeat };
  Kind kind = Kind::kChars;
  CharSet chars;          // kChars.
  std::vector<int> kids;  // kConcat, kAlt; kRepeat has one.
  int min = 0;            // kRepeat.
  int max = -1;           // kRepeat; -1 unbounded.
};

// One top-level alternative and its anchors.
struct Branch {
  int node = -1;
  bool starts_anchored = false;
  bool ends_anchored = false;
};

class Parser {
 public:
  Parser(std::u32string pattern, const RegexLimits& limits)
      : p_(std::move(pattern)), limits_(limits) {}

  absl::Status Run(std::vector<Node>* nodes, std::vector<Branch>* branches) {
    for (;;) {
      Branch branch;
      if (Peek('^')) {
        ++pos_;
        branch.starts_anchored = true;
      }
      std::optional<int> node = Alternative(0, &branch.ends_anchored);
      if (!node.has_value()) return error_;
      branch.node = *node;
      branches->push_back(branch);
      if (pos_ == p_.size()) break;
      if (p_[pos_] == ')') return Error(pos_, "`)` closes no group");
      ++pos_;  // '|'
    }
    *nodes = std::move(nodes_);
    return absl::OkStatus();
  }

 private:
  absl::Status Error(size_t at, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("regex at position ", at, ": ", what));
  }
  std::nullopt_t Fail(size_t at, const std::string& what) {
    if (error_.ok()) error_ = Error(at, what);
    return std::nullopt;
  }
  bool Peek(char32_t c) const { return pos_ < p_.size() && p_[pos_] == c; }

  int Add(Node node) {
    nodes_.push_back(std::move(node));
    return static_cast<int>(nodes_.size()) - 1;
  }
  int Chars(CharSet set) {
    Node n;
    n.chars = std::move(set);
    return Add(std::move(n));
  }

  // Alternatives up to ')' or the end.
  std::optional<int> Disjunction(int depth) {
    Node alt;
    alt.kind = Node::Kind::kAlt;
    for (;;) {
      std::optional<int> a = Alternative(depth, nullptr);
      if (!a.has_value()) return std::nullopt;
      alt.kids.push_back(*a);
      if (!Peek('|')) break;
      ++pos_;
    }
    if (alt.kids.size() == 1) return alt.kids[0];
    return Add(std::move(alt));
  }

  // Terms up to '|', ')' or the end. At the top level (`ends_anchored` given) a final '$'
  // is allowed.
  std::optional<int> Alternative(int depth, bool* ends_anchored) {
    Node seq;
    seq.kind = Node::Kind::kConcat;
    while (pos_ < p_.size() && p_[pos_] != '|' && p_[pos_] != ')') {
      const size_t at = pos_;
      const char32_t c = p_[pos_];
      if (c == '$' && ends_anchored != nullptr && (pos_ + 1 == p_.size() || p_[pos_ + 1] == '|')) {
        ++pos_;
        *ends_anchored = true;
        break;
      }
      if (c == '^' || c == '$') {
        return Fail(at, absl::StrCat("the anchor `", c == '^' ? "^" : "$",
                                     "` is supported only at the start or end of the pattern "
                                     "(or of a top-level alternative)"));
      }
      std::optional<int> atom = Atom(depth);
      if (!atom.has_value()) return std::nullopt;
      std::optional<int> term = Quantified(*atom);
      if (!term.has_value()) return std::nullopt;
      seq.kids.push_back(*term);
    }
    if (seq.kids.size() == 1) return seq.kids[0];
    return Add(std::move(seq));
  }

  // {m}, {m,}, {m,n} at pos_: the bounds and the position after '}', or nullopt if the
  // text there is no quantifier (then '{' is a literal).
  std::optional<std::pair<int, int>> Braces(size_t* end, bool* too_big) const {
    size_t i = pos_ + 1;
    auto number = [&](int* out) {
      const size_t start = i;
      int64_t v = 0;
      while (i < p_.size() && p_[i] >= '0' && p_[i] <= '9') {
        v = std::min<int64_t>(v * 10 + (p_[i] - '0'), int64_t{1} << 40);
        ++i;
      }
      if (v > limits_.max_repeat) *too_big = true;
      *out = static_cast<int>(std::min<int64_t>(v, limits_.max_repeat));
      return i > start;
    };
    int min = 0, max = 0;
    if (!number(&min)) return std::nullopt;
    max = min;
    if (i < p_.size() && p_[i] == ',') {
      ++i;
      max = -1;
      if (i < p_.size() && p_[i] != '}' && !number(&max)) return std::nullopt;
    }
    if (i >= p_.size() || p_[i] != '}') return std::nullopt;
    *end = i + 1;
    return std::make_pair(min, max);
  }

  std::optional<int> Quantified(int atom) {
    if (pos_ == p_.size()) return atom;
    const size_t at = pos_;
    int min = 0, max = -1;
    switch (p_[pos_]) {
      case '*':
        ++pos_;
        break;
      case '+':
        min = 1;
        ++pos_;
        break;
      case '?':
        max = 1;
        ++pos_;
        break;
      case '{': {
        size_t end = 0;
        bool too_big = false;
        std::optional<std::pair<int, int>> b = Braces(&end, &too_big);
        if (!b.has_value()) return atom;  // A literal '{' comes next.
        if (too_big) {
          return Fail(at, absl::StrCat("a repeat count above the limit of ", limits_.max_repeat));
        }
        std::tie(min, max) = *b;
        if (max >= 0 && max < min) return Fail(at, "the quantifier's maximum is below its minimum");
        pos_ = end;
        break;
      }
      default:
        return atom;
    }
    if (Peek('?')) ++pos_;  // Lazy: the same language.
    Node rep;
    rep.kind = Node::Kind::kRepeat;
    rep.kids = {atom};
    rep.min = min;
    rep.max = max;
    return Add(std::move(rep));
  }

  std::optional<int> Atom(int depth) {
    const size_t at = pos_;
    const char32_t c = p_[pos_];
    switch (c) {
      case '*':
      case '+':
      case '?':
        return Fail(at, absl::StrCat("the quantifier `", std::string(1, static_cast<char>(c)),
                                     "` repeats nothing"));
      case '{': {
        size_t end = 0;
        bool too_big = false;
        if (Braces(&end, &too_big).has_value())
          return Fail(at, "the quantifier `{` repeats nothing");
        ++pos_;
        return Chars({{c, c}});
      }
      case '.':
        ++pos_;
        return Chars(Dot());
      case '[':
        return Class();
      case '(':
        return Group(depth);
      case '\\': {
        std::optional<CharSet> set = Escape(/*in_class=*/false);
        if (!set.has_value()) return std::nullopt;
        return Chars(*std::move(set));
      }
      default:
        ++pos_;
        return Chars({{c, c}});
    }
  }

  std::optional<int> Group(int depth) {
    const size_t at = pos_;
    if (depth + 1 > limits_.max_nesting) {
      return Fail(at, absl::StrCat("groups nest deeper than ", limits_.max_nesting));
    }
    ++pos_;
    if (Peek('?')) {
      const std::u32string_view rest = std::u32string_view(p_).substr(pos_);
      if (rest.starts_with(U"?:")) {
        pos_ += 2;
      } else if (rest.starts_with(U"?=") || rest.starts_with(U"?!") || rest.starts_with(U"?<=") ||
                 rest.starts_with(U"?<!")) {
        return Fail(at, "lookaround assertions are not supported");
      } else if (rest.starts_with(U"?<")) {
        pos_ += 2;
        while (pos_ < p_.size() && p_[pos_] != '>') {
          const char32_t n = p_[pos_];
          if (!((n >= 'a' && n <= 'z') || (n >= 'A' && n <= 'Z') || (n >= '0' && n <= '9') ||
                n == '_' || n == '$')) {
            return Fail(pos_, "a group name may hold only letters, digits, _ and $");
          }
          ++pos_;
        }
        if (!Peek('>')) return Fail(at, "the group name is not closed with `>`");
        ++pos_;
      } else {
        return Fail(at, "this kind of group `(?` is not supported");
      }
    }
    std::optional<int> inner = Disjunction(depth + 1);
    if (!inner.has_value()) return std::nullopt;
    if (!Peek(')')) return Fail(at, "the group is not closed with `)`");
    ++pos_;
    return inner;
  }

  std::optional<int> Class() {
    const size_t at = pos_;
    ++pos_;
    bool negated = false;
    if (Peek('^')) {
      negated = true;
      ++pos_;
    }
    CharSet set;
    bool empty = true;
    while (!Peek(']')) {
      if (pos_ == p_.size()) return Fail(at, "the class is not closed with `]`");
      std::optional<CharSet> lo = ClassAtom();
      if (!lo.has_value()) return std::nullopt;
      empty = false;
      if (Peek('-') && pos_ + 1 < p_.size() && p_[pos_ + 1] != ']') {
        const size_t dash = pos_;
        ++pos_;
        std::optional<CharSet> hi = ClassAtom();
        if (!hi.has_value()) return std::nullopt;
        const bool single = lo->size() == 1 && (*lo)[0].lo == (*lo)[0].hi && hi->size() == 1 &&
                            (*hi)[0].lo == (*hi)[0].hi;
        if (!single) return Fail(dash, "a range in a class must join two single characters");
        if ((*hi)[0].lo < (*lo)[0].lo) return Fail(dash, "the class range is out of order");
        set.push_back({(*lo)[0].lo, (*hi)[0].lo});
      } else {
        set.insert(set.end(), lo->begin(), lo->end());
      }
    }
    ++pos_;
    if (empty && !negated) return Fail(at, "the empty class `[]` matches nothing");
    CharSet out = Normalize(set);
    if (negated) out = Complement(out);
    if (out.empty()) return Fail(at, "the class matches no character");
    return Chars(std::move(out));
  }

  std::optional<CharSet> ClassAtom() {
    if (Peek('\\')) return Escape(/*in_class=*/true);
    const char32_t c = p_[pos_++];
    return CharSet{{c, c}};
  }

  static int HexValue(char32_t c) {
    if (c >= '0' && c <= '9') return static_cast<int>(c - '0');
    if (c >= 'a' && c <= 'f') return static_cast<int>(c - 'a' + 10);
    if (c >= 'A' && c <= 'F') return static_cast<int>(c - 'A' + 10);
    return -1;
  }
  // `digits` hex digits at pos_, or -1 (pos_ unmoved).
  int64_t Hex(int digits) {
    if (pos_ + digits > p_.size()) return -1;
    int64_t v = 0;
    for (int k = 0; k < digits; ++k) {
      const int h = HexValue(p_[pos_ + k]);
      if (h < 0) return -1;
      v = v * 16 + h;
    }
    pos_ += digits;
    return v;
  }

  // The escape at pos_ ('\\'): the characters it stands for.
  std::optional<CharSet> Escape(bool in_class) {
    const size_t at = pos_;
    ++pos_;
    if (pos_ == p_.size()) return Fail(at, "the pattern ends inside an escape");
    const char32_t c = p_[pos_++];
    auto one = [](char32_t x) { return CharSet{{x, x}}; };
    switch (c) {
      case 'd':
        return Digits();
      case 'D':
        return Complement(Digits());
      case 'w':
        return Word();
      case 'W':
        return Complement(Word());
      case 's':
        return Space();
      case 'S':
        return Complement(Space());
      case 't':
        return one('\t');
      case 'n':
        return one('\n');
      case 'r':
        return one('\r');
      case 'f':
        return one('\f');
      case 'v':
        return one('\v');
      case 'b':
        if (in_class) return one('\b');
        return Fail(at, "word boundaries (\\b) are not supported");
      case 'B':
        return Fail(at, "word boundaries (\\B) are not supported");
      case '0':
        if (pos_ < p_.size() && p_[pos_] >= '0' && p_[pos_] <= '9') {
          return Fail(at, "octal escapes are not supported");
        }
        return one(0);
      case 'c':
        if (pos_ < p_.size() &&
            ((p_[pos_] >= 'a' && p_[pos_] <= 'z') || (p_[pos_] >= 'A' && p_[pos_] <= 'Z'))) {
          return one(p_[pos_++] % 32);
        }
        return Fail(at, "\\c must be followed by a letter");
      case 'x': {
        const int64_t v = Hex(2);
        if (v < 0) return Fail(at, "\\x must be followed by two hex digits");
        return one(static_cast<char32_t>(v));
      }
      case 'u': {
        int64_t v = Hex(4);
        if (v < 0) return Fail(at, "\\u must be followed by four hex digits");
        if (v >= 0xD800 && v <= 0xDBFF && pos_ + 1 < p_.size() && p_[pos_] == '\\' &&
            p_[pos_ + 1] == 'u') {
          const size_t back = pos_;
          pos_ += 2;
          const int64_t low = Hex(4);
          if (low >= 0xDC00 && low <= 0xDFFF) {
            v = 0x10000 + ((v - 0xD800) << 10) + (low - 0xDC00);
          } else {
            pos_ = back;
          }
        }
        if (v >= 0xD800 && v <= 0xDFFF) return Fail(at, "a lone surrogate is not a character");
        return one(static_cast<char32_t>(v));
      }
      case 'k':
        return Fail(at, "backreferences (\\k) are not supported");
      case 'p':
      case 'P':
        return Fail(at, "Unicode property escapes (\\p, \\P) are not supported");
      default:
        break;
    }
    if (c >= '1' && c <= '9') {
      return Fail(at, absl::StrCat("backreferences (\\", std::string(1, static_cast<char>(c)),
                                   ") are not supported"));
    }
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
      return Fail(at, absl::StrCat("the escape \\", std::string(1, static_cast<char>(c)),
                                   " is not supported"));
    }
    return one(c);  // Escaped punctuation stands for itself.
  }

  std::u32string p_;
  const RegexLimits& limits_;
  size_t pos_ = 0;
  std::vector<Node> nodes_;
  absl::Status error_;
};

// A character of a grammar class, escaped.
void AppendClassChar(char32_t c, std::string* out) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) {
    out->push_back(static_cast<char>(c));
  } else if (c <= 0xFF) {
    absl::StrAppend(out, "\\x", absl::Hex(static_cast<uint32_t>(c), absl::kZeroPad2));
  } else if (c <= 0xFFFF) {
    absl::StrAppend(out, "\\u", absl::Hex(static_cast<uint32_t>(c), absl::kZeroPad4));
  } else {
    absl::StrAppend(out, "\\U", absl::Hex(static_cast<uint32_t>(c), absl::kZeroPad8));
  }
}

std::string ClassText(const CharSet& set) {
  std::string out = "[";
  for (const CharRange& r : set) {
    AppendClassChar(r.lo, &out);
    if (r.hi != r.lo) {
      out += '-';
      AppendClassChar(r.hi, &out);
    }
  }
  return out + "]";
}

// Writes the tree as rules named `name_K` (the grammar parser names its own `rule-K`).
class Emitter {
 public:
  Emitter(const std::vector<Node>& nodes, std::string name, RegexEncoding encoding)
      : nodes_(nodes), name_(std::move(name)), encoding_(encoding) {
    nullable_.resize(nodes.size());
    for (size_t i = 0; i < nodes.size(); ++i) {  // Children come first.
      const Node& n = nodes[i];
      switch (n.kind) {
        case Node::Kind::kChars:
          nullable_[i] = false;
          break;
        case Node::Kind::kConcat:
          nullable_[i] =
              std::all_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable_[k]; });
          break;
        case Node::Kind::kAlt:
          nullable_[i] =
              std::any_of(n.kids.begin(), n.kids.end(), [&](int k) { return nullable_[k]; });
          break;
        case Node::Kind::kRepeat:
          nullable_[i] = n.min == 0 || nullable_[n.kids[0]];
          break;
      }
    }
  }

  std::string NewRule(const std::string& body) {
    std::string rule = absl::StrCat(name_, "_", rules_.size());
    rules_.push_back(absl::StrCat(rule, " ::= ", body));
    return rule;
  }
  const std::vector<std::string>& rules() const { return rules_; }

  // One grammar element for the characters of `set`.
  std::string CharsAtom(const CharSet& set) {
    if (encoding_ == RegexEncoding::kRaw) return ClassText(set);
    auto it = chars_memo_.find(ClassText(set));
    if (it != chars_memo_.end()) return it->second;
    std::vector<std::string> escaped;
    for (const CharRange& r : set) {
      for (char32_t c = r.lo; c <= std::min<char32_t>(r.hi, 0x5C); ++c) {
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        switch (c) {
          case '"':
            escaped.emplace_back(R"("\\\"")");
            break;
          case '\\':
            escaped.emplace_back(R"("\\\\")");
            break;
          case '\b':
            escaped.emplace_back(R"("\\b")");
            break;
          case '\f':
            escaped.emplace_back(R"("\\f")");
            break;
          case '\n':
            escaped.emplace_back(R"("\\n")");
            break;
          case '\r':
            escaped.emplace_back(R"("\\r")");
            break;
          case '\t':
            escaped.emplace_back(R"("\\t")");
            break;
          default:
            escaped.push_back(absl::StrCat(
                R"("\\u00)", absl::Hex(static_cast<uint32_t>(c), absl::kZeroPad2), "\""));
        }
      }
    }
    CharSet unescaped;
    for (const CharRange& r : set) {
      // Split around 0x00-0x1F, '"' and '\\'.
      const CharRange pieces[] = {{std::max<char32_t>(r.lo, 0x20), std::min<char32_t>(r.hi, 0x21)},
                                  {std::max<char32_t>(r.lo, 0x23), std::min<char32_t>(r.hi, 0x5B)},
                                  {std::max<char32_t>(r.lo, 0x5D), r.hi}};
      for (const CharRange& p : pieces) {
        if (p.lo <= p.hi) unescaped.push_back(p);
      }
    }
    std::vector<std::string> alternatives;
    if (!unescaped.empty()) alternatives.push_back(ClassText(unescaped));
    alternatives.insert(alternatives.end(), escaped.begin(), escaped.end());
    std::string atom = alternatives.size() == 1 && !unescaped.empty()
                           ? alternatives[0]
                           : NewRule(absl::StrJoin(alternatives, " | "));
    chars_memo_[ClassText(set)] = atom;
    return atom;
  }

  // A sequence of elements for the language of node `i`.
  std::string Expr(int i) {
    if (auto it = expr_memo_.find(i); it != expr_memo_.end()) return it->second;
    const Node& n = nodes_[i];
    std::string out;
    switch (n.kind) {
      case Node::Kind::kChars:
        out = CharsAtom(n.chars);
        break;
      case Node::Kind::kConcat: {
        std::vector<std::string> parts;
        for (int k : n.kids) parts.push_back(Expr(k));
        out = parts.empty() ? "\"\"" : absl::StrJoin(parts, " ");
        break;
      }
      case Node::Kind::kAlt: {
        std::vector<std::string> parts;
        for (int k : n.kids) parts.push_back(Expr(k));
        out = NewRule(absl::StrJoin(parts, " | "));
        break;
      }
      case Node::Kind::kRepeat: {
        const int body = n.kids[0];
        if (n.max < 0 && nullable_[body]) {
          // (X)* with X nullable is (X minus the empty string)*; the grammar form refuses a
          // repetition of something empty (it would be left-recursive).
          std::optional<std::string> ne = NonEmpty(body);
          out = ne.has_value() ? absl::StrCat(Wrap(*ne), "*") : "\"\"";
        } else {
          out = absl::StrCat(Wrap(Expr(body)), Quantifier(n.min, n.max));
        }
        break;
      }
    }
    expr_memo_[i] = out;
    return out;
  }

  // The language of node `i` without the empty string; nullopt if that is empty.
  std::optional<std::string> NonEmpty(int i) {
    if (!nullable_[i]) return Expr(i);
    if (auto it = nonempty_memo_.find(i); it != nonempty_memo_.end()) return it->second;
    const Node& n = nodes_[i];
    std::optional<std::string> out;
    switch (n.kind) {
      case Node::Kind::kChars:
        break;
      case Node::Kind::kConcat: {
        // Every child is nullable. From the back: N_k = NE(c_k) T_{k+1} | N_{k+1}, where
        // T_k is c_k..c_end; N_k then derives the non-empty strings of c_k..c_end.
        std::optional<std::string> tail_ne;  // N_{k+1}
        std::string tail;                    // T_{k+1}, as an expression.
        for (size_t k = n.kids.size(); k-- > 0;) {
          std::vector<std::string> alts;
          if (std::optional<std::string> ne = NonEmpty(n.kids[k]); ne.has_value()) {
            alts.push_back(tail.empty() ? *ne : absl::StrCat(*ne, " ", tail));
          }
          if (tail_ne.has_value()) alts.push_back(*tail_ne);
          if (!alts.empty()) tail_ne = NewRule(absl::StrJoin(alts, " | "));
          const std::string here = Expr(n.kids[k]);
          tail = tail.empty() ? here : NewRule(absl::StrCat(here, " ", tail));
        }
        out = tail_ne;
        break;
      }
      case Node::Kind::kAlt: {
        std::vector<std::string> alts;
        for (int k : n.kids) {
          if (std::optional<std::string> ne = NonEmpty(k); ne.has_value()) alts.push_back(*ne);
        }
        if (!alts.empty()) out = NewRule(absl::StrJoin(alts, " | "));
        break;
      }
      case Node::Kind::kRepeat: {
        // L(X{m,n}) without "" is (NE(X)){1,n}: empty copies of X can be dropped.
        if (n.max == 0) break;
        std::optional<std::string> ne = NonEmpty(n.kids[0]);
        if (ne.has_value()) out = NewRule(absl::StrCat(Wrap(*ne), Quantifier(1, n.max)));
        break;
      }
    }
    nonempty_memo_[i] = out;
    return out;
  }

 private:
  static std::string Quantifier(int min, int max) {
    if (min == 0 && max < 0) return "*";
    if (min == 1 && max < 0) return "+";
    if (min == 0 && max == 1) return "?";
    if (max < 0) return absl::StrCat("{", min, ",}");
    if (min == max) return absl::StrCat("{", min, "}");
    return absl::StrCat("{", min, ",", max, "}");
  }

  // `expr` as one element: a class or a rule name stays, anything else gets a rule.
  std::string Wrap(const std::string& expr) {
    // Classes are written without spaces (ClassText escapes them).
    const bool is_class =
        expr.front() == '[' && expr.back() == ']' && expr.find(' ') == std::string::npos;
    const bool is_name = std::all_of(expr.begin(), expr.end(), [](char c) {
      return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
             c == '-' || c == '_';
    });
    if (is_class || is_name) return expr;
    return NewRule(expr);
  }

  const std::vector<Node>& nodes_;
  std::string name_;
  RegexEncoding encoding_;
  std::vector<bool> nullable_;
  std::vector<std::string> rules_;
  std::map<int, std::string> expr_memo_;
  std::map<int, std::optional<std::string>> nonempty_memo_;
  std::map<std::string, std::string> chars_memo_;
};

}  // namespace

absl::StatusOr<std::string> RegexToRules(std::string_view pattern, std::string_view name,
                                         RegexMatch match, RegexEncoding encoding,
                                         const RegexLimits& limits) {
  if (pattern.size() > limits.max_pattern_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the regex is longer than ", limits.max_pattern_bytes, " bytes"));
  }
  if (size_t bad = FindInvalidUtf8(pattern); bad != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("the regex is not valid UTF-8 (at byte ", bad, ")"));
  }
  std::u32string chars;
  for (size_t i = 0; i < pattern.size();) chars.push_back(NextChar(pattern, &i));
  std::vector<Node> nodes;
  std::vector<Branch> branches;
  Parser parser(std::move(chars), limits);
  if (absl::Status parsed = parser.Run(&nodes, &branches); !parsed.ok()) return parsed;

  Emitter emitter(nodes, std::string(name), encoding);
  std::string any;  // Any text, for the unanchored sides of a search.
  std::vector<std::string> alternatives;
  for (const Branch& b : branches) {
    std::string expr = emitter.Expr(b.node);
    if (match == RegexMatch::kSearch) {
      if (any.empty()) any = absl::StrCat(emitter.CharsAtom(AnyChar()), "*");
      if (!b.starts_anchored) expr = absl::StrCat(any, " ", expr);
      if (!b.ends_anchored) expr = absl::StrCat(expr, " ", any);
    }
    alternatives.push_back(std::move(expr));
  }
  std::string out =
      absl::StrCat(std::string(name), " ::= ", absl::StrJoin(alternatives, " | "), "\n");
  for (const std::string& rule : emitter.rules()) absl::StrAppend(&out, rule, "\n");
  return out;
}

absl::StatusOr<std::string> RegexToGrammar(std::string_view pattern, const RegexLimits& limits) {
  return RegexToRules(pattern, "root", RegexMatch::kWhole, RegexEncoding::kRaw, limits);
}

}  // namespace conveyor::grammar
