#include "scheduler/suffix_proposer.h"

#include <algorithm>
#include <cassert>

#include "absl/container/flat_hash_map.h"

namespace conveyor::scheduler {

// The standard online construction (Blumer et al.; a state per endpos class). Transitions
// live in one hash map keyed by (state, token): vocabularies are large and most states
// have few of them; each state lists its tokens too, for cloning.
struct SuffixIndex::Automaton {
  struct State {
    int len = 0;               // Longest string of the state.
    int link = -1;             // Suffix link.
    int first_end = 0;         // End position (inclusive) of the first occurrence.
    std::vector<int32_t> out;  // Tokens it has transitions on (to copy them to a clone).
  };
  std::vector<State> states{State{}};  // 0: the root (the empty string).
  absl::flat_hash_map<uint64_t, int32_t> next;
  int last = 0;
  int size = 0;  // Tokens indexed.

  static uint64_t Key(int state, int32_t token) {
    return static_cast<uint64_t>(state) << 32 | static_cast<uint32_t>(token);
  }
  int Next(int state, int32_t token) const {
    auto it = next.find(Key(state, token));
    return it == next.end() ? -1 : it->second;
  }

  void Add(int32_t token) {
    const int cur = static_cast<int>(states.size());
    states.push_back({states[last].len + 1, 0, size, {}});
    int p = last;
    while (p != -1 && Next(p, token) < 0) {
      next[Key(p, token)] = cur;
      states[p].out.push_back(token);
      p = states[p].link;
    }
    if (p != -1) {
      const int q = Next(p, token);
      if (states[p].len + 1 == states[q].len) {
        states[cur].link = q;
      } else {
        const int clone = static_cast<int>(states.size());
        states.push_back({states[p].len + 1, states[q].link, states[q].first_end, states[q].out});
        for (int32_t t : states[clone].out) next[Key(clone, t)] = next.at(Key(q, t));
        while (p != -1 && Next(p, token) == q) {
          next[Key(p, token)] = clone;
          p = states[p].link;
        }
        states[q].link = clone;
        states[cur].link = clone;
      }
    }
    last = cur;
    ++size;
  }
};

SuffixIndex::SuffixIndex() : a_(std::make_unique<Automaton>()) {}
SuffixIndex::~SuffixIndex() = default;
SuffixIndex::SuffixIndex(SuffixIndex&&) noexcept = default;
SuffixIndex& SuffixIndex::operator=(SuffixIndex&&) noexcept = default;

int SuffixIndex::size() const { return a_->size; }

void SuffixIndex::Extend(std::span<const int32_t> tokens) {
  for (size_t i = a_->size; i < tokens.size(); ++i) a_->Add(tokens[i]);
}

std::vector<int32_t> SuffixIndex::Propose(std::span<const int32_t> tokens, int min_match,
                                          int k) const {
  assert(static_cast<int>(tokens.size()) == a_->size);
  if (k <= 0 || a_->last == 0) return {};
  const int q = a_->states[a_->last].link;
  if (q <= 0 || a_->states[q].len < std::max(1, min_match)) return {};
  // q's strings end earlier than the last token (its endpos class is wider than the
  // whole sequence's), so at least one token follows its first occurrence.
  const int from = a_->states[q].first_end + 1;
  const int to = std::min(static_cast<int>(tokens.size()), from + k);
  return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
}

}  // namespace conveyor::scheduler
