#include "grammar/grammar.h"

#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/utf8.h"

namespace conveyor::grammar {
namespace {

constexpr char32_t kMaxCodePoint = 0x10FFFF;

// Sorts and merges ranges (adjacent ones too), so that equal sets compare equal.
std::vector<CharRange> Normalized(std::vector<CharRange> ranges) {
  std::sort(ranges.begin(), ranges.end(),
            [](const CharRange& a, const CharRange& b) { return a.lo < b.lo; });
  std::vector<CharRange> out;
  for (const CharRange& r : ranges) {
    if (!out.empty() && r.lo <= out.back().hi + 1) {
      out.back().hi = std::max(out.back().hi, r.hi);
    } else {
      out.push_back(r);
    }
  }
  return out;
}

// The scalar values (code points but surrogates, which no UTF-8 text holds) not in
// `ranges`.
std::vector<CharRange> Complement(const std::vector<CharRange>& ranges) {
  std::vector<CharRange> gaps;
  char32_t next = 0;
  for (const CharRange& r : ranges) {
    if (r.lo > next) gaps.push_back({next, r.lo - 1});
    next = r.hi + 1;
  }
  if (next <= kMaxCodePoint) gaps.push_back({next, kMaxCodePoint});
  std::vector<CharRange> out;
  for (const CharRange& g : gaps) {
    if (g.hi < 0xD800 || g.lo > 0xDFFF) {
      out.push_back(g);
      continue;
    }
    if (g.lo < 0xD800) out.push_back({g.lo, 0xD7FF});
    if (g.hi > 0xDFFF) out.push_back({0xE000, g.hi});
  }
  return out;
}

Element Chars(std::vector<CharRange> ranges) {
  Element e;
  e.kind = Element::Kind::kChars;
  e.chars = Normalized(std::move(ranges));
  return e;
}

Element RuleRef(int rule) {
  Element e;
  e.kind = Element::Kind::kRule;
  e.rule = rule;
  return e;
}

// Debian's Abseil has a string_view of its own; StrCat takes this one.
absl::string_view A(std::string_view s) { return {s.data(), s.size()}; }

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
         c == '_';
}

class Parser {
 public:
  Parser(std::string_view text, const Limits& limits) : text_(text), limits_(limits) {}

