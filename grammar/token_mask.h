// Which tokens of a vocabulary a Matcher allows next: the mask the sampler applies
// (docs/structured-output.md).
//
// The vocabulary's byte strings are sorted once, so tokens that share a prefix are
// neighbours: the mask walks them in order, rolls the matcher back only to the prefix the
// next token shares with the last, and when a byte is refused skips every following token
// that shares the refused prefix. That is a walk of the token trie without building it.
// (Context-independent tokens cached per grammar position, the next speed-up, are not
// here yet.)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "grammar/matcher.h"

namespace conveyor::grammar {

class Vocabulary {
 public:
  // `token_bytes[id]`: what token `id` adds to the text (empty for tokens that add nothing
  // or are special). `special[id]`: a control token (never allowed inside the grammar's
  // text). `eos_ids`: the tokens that end generation, allowed exactly where the grammar's
  // sentence may end.
  Vocabulary(std::vector<std::string> token_bytes, std::vector<bool> special,
             std::vector<int32_t> eos_ids);

  int32_t size() const { return static_cast<int32_t>(bytes_.size()); }
  const std::string& bytes(int32_t id) const { return bytes_[id]; }

 private:
  friend class TokenMasker;
  std::vector<std::string> bytes_;
  std::vector<int32_t> eos_ids_;
  // Ordinary tokens with bytes, sorted by their bytes; and, for each, the length of the
  // prefix it shares with the one before it.
  std::vector<int32_t> sorted_;
  std::vector<int32_t> shared_prefix_;
};

// A bit per token, 32 to a word: bit (id % 32) of word (id / 32).
using Bitmask = std::vector<uint32_t>;

inline bool Allowed(const Bitmask& mask, int32_t id) {
  return (mask[static_cast<size_t>(id) / 32] >> (id % 32)) & 1u;
}

class TokenMasker {
 public:
  explicit TokenMasker(const Vocabulary* vocabulary) : vocabulary_(vocabulary) {}

  // The tokens `matcher` allows next. The matcher ends as it began.
  Bitmask Compute(Matcher& matcher) const;

 private:
  const Vocabulary* vocabulary_;
};

}  // namespace conveyor::grammar
