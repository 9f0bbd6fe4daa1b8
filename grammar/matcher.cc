#include "grammar/matcher.h"

#include <algorithm>
#include <tuple>
#include <utility>

namespace conveyor::grammar {
namespace {

// Bytes of the UTF-8 character that `lead` starts; 0 if no well-formed one does.
int Utf8Length(uint8_t lead) {
  if (lead >= 0xC2 && lead <= 0xDF) return 2;
  if (lead >= 0xE0 && lead <= 0xEF) return 3;
  if (lead >= 0xF0 && lead <= 0xF4) return 4;
  return 0;
}

// Whether `second` may follow `lead` in well-formed UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF).
bool SecondByteAllowed(uint8_t lead, uint8_t second) {
  if ((second & 0xC0) != 0x80) return false;
  switch (lead) {
    case 0xE0:
      return second >= 0xA0;
    case 0xED:
      return second <= 0x9F;
    case 0xF0:
      return second >= 0x90;
    case 0xF4:
      return second <= 0x8F;
    default:
      return true;
  }
}

// The code points whose encoding starts with bytes[0..size) of a `need`-byte character.
std::pair<char32_t, char32_t> CompletionRange(const uint8_t* bytes, int size, int need) {
  static constexpr uint8_t kLeadMask[5] = {0, 0, 0x1F, 0x0F, 0x07};
  char32_t value = bytes[0] & kLeadMask[need];
  for (int i = 1; i < size; ++i) value = (value << 6) | (bytes[i] & 0x3F);
  const int missing = 6 * (need - size);
  char32_t lo = value << missing;
  char32_t hi = lo + ((char32_t{1} << missing) - 1);
  // The lead byte alone also covers overlong forms and surrogates: leave them out.
  if (need == 3 && bytes[0] == 0xE0) lo = std::max<char32_t>(lo, 0x800);
  if (need == 3 && bytes[0] == 0xED) hi = std::min<char32_t>(hi, 0xD7FF);
  if (need == 4 && bytes[0] == 0xF0) lo = std::max<char32_t>(lo, 0x10000);
  if (need == 4) hi = std::min<char32_t>(hi, 0x10FFFF);
  return {lo, hi};
}

char32_t Decode(const uint8_t* bytes, int size) {
  static constexpr uint8_t kLeadMask[5] = {0, 0x7F, 0x1F, 0x0F, 0x07};
  char32_t value = bytes[0] & kLeadMask[size];
  for (int i = 1; i < size; ++i) value = (value << 6) | (bytes[i] & 0x3F);
  return value;
}

}  // namespace

Matcher::Matcher(std::shared_ptr<const Grammar> grammar) : grammar_(std::move(grammar)) { Reset(); }

void Matcher::Reset() {
  history_.clear();
  state_ = State();
  const int root = grammar_->root();
  const Rule& rule = grammar_->rules()[root];
  for (size_t a = 0; a < rule.alternatives.size(); ++a) {
    Expand(Stack{{root, static_cast<int32_t>(a), 0}}, &state_.stacks);
  }
  std::sort(state_.stacks.begin(), state_.stacks.end(), [](const Stack& x, const Stack& y) {
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end(),
                                        [](const Position& a, const Position& b) {
                                          return std::tie(a.rule, a.alternative, a.index) <
                                                 std::tie(b.rule, b.alternative, b.index);
                                        });
  });
  state_.stacks.erase(std::unique(state_.stacks.begin(), state_.stacks.end()), state_.stacks.end());
}

const Element& Matcher::Top(const Stack& stack) const {
  const Position& p = stack.back();
  return grammar_->rules()[p.rule].alternatives[p.alternative][p.index];
}