  absl::Status Run(std::vector<Rule>* rules, int* root) {
    if (text_.size() > limits_.max_text_bytes) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar is ", text_.size(),
                                                     " bytes, more than the limit of ",
                                                     limits_.max_text_bytes));
    }
    if (const size_t bad = FindInvalidUtf8(text_); bad != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("the grammar is not valid UTF-8 (byte ", bad, ")"));
    }
    for (;;) {
      SkipSpace(/*newlines=*/true);
      if (pos_ == text_.size()) break;
      const size_t at = pos_;
      const std::string_view name = ParseName();
      if (name.empty()) return Error(at, "expected a rule name");
      SkipSpace(/*newlines=*/false);
      if (text_.substr(pos_, 3) != "::=") return Error(pos_, "expected ::= after the rule name");
      pos_ += 3;
      const int id = RuleId(name);
      if (id < 0) return TooMany();
      if (defined_[id]) return Error(at, absl::StrCat("rule ", A(name), " is defined twice"));
      defined_[id] = true;
      SkipSpace(/*newlines=*/false);
      std::optional<std::vector<Sequence>> alternatives = ParseAlternatives(false, 0, name);
      if (!error_.ok()) return error_;
      if (!alternatives.has_value()) return Error(pos_, "cannot read the rule");
      rules_[id].alternatives = *std::move(alternatives);
      SkipSpace(/*newlines=*/false);
      if (pos_ < text_.size() && text_[pos_] != '\n') {
        return Error(pos_, "unexpected character after the rule");
      }
    }
    for (size_t i = 0; i < rules_.size(); ++i) {
      if (!defined_[i]) {
        return absl::InvalidArgumentError(
            absl::StrCat("rule ", rules_[i].name, " is used but not defined"));
      }
    }
    auto root_rule = ids_.find("root");
    if (root_rule == ids_.end())
      return absl::InvalidArgumentError("the grammar has no rule `root`");
    size_t elements = 0;
    for (const Rule& r : rules_) {
      for (const Sequence& s : r.alternatives) elements += s.size();
    }
    if (elements > limits_.max_elements) {
      return absl::InvalidArgumentError(absl::StrCat("the grammar has ", elements,
                                                     " elements, more than the limit of ",
                                                     limits_.max_elements));
    }
    *root = root_rule->second;
    *rules = std::move(rules_);
    return absl::OkStatus();
  }

 private:
  // The rule named `name`, made (undefined) on first mention; -1 past max_rules.
  int RuleId(std::string_view name) {
    auto [it, inserted] = ids_.emplace(std::string(name), static_cast<int>(rules_.size()));
    if (inserted) {
      if (rules_.size() >= limits_.max_rules) return -1;
      rules_.push_back(Rule{std::string(name), {}});
      defined_.push_back(false);
    }
    return it->second;
  }

  // A rule of its own for a group or a repetition inside `owner`.
  int NewRule(std::string_view owner, std::vector<Sequence> alternatives) {
    if (rules_.size() >= limits_.max_rules) {
      SetError(TooMany());
      return -1;
    }
    // owner-N, the first N not taken (a grammar may name its own rules so).
    std::string name;
    do {
      name = absl::StrCat(A(owner), "-", ++generated_[std::string(owner)]);
    } while (ids_.contains(name));
    ids_.emplace(name, static_cast<int>(rules_.size()));
    rules_.push_back(Rule{name, std::move(alternatives)});
    defined_.push_back(true);
    return static_cast<int>(rules_.size()) - 1;
  }

  absl::Status TooMany() const {
    return absl::InvalidArgumentError(absl::StrCat("the grammar has more than ", limits_.max_rules,
                                                   " rules (groups and repetitions count)"));
  }

  void SkipSpace(bool newlines) {
    while (pos_ < text_.size()) {
      const char c = text_[pos_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n')) {
        ++pos_;
      } else if (c == '#') {
        while (pos_ < text_.size() && text_[pos_] != '\n') ++pos_;
      } else {
        break;
      }
    }
  }

  std::string_view ParseName() {
    const size_t start = pos_;
    while (pos_ < text_.size() && IsNameChar(text_[pos_])) ++pos_;
    return text_.substr(start, pos_ - start);
  }

  // Alternatives up to a ')' (nested) or the end of the line (a rule's body; a line
  // ending in '|' continues).
  std::optional<std::vector<Sequence>> ParseAlternatives(bool nested, int depth,
                                                         std::string_view owner) {
    std::vector<Sequence> alternatives;
    for (;;) {
      std::optional<Sequence> sequence = ParseSequence(nested, depth, owner);
      if (!sequence.has_value()) return std::nullopt;
      alternatives.push_back(*std::move(sequence));
      if (pos_ < text_.size() && text_[pos_] == '|') {
        ++pos_;
        SkipSpace(/*newlines=*/true);
        continue;
      }
      return alternatives;
    }
  }

  std::optional<Sequence> ParseSequence(bool nested, int depth, std::string_view owner) {
    Sequence sequence;
    for (;;) {
      SkipSpace(nested);
      if (pos_ == text_.size()) return sequence;
      const char c = text_[pos_];
      if (c == '"') {
        ++pos_;
        while (pos_ < text_.size() && text_[pos_] != '"') {
          std::optional<char32_t> cp = ParseChar();
          if (!cp.has_value()) return std::nullopt;
          sequence.push_back(Chars({{*cp, *cp}}));
        }
        if (pos_ == text_.size()) return Fail(pos_, "unterminated string literal");
        ++pos_;
      } else if (c == '[') {
        std::optional<Element> chars = ParseClass();
        if (!chars.has_value()) return std::nullopt;
        sequence.push_back(*std::move(chars));
      } else if (c == '(') {
        if (depth + 1 > limits_.max_nesting) {
          return Fail(pos_, absl::StrCat("groups nest deeper than ", limits_.max_nesting));
        }
        ++pos_;
        SkipSpace(/*newlines=*/true);
        std::optional<std::vector<Sequence>> inner = ParseAlternatives(true, depth + 1, owner);
        if (!inner.has_value()) return std::nullopt;
        SkipSpace(/*newlines=*/true);
        if (pos_ == text_.size() || text_[pos_] != ')') return Fail(pos_, "expected )");
        ++pos_;
        const int id = NewRule(owner, *std::move(inner));
        if (id < 0) return std::nullopt;
        sequence.push_back(RuleRef(id));
      } else if (IsNameChar(c)) {
        const size_t at = pos_;
        const std::string_view name = ParseName();
        if (text_.substr(pos_, 3) == "::=" ||
            (SkipSpaceCopy() < text_.size() && text_.substr(SkipSpaceCopy(), 3) == "::=")) {
          return Fail(at, "a new rule starts before this one ended (one rule per line)");
        }
        const int id = RuleId(name);
        if (id < 0) {
          SetError(TooMany());
          return std::nullopt;
        }
        sequence.push_back(RuleRef(id));
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (sequence.empty())
          return Fail(pos_, absl::StrCat("'", std::string(1, c), "' repeats nothing"));
        if (!Repeat(&sequence, owner)) return std::nullopt;
      } else {
        return sequence;  // '|', ')', the end of the line, or an error the caller reports.
      }
    }
  }

  // Where SkipSpace(false) would stop, without moving.
  size_t SkipSpaceCopy() const {
    size_t p = pos_;
    while (p < text_.size() && (text_[p] == ' ' || text_[p] == '\t')) ++p;
    return p;
  }

  // Applies the repetition at pos_ to the last element of `sequence`.
  bool Repeat(Sequence* sequence, std::string_view owner) {
    const size_t at = pos_;
    const char op = text_[pos_++];
    int min = 0, max = -1;  // max -1: unbounded.
    if (op == '*') {
      min = 0;
    } else if (op == '+') {
      min = 1;
    } else if (op == '?') {
      max = 1;
    } else {
      std::optional<int> m = ParseCount();
      if (!m.has_value()) return false;
      min = max = *m;
      if (pos_ < text_.size() && text_[pos_] == ',') {
        ++pos_;
        max = -1;
        if (pos_ < text_.size() && text_[pos_] != '}') {
          std::optional<int> n = ParseCount();
          if (!n.has_value()) return false;
          max = *n;
        }
      }
      if (pos_ == text_.size() || text_[pos_] != '}') {
        SetError(Error(pos_, "expected } to close the repetition"));
        return false;
      }
      ++pos_;
      if (max >= 0 && max < min) {
        SetError(Error(at, absl::StrCat("repetition {", min, ",", max,
                                        "}: the maximum is below the minimum")));
        return false;
      }
    }
    const Element item = sequence->back();
    sequence->pop_back();
    for (int i = 0; i < min; ++i) sequence->push_back(item);
    if (sequence->size() > limits_.max_elements) {
      SetError(absl::InvalidArgumentError(absl::StrCat("the grammar has more than ",
                                                       limits_.max_elements,
                                                       " elements (a repetition's copies count)")));
      return false;
    }
    if (max < 0) {
      // item*: R ::= item R | (empty), right-recursive.
      const int id = NewRule(owner, {});
      if (id < 0) return false;
      rules_[id].alternatives = {{item, RuleRef(id)}, {}};
      sequence->push_back(RuleRef(id));
    } else if (max > min) {
      // (max - min) optional items, nested: R1 ::= item R2 | (empty), ..., Rk ::= item | (empty).
      int next = -1;
      for (int k = 0; k < max - min; ++k) {
        Sequence with = {item};
        if (next >= 0) with.push_back(RuleRef(next));
        next = NewRule(owner, {with, {}});
        if (next < 0) return false;
      }
      sequence->push_back(RuleRef(next));
    }
    return true;
  }

  std::optional<int> ParseCount() {
    const size_t start = pos_;
    int64_t n = 0;
    while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
      n = n * 10 + (text_[pos_++] - '0');
      if (n > limits_.max_repeat) {
        SetError(
            Error(start, absl::StrCat("repetition count above the limit of ", limits_.max_repeat)));
        return std::nullopt;
      }
    }
    if (pos_ == start) {
      SetError(Error(pos_, "expected a repetition count"));
      return std::nullopt;
    }
    return static_cast<int>(n);
  }

  // One character of a literal or class, escapes decoded.
  std::optional<char32_t> ParseChar() {
    if (text_[pos_] != '\\') return NextChar(text_, &pos_);
    const size_t at = pos_;
    if (++pos_ == text_.size()) return Fail(at, "escape at the end of the grammar");
    const char e = text_[pos_++];
    switch (e) {
      case 'n':
        return U'\n';
      case 'r':
        return U'\r';
      case 't':
        return U'\t';
      case '\\':
      case '"':
      case '[':
      case ']':
      case '-':
      case '^':
        return static_cast<char32_t>(e);
      case 'x':
        return ParseHex(at, 2);
      case 'u':
        return ParseHex(at, 4);
      case 'U':
        return ParseHex(at, 8);
      default:
        return Fail(at, absl::StrCat("unknown escape \\", std::string(1, e)));
    }
  }

  std::optional<char32_t> ParseHex(size_t at, int digits) {
    uint32_t value = 0;
    for (int i = 0; i < digits; ++i) {
      if (pos_ == text_.size()) return Fail(at, "escape cut short");
      const char h = text_[pos_++];
      int d = -1;
      if (h >= '0' && h <= '9') d = h - '0';
      if (h >= 'a' && h <= 'f') d = h - 'a' + 10;
      if (h >= 'A' && h <= 'F') d = h - 'A' + 10;
      if (d < 0) return Fail(at, "escape with a non-hex digit");
      value = value * 16 + static_cast<uint32_t>(d);
    }
    if (value > kMaxCodePoint || (value >= 0xD800 && value <= 0xDFFF)) {
      return Fail(at, "escape names no Unicode scalar value");
    }
    return static_cast<char32_t>(value);
  }

  std::optional<Element> ParseClass() {
    const size_t at = pos_++;
    const bool negated = pos_ < text_.size() && text_[pos_] == '^';
    if (negated) ++pos_;
    std::vector<CharRange> ranges;
    while (pos_ < text_.size() && text_[pos_] != ']') {
      std::optional<char32_t> lo = ParseChar();
      if (!lo.has_value()) return std::nullopt;
      char32_t hi = *lo;
      if (pos_ + 1 < text_.size() && text_[pos_] == '-' && text_[pos_ + 1] != ']') {
        ++pos_;
        std::optional<char32_t> end = ParseChar();
        if (!end.has_value()) return std::nullopt;
        hi = *end;
        if (hi < *lo) return Fail(at, "character range whose end is below its start");
      }
      ranges.push_back({*lo, hi});
    }
    if (pos_ == text_.size()) return Fail(at, "unterminated character class");
    ++pos_;
    std::vector<CharRange> set = Normalized(std::move(ranges));
    if (negated) set = Complement(set);
    if (set.empty()) return Fail(at, "character class that matches nothing");
    return Chars(std::move(set));
  }

  // line:column of byte `at`.
  std::string Where(size_t at) const {
    int line = 1;
    size_t line_start = 0;
    for (size_t i = 0; i < at && i < text_.size(); ++i) {
      if (text_[i] == '\n') {
        ++line;
        line_start = i + 1;
      }
    }
    return absl::StrCat(line, ":", at - line_start + 1);
  }

  absl::Status Error(size_t at, std::string_view what) const {
    return absl::InvalidArgumentError(absl::StrCat("grammar ", Where(at), ": ", A(what)));
  }
  void SetError(absl::Status status) {
    if (error_.ok()) error_ = std::move(status);
  }
  std::nullopt_t Fail(size_t at, std::string_view what) {
    SetError(Error(at, what));
    return std::nullopt;
  }

  std::string_view text_;
  size_t pos_ = 0;
  const Limits& limits_;
  std::vector<Rule> rules_;
  std::vector<bool> defined_;
  std::map<std::string, int, std::less<>> ids_;
  std::map<std::string, int> generated_;
  absl::Status error_;
};

