// Draft tokens for speculative decoding from the longest repeat: where the longest suffix
// of a sequence (prompt and output) that occurred before ends, what followed it there is
// proposed to follow now. Unlike prompt lookup (ngram_proposer.h), which matches at most
// a few tokens, the match may be any length, so a passage being copied keeps being found
// however often its short n-grams recur elsewhere.
//
// A suffix automaton of the sequence, extended token by token as it grows (amortised
// constant time per token, at most 2n states): the state of the whole sequence's suffix
// link is its longest suffix that also ends earlier, and each state keeps the end of its
// first occurrence.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

namespace conveyor::scheduler {

class SuffixIndex {
 public:
  SuffixIndex();
  ~SuffixIndex();
  SuffixIndex(SuffixIndex&&) noexcept;
  SuffixIndex& operator=(SuffixIndex&&) noexcept;

  // Indexes tokens[size() ...]: `tokens` must begin with the tokens indexed so far.
  void Extend(std::span<const int32_t> tokens);
  int size() const;

  // Up to `k` tokens that followed the first occurrence of the longest suffix of the
  // indexed tokens that also ends earlier, if that suffix has at least `min_match`
  // tokens; else none. `tokens` are the indexed ones (what the proposal is read from).
  std::vector<int32_t> Propose(std::span<const int32_t> tokens, int min_match, int k) const;

 private:
  struct Automaton;
  std::unique_ptr<Automaton> a_;
};

}  // namespace conveyor::scheduler