void Matcher::Expand(Stack stack, std::vector<Stack>* out) const {
  const std::vector<Rule>& rules = grammar_->rules();
  std::vector<Stack> work;
  work.push_back(std::move(stack));
  while (!work.empty()) {
    Stack s = std::move(work.back());
    work.pop_back();
    if (s.empty()) {
      out->push_back(std::move(s));  // The sentence may end here.
      continue;
    }
    Position& p = s.back();
    const Sequence& sequence = rules[p.rule].alternatives[p.alternative];
    if (p.index == static_cast<int32_t>(sequence.size())) {
      s.pop_back();  // The rule is complete: back to its caller.
      work.push_back(std::move(s));
      continue;
    }
    const Element& e = sequence[p.index];
    if (e.kind == Element::Kind::kChars) {
      out->push_back(std::move(s));
      continue;
    }
    const int32_t callee = e.rule;
    ++p.index;
    // A call in last position replaces its caller (nothing is left to do there).
    if (p.index == static_cast<int32_t>(sequence.size())) s.pop_back();
    const int32_t n = static_cast<int32_t>(rules[callee].alternatives.size());
    for (int32_t a = 0; a + 1 < n; ++a) {
      Stack next = s;
      next.push_back({callee, a, 0});
      work.push_back(std::move(next));
    }
    s.push_back({callee, n - 1, 0});  // Every rule has an alternative at least.
    work.push_back(std::move(s));
  }
}

std::vector<Matcher::Stack> Matcher::Advance(const std::vector<Stack>& stacks, char32_t c) const {
  std::vector<Stack> out;
  for (const Stack& stack : stacks) {
    if (stack.empty() || !Top(stack).Matches(c)) continue;
    Stack next = stack;
    ++next.back().index;
    Expand(std::move(next), &out);
  }
  auto less = [](const Stack& x, const Stack& y) {
    return std::lexicographical_compare(x.begin(), x.end(), y.begin(), y.end(),
                                        [](const Position& a, const Position& b) {
                                          return std::tie(a.rule, a.alternative, a.index) <
                                                 std::tie(b.rule, b.alternative, b.index);
                                        });
  };
  std::sort(out.begin(), out.end(), less);
  out.erase(std::unique(out.begin(), out.end()), out.end());
  return out;
}

bool Matcher::AnyAllows(const std::vector<Stack>& stacks, char32_t lo, char32_t hi) const {
  return std::any_of(stacks.begin(), stacks.end(),
                     [&](const Stack& s) { return !s.empty() && Top(s).MatchesAnyOf(lo, hi); });
}

bool Matcher::AcceptByte(uint8_t byte) {
  State next = state_;
  if (next.pending_size == 0 && byte < 0x80) {
    next.stacks = Advance(next.stacks, byte);
    if (next.stacks.empty()) return false;
  } else {
    if (next.pending_size == 0) {
      next.pending_need = Utf8Length(byte);
      if (next.pending_need == 0) return false;
    } else if (next.pending_size == 1 ? !SecondByteAllowed(next.pending[0], byte)
                                      : (byte & 0xC0) != 0x80) {
      return false;
    }
    next.pending[next.pending_size++] = byte;
    if (next.pending_size == next.pending_need) {
      next.stacks = Advance(next.stacks, Decode(next.pending, next.pending_size));
      if (next.stacks.empty()) return false;
      next.pending_size = 0;
      next.pending_need = 0;
    } else {
      const auto [lo, hi] = CompletionRange(next.pending, next.pending_size, next.pending_need);
      if (!AnyAllows(next.stacks, lo, hi)) return false;
    }
  }
  history_.push_back(std::move(state_));
  state_ = std::move(next);
  return true;
}

bool Matcher::Accept(std::string_view bytes) {
  const size_t before = num_accepted();
  for (char b : bytes) {
    if (!AcceptByte(static_cast<uint8_t>(b))) {
      Rollback(num_accepted() - before);
      return false;
    }
  }
  return true;
}

bool Matcher::CanEnd() const {
  return state_.pending_size == 0 && std::any_of(state_.stacks.begin(), state_.stacks.end(),
                                                 [](const Stack& s) { return s.empty(); });
}

bool Matcher::CanContinue() const {
  return std::any_of(state_.stacks.begin(), state_.stacks.end(),
                     [](const Stack& s) { return !s.empty(); });
}

void Matcher::Rollback(size_t n) {
  if (n == 0) return;
  state_ = std::move(history_[history_.size() - n]);
  history_.resize(history_.size() - n);
}

}  // namespace conveyor::grammar