// Which rules derive a string of the kind asked: with `chars_count`, a finite string
// (productive rules); without, the empty string (nullable rules). Linear in the grammar:
// each alternative counts its elements not yet known to qualify.
std::vector<bool> Derives(const std::vector<Rule>& rules, bool chars_count) {
  std::vector<int> pending;
  std::vector<int> owner;
  std::vector<std::vector<int>> waiting(rules.size());  // Alternatives, per rule they use.
  std::vector<bool> derives(rules.size(), false);
  std::vector<int> queue;
  for (size_t r = 0; r < rules.size(); ++r) {
    for (const Sequence& alternative : rules[r].alternatives) {
      const int k = static_cast<int>(pending.size());
      int count = 0;
      bool possible = true;
      for (const Element& e : alternative) {
        if (e.kind == Element::Kind::kChars) {
          possible &= chars_count;
        } else {
          ++count;
          waiting[e.rule].push_back(k);
        }
      }
      pending.push_back(possible ? count : -1);
      owner.push_back(static_cast<int>(r));
      if (possible && count == 0 && !derives[r]) {
        derives[r] = true;
        queue.push_back(static_cast<int>(r));
      }
    }
  }
  while (!queue.empty()) {
    const int r = queue.back();
    queue.pop_back();
    for (int k : waiting[r]) {
      if (pending[k] > 0 && --pending[k] == 0 && !derives[owner[k]]) {
        derives[owner[k]] = true;
        queue.push_back(owner[k]);
      }
    }
  }
  return derives;
}

