#include "grammar/token_mask.h"

#include <algorithm>
#include <utility>

namespace conveyor::grammar {

Vocabulary::Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> special,
                       std::vector<int32_t> eos_ids)
    : bytes_(std::move(token_bytes)), eos_ids_(std::move(eos_ids)) {
  for (int32_t id = 0; id < size(); ++id) {
    // EOS is allowed where the sentence may end, never for its bytes.
    const bool is_special = (static_cast<size_t>(id) < special.size() && special[id]) ||
                            std::find(eos_ids_.begin(), eos_ids_.end(), id) != eos_ids_.end();
    if (!is_special && !bytes_[id].empty()) sorted_.push_back(id);
  }
  std::sort(sorted_.begin(), sorted_.end(),
            [&](int32_t a, int32_t b) { return bytes_[a] < bytes_[b]; });
  shared_prefix_.resize(sorted_.size(), 0);
  for (size_t i = 1; i < sorted_.size(); ++i) {
    const std::string& prev = bytes_[sorted_[i - 1]];
    const std::string& cur = bytes_[sorted_[i]];
    const size_t limit = std::min(prev.size(), cur.size());
    size_t k = 0;
    while (k < limit && prev[k] == cur[k]) ++k;
    shared_prefix_[i] = static_cast<int32_t>(k);
  }
}

template <typename OnByte, typename OnAccepted, typename OnRefused>
void Vocabulary::Walk(Matcher& matcher, OnByte on_byte, OnAccepted on_accepted,
                      OnRefused on_refused) const {
  const size_t start = matcher.num_accepted();
  // The bytes of the current path the matcher holds beyond `start`, and how many of them.
  size_t depth = 0;
  const std::string* path = nullptr;
  for (size_t i = 0; i < sorted_.size();) {
    const int32_t id = sorted_[i];
    const std::string& bytes = bytes_[id];
    // Back to what this token shares with the bytes the matcher holds.
    size_t common = 0;
    if (path != nullptr) {
      const size_t limit = std::min({depth, bytes.size(), path->size()});
      while (common < limit && (*path)[common] == bytes[common]) ++common;
    }
    matcher.Rollback(depth - common);
    depth = common;
    path = &bytes;
    bool ok = true;
    while (depth < bytes.size()) {
      if (!matcher.AcceptByte(static_cast<uint8_t>(bytes[depth]))) {
        ok = false;
        break;
      }
      ++depth;
      on_byte(depth);
    }
    if (ok) {
      on_accepted(id);
      ++i;
      continue;
    }
    // Refused at byte `depth`: every following token that shares bytes[0..depth] is refused
    // too.
    size_t j = i + 1;
    while (j < sorted_.size() && shared_prefix_[j] > static_cast<int32_t>(depth)) ++j;
    on_refused(i, j, depth);
    i = j;
  }
  matcher.Rollback(matcher.num_accepted() - start);
}

Bitmask TokenMasker::Walk(Matcher& matcher) const {
  const Vocabulary& v = *vocabulary_;
  Bitmask mask((static_cast<size_t>(v.size()) + 31) / 32, 0);
  auto allow = [&](int32_t id) { mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32); };
  if (matcher.CanEnd()) {
    for (int32_t eos : v.eos_ids_) allow(eos);
  }
  v.Walk(
      matcher, [](size_t) {}, allow, [](size_t, size_t, size_t) {});
  return mask;
}

