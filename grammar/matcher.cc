#include "grammar/matcher.h"

#include <algorithm>
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

Matcher::Matcher(std::shared_ptr<const Grammar> grammar, const Context& context)
    : grammar_(std::move(grammar)) {
  int32_t stack = kEmpty;
  for (auto it = context.rbegin(); it != context.rend(); ++it) stack = Intern(*it, stack);
  Config start;
  Expand(stack, &start.stacks);
  std::sort(start.stacks.begin(), start.stacks.end());
  start.stacks.erase(std::unique(start.stacks.begin(), start.stacks.end()), start.stacks.end());
  state_ = InternConfig(start);
}

void Matcher::Reset() {
  history_.clear();
  Config start;
  const int root = grammar_->root();
  const Rule& rule = grammar_->rules()[root];
  for (size_t a = 0; a < rule.alternatives.size(); ++a) {
    Expand(Intern({root, static_cast<int32_t>(a), 0}, kEmpty), &start.stacks);
  }
  std::sort(start.stacks.begin(), start.stacks.end());
  start.stacks.erase(std::unique(start.stacks.begin(), start.stacks.end()), start.stacks.end());
  state_ = InternConfig(start);
}

int32_t Matcher::InternConfig(const Config& config) {
  const auto it = config_ids_.find(config);
  if (it != config_ids_.end()) return it->second;
  const auto id = static_cast<int32_t>(configs_.size());
  configs_.push_back(config);
  config_ids_.emplace(config, id);
  return id;
}

int32_t Matcher::Intern(Position position, int32_t below) {
  const auto [it, added] =
      frame_ids_.try_emplace(FrameKey{position, below}, static_cast<int32_t>(frames_.size()));
  if (added) frames_.push_back({position, below});
  return it->second;
}

const Element& Matcher::Top(int32_t stack) const {
  const Position& p = frames_[stack].position;
  return grammar_->rules()[p.rule].alternatives[p.alternative][p.index];
}

void Matcher::Expand(int32_t stack, std::vector<int32_t>* out) {
  const std::vector<Rule>& rules = grammar_->rules();
  work_.clear();
  work_.push_back(stack);
  while (!work_.empty()) {
    const int32_t s = work_.back();
    work_.pop_back();
    if (s == kEmpty) {
      out->push_back(kEmpty);  // The sentence may end here.
      continue;
    }
    const Frame frame = frames_[s];
    const Sequence& sequence = rules[frame.position.rule].alternatives[frame.position.alternative];
    if (frame.position.index == static_cast<int32_t>(sequence.size())) {
      work_.push_back(frame.below);  // The rule is complete: back to its caller.
      continue;
    }
    const Element& e = sequence[frame.position.index];
    if (e.kind == Element::Kind::kChars) {
      out->push_back(s);
      continue;
    }
    const int32_t callee = e.rule;
    Position after = frame.position;
    ++after.index;
    // A call in last position replaces its caller (nothing is left to do there).
    const int32_t caller = after.index == static_cast<int32_t>(sequence.size())
                               ? frame.below
                               : Intern(after, frame.below);
    const int32_t n = static_cast<int32_t>(rules[callee].alternatives.size());
    for (int32_t a = 0; a < n; ++a) work_.push_back(Intern({callee, a, 0}, caller));
  }
}

void Matcher::Advance(const std::vector<int32_t>& stacks, char32_t c, std::vector<int32_t>* out) {
  out->clear();
  for (const int32_t stack : stacks) {
    if (stack == kEmpty || !Top(stack).Matches(c)) continue;
    Position next = frames_[stack].position;
    ++next.index;
    Expand(Intern(next, frames_[stack].below), out);
  }
  std::sort(out->begin(), out->end());
  out->erase(std::unique(out->begin(), out->end()), out->end());
}

bool Matcher::AnyAllows(const std::vector<int32_t>& stacks, char32_t lo, char32_t hi) const {
  return std::any_of(stacks.begin(), stacks.end(),
                     [&](int32_t s) { return s != kEmpty && Top(s).MatchesAnyOf(lo, hi); });
}

bool Matcher::AcceptByte(uint8_t byte) {
  const uint64_t key = (static_cast<uint64_t>(state_) << 8) | byte;
  int32_t next;
  if (const auto it = transitions_.find(key); it != transitions_.end()) {
    next = it->second;
  } else {
    next = Step(state_, byte);
    if (transitions_.size() < kMaxTransitions) transitions_.emplace(key, next);
  }
  if (next == kRefused) return false;
  history_.push_back(state_);
  state_ = next;
  return true;
}

int32_t Matcher::Step(int32_t config, uint8_t byte) {
  // configs_ grows only in InternConfig, at the end: `from` stays valid until then.
  const Config& from = configs_[config];
  Config next;
  next.pending_size = from.pending_size;
  next.pending_need = from.pending_need;
  std::copy(std::begin(from.pending), std::end(from.pending), std::begin(next.pending));
  if (next.pending_size == 0 && byte < 0x80) {
    Advance(from.stacks, byte, &next.stacks);
    if (next.stacks.empty()) return kRefused;
  } else {
    if (next.pending_size == 0) {
      next.pending_need = Utf8Length(byte);
      if (next.pending_need == 0) return kRefused;
    } else if (next.pending_size == 1 ? !SecondByteAllowed(next.pending[0], byte)
                                      : (byte & 0xC0) != 0x80) {
      return kRefused;
    }
    next.pending[next.pending_size++] = byte;
    if (next.pending_size == next.pending_need) {
      Advance(from.stacks, Decode(next.pending, next.pending_size), &next.stacks);
      if (next.stacks.empty()) return kRefused;
      std::fill(std::begin(next.pending), std::end(next.pending), 0);
      next.pending_size = 0;
      next.pending_need = 0;
    } else {
      const auto [lo, hi] = CompletionRange(next.pending, next.pending_size, next.pending_need);
      if (!AnyAllows(from.stacks, lo, hi)) return kRefused;
      next.stacks = from.stacks;
    }
  }
  return InternConfig(next);
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
  // kEmpty sorts first.
  const Config& c = configs_[state_];
  return c.pending_size == 0 && !c.stacks.empty() && c.stacks.front() == kEmpty;
}

bool Matcher::CanContinue() const {
  const Config& c = configs_[state_];
  return !c.stacks.empty() && c.stacks.back() != kEmpty;
}

std::vector<Matcher::Context> Matcher::NextContexts(int depth) const {
  std::vector<Context> out;
  for (const int32_t s : configs_[state_].stacks) {
    Context context;
    for (int32_t f = s; f != kEmpty && static_cast<int>(context.size()) < depth;
         f = frames_[f].below) {
      context.push_back(frames_[f].position);
    }
    if (context.empty()) continue;
    if (std::find(out.begin(), out.end(), context) == out.end()) out.push_back(std::move(context));
  }
  return out;
}

void Matcher::Rollback(size_t n) {
  if (n == 0) return;
  state_ = history_[history_.size() - n];
  history_.resize(history_.size() - n);
}

}  // namespace conveyor::grammar