// Every rule must derive some finite string, and none may reach itself before reading a
// character (left recursion, through nullable prefixes too).
absl::Status CheckDerivations(const std::vector<Rule>& rules) {
  const std::vector<bool> productive = Derives(rules, true);
  for (size_t r = 0; r < rules.size(); ++r) {
    if (!productive[r]) {
      return absl::InvalidArgumentError(
          absl::StrCat("rule ", rules[r].name, " derives no finite string"));
    }
  }
  const std::vector<bool> nullable = Derives(rules, false);
  // Edges to the rules each rule may expand before it reads a character.
  std::vector<std::vector<int>> first(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    for (const Sequence& alternative : rules[r].alternatives) {
      for (const Element& e : alternative) {
        if (e.kind == Element::Kind::kChars) break;
        first[r].push_back(e.rule);
        if (!nullable[e.rule]) break;
      }
    }
  }
  // Iterative depth-first search for a cycle: 0 unseen, 1 on the path, 2 done.
  std::vector<int> state(rules.size(), 0);
  for (size_t start = 0; start < rules.size(); ++start) {
    if (state[start] != 0) continue;
    std::vector<std::pair<int, size_t>> path = {{static_cast<int>(start), 0}};
    state[start] = 1;
    while (!path.empty()) {
      auto& [r, next] = path.back();
      if (next == first[r].size()) {
        state[r] = 2;
        path.pop_back();
        continue;
      }
      const int to = first[r][next++];
      if (state[to] == 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            "rule ", rules[to].name,
            " is left-recursive (it can reach itself before reading a character); write the "
            "repetition with * or + instead"));
      }
      if (state[to] == 0) {
        state[to] = 1;
        path.emplace_back(to, 0);
      }
    }
  }
  return absl::OkStatus();
}