namespace {

bool SameElement(const Element& a, const Element& b) {
  if (a.kind != b.kind) return false;
  if (a.kind == Element::Kind::kRule) return a.rule == b.rule;
  return std::equal(
      a.chars.begin(), a.chars.end(), b.chars.begin(), b.chars.end(),
      [](const CharRange& x, const CharRange& y) { return x.lo == y.lo && x.hi == y.hi; });
}

// Which rules derive the empty string (a fixpoint over the rules).
std::vector<bool> NullableRules(const Grammar& grammar) {
  const std::vector<Rule>& rules = grammar.rules();
  std::vector<bool> nullable(rules.size(), false);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < rules.size(); ++r) {
      if (nullable[r]) continue;
      for (const Sequence& alternative : rules[r].alternatives) {
        const bool empty = std::all_of(
            alternative.begin(), alternative.end(),
            [&](const Element& e) { return e.kind == Element::Kind::kRule && nullable[e.rule]; });
        if (empty) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  return nullable;
}

}  // namespace

MaskCache::MaskCache(std::shared_ptr<const Grammar> grammar, const Vocabulary* vocabulary,
                     size_t max_contexts)
    : grammar_(std::move(grammar)), vocabulary_(vocabulary), max_contexts_(max_contexts) {
  // A token of at most `window` bytes reads at most `window` elements that each take a
  // byte or more; from two positions of one run of a repeated such element with more than
  // `window` copies ahead, it reads the same elements and never reaches the run's end.
  size_t window = 1;
  for (const int32_t id : vocabulary_->sorted_)
    window = std::max(window, vocabulary_->bytes_[id].size());
  const std::vector<bool> nullable = NullableRules(*grammar_);
  const std::vector<Rule>& rules = grammar_->rules();
  canonical_.resize(rules.size());
  for (size_t r = 0; r < rules.size(); ++r) {
    canonical_[r].resize(rules[r].alternatives.size());
    for (size_t a = 0; a < rules[r].alternatives.size(); ++a) {
      const Sequence& sequence = rules[r].alternatives[a];
      if (sequence.size() <= window + 1) continue;
      std::vector<int32_t> canonical(sequence.size() + 1);
      for (size_t i = 0; i < canonical.size(); ++i) canonical[i] = static_cast<int32_t>(i);
      for (size_t begin = 0; begin < sequence.size();) {
        size_t end = begin + 1;
        while (end < sequence.size() && SameElement(sequence[end], sequence[begin])) ++end;
        const Element& e = sequence[begin];
        const bool takes_bytes = e.kind == Element::Kind::kChars || !nullable[e.rule];
        // Positions i with i + window < end: window + 1 copies ahead or more.
        if (takes_bytes && end - begin > window + 1) {
          for (size_t i = begin; i + window < end; ++i) canonical[i] = static_cast<int32_t>(begin);
        }
        begin = end;
      }
      canonical_[r][a] = std::move(canonical);
    }
  }
}

Matcher::Context MaskCache::Canonical(Matcher::Context context) const {
  for (Matcher::Position& p : context) {
    const std::vector<int32_t>& canonical = canonical_[p.rule][p.alternative];
    if (!canonical.empty()) p.index = canonical[p.index];
  }
  return context;
}

MaskCache::~MaskCache() = default;

size_t MaskCache::num_contexts() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::shared_ptr<const MaskCache::Entry> MaskCache::Get(const Matcher::Context& given) {
  const Matcher::Context context = Canonical(given);
  {
    std::lock_guard lock(mutex_);
    if (auto it = entries_.find(context); it != entries_.end()) return it->second;
  }
  // Computed outside the lock: two sequences may both compute a new context once.
  auto entry = std::make_shared<const Entry>(Compute(context));
  std::lock_guard lock(mutex_);
  if (entries_.size() < max_contexts_) entries_.try_emplace(context, entry);
  return entry;
}

MaskCache::Entry MaskCache::Compute(const Matcher::Context& context) const {
  const Vocabulary& v = *vocabulary_;
  Entry entry;
  entry.accepted.assign((static_cast<size_t>(v.size()) + 31) / 32, 0);
  // A matcher with nothing below `context`: where it CanEnd, the context is done and the
  // bytes after belong to whatever the real stack holds below.
  Matcher matcher(grammar_, context);
  // past_end[d]: some parse of the first d bytes of the current path left the context.
  std::vector<bool> past_end(1, matcher.CanEnd());
  v.Walk(
      matcher,
      [&](size_t depth) {
        past_end.resize(depth);
        past_end.push_back(past_end.back() || matcher.CanEnd());
      },
      [&](int32_t id) { entry.accepted[static_cast<size_t>(id) / 32] |= 1u << (id % 32); },
      [&](size_t begin, size_t end, size_t depth) {
        // Refused within the context; those it may have handed over before are uncertain.
        if (!past_end[depth]) return;
        for (size_t k = begin; k < end; ++k) entry.uncertain.push_back(v.sorted_[k]);
      });
  return entry;
}

Bitmask TokenMasker::Compute(Matcher& matcher) const {
  if (cache_ == nullptr || !matcher.AtCharacterBoundary()) return Walk(matcher);
  const Vocabulary& v = *vocabulary_;
  Bitmask mask((static_cast<size_t>(v.size()) + 31) / 32, 0);
  std::vector<std::shared_ptr<const MaskCache::Entry>> entries;
  for (const Matcher::Context& context : matcher.NextContexts(MaskCache::kContextDepth)) {
    entries.push_back(cache_->Get(context));
    const Bitmask& accepted = entries.back()->accepted;
    for (size_t w = 0; w < mask.size(); ++w) mask[w] |= accepted[w];
  }
  for (const auto& entry : entries) {
    for (const int32_t id : entry->uncertain) {
      if (Allowed(mask, id)) continue;
      if (matcher.Accept(v.bytes_[id])) {
        mask[static_cast<size_t>(id) / 32] |= 1u << (id % 32);
        matcher.Rollback(v.bytes_[id].size());
      }
    }
  }
  if (matcher.CanEnd()) {
    for (int32_t eos : v.eos_ids_) mask[static_cast<size_t>(eos) / 32] |= 1u << (eos % 32);
  }
  return mask;
}

}  // namespace conveyor::grammar