void AppendEscaped(char32_t c, bool in_class, std::string* out) {
  if (c == '\\' || c == '"' || (in_class && (c == ']' || c == '-' || c == '^' || c == '['))) {
    out->push_back('\\');
    out->push_back(static_cast<char>(c));
  } else if (c < 0x20 || c == 0x7F) {
    absl::StrAppend(out, "\\x", absl::Hex(static_cast<uint32_t>(c), absl::kZeroPad2));
  } else {
    AppendUtf8(c, out);
  }
}

}  // namespace

absl::StatusOr<Grammar> Grammar::Parse(std::string_view text, const Limits& limits) {
  Grammar grammar;
  Parser parser(text, limits);
  if (absl::Status parsed = parser.Run(&grammar.rules_, &grammar.root_); !parsed.ok()) {
    return parsed;
  }
  if (absl::Status checked = CheckDerivations(grammar.rules_); !checked.ok()) return checked;
  return grammar;
}

std::string Grammar::ToString() const {
  std::string out;
  for (const Rule& rule : rules_) {
    absl::StrAppend(&out, rule.name, " ::=");
    for (size_t a = 0; a < rule.alternatives.size(); ++a) {
      if (a > 0) out += " |";
      const Sequence& sequence = rule.alternatives[a];
      if (sequence.empty()) out += " \"\"";
      bool in_literal = false;  // Runs of single characters print as one literal.
      for (const Element& e : sequence) {
        const bool single = e.kind == Element::Kind::kChars && e.chars.size() == 1 &&
                            e.chars[0].lo == e.chars[0].hi;
        if (in_literal && !single) {
          out += '"';
          in_literal = false;
        }
        if (single) {
          if (!in_literal) out += " \"";
          in_literal = true;
          AppendEscaped(e.chars[0].lo, false, &out);
        } else if (e.kind == Element::Kind::kRule) {
          absl::StrAppend(&out, " ", rules_[e.rule].name);
        } else {
          out += " [";
          for (const CharRange& r : e.chars) {
            AppendEscaped(r.lo, true, &out);
            if (r.hi != r.lo) {
              out += '-';
              AppendEscaped(r.hi, true, &out);
            }
          }
          out += ']';
        }
      }
      if (in_literal) out += '"';
    }
    out += '\n';
  }
  return out;
}

bool Element::Matches(char32_t c) const { return MatchesAnyOf(c, c); }

bool Element::MatchesAnyOf(char32_t lo, char32_t hi) const {
  // The first range that ends at or after lo.
  auto it = std::lower_bound(chars.begin(), chars.end(), lo,
                             [](const CharRange& r, char32_t v) { return r.hi < v; });
  return it != chars.end() && it->lo <= hi;
}

size_t Grammar::num_elements() const {
  size_t n = 0;
  for (const Rule& r : rules_) {
    for (const Sequence& s : r.alternatives) n += s.size();
  }
  return n;
}

}  // namespace conveyor::grammar
