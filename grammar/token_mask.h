// Which tokens of a vocabulary a Matcher allows next: the mask the sampler applies
// (docs/structured-output.md).
//
// The vocabulary's byte strings are sorted once, so tokens that share a prefix are
// neighbours: the mask walks them in order, rolls the matcher back only to the prefix the
// next token shares with the last, and when a byte is refused skips every following token
// that shares the refused prefix. That is a walk of the token trie without building it.
//
// With a MaskCache, most of the work is done once per grammar context instead of once per
// step (the approach of XGrammar, Dong et al., 2024). A context is the top few frames of a
// parse stack (the character element the parse may read next, and the rule positions it
// returns to): the tokens split into those the context accepts whole (accepted whatever
// lies below it on the stack), those it refuses, and those that run past its last frame,
// whose fate depends on the stack below. A mask is then the union of its contexts'
// accepted sets, plus their uncertain tokens checked against the whole state. A few
// frames, not one, because a rule is often a single character (JSON's string character
// returns to the string's loop after one byte); with six, a token inside a string and
// most that close one (`",`) are decided in their context. Contexts are computed when
// first needed and shared by every sequence of the grammar.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
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
  friend class MaskCache;

  // Feeds the sorted tokens to `matcher` as a trie walk: rolls back only to the prefix a
  // token shares with the one before, and skips every token under a refused prefix.
  // Calls on_byte(depth) after each byte accepted (depth bytes of the current token in),
  // on_accepted(id) for each token accepted whole, and on_refused(begin, end, depth) for the
  // tokens sorted_[begin, end) refused at their byte `depth`. The matcher ends as it began.
  template <typename OnByte, typename OnAccepted, typename OnRefused>
  void Walk(Matcher& matcher, OnByte on_byte, OnAccepted on_accepted, OnRefused on_refused) const;
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

// Per grammar and vocabulary: each context's split of the vocabulary. Thread-safe (the
// sequences of one grammar share one); bounded by `max_contexts` (contexts beyond it are
// computed each time, not kept).
class MaskCache {
 public:
  static constexpr int kContextDepth = 6;

  MaskCache(std::shared_ptr<const Grammar> grammar, const Vocabulary* vocabulary,
            size_t max_contexts = 512);
  ~MaskCache();
  MaskCache(const MaskCache&) = delete;
  MaskCache& operator=(const MaskCache&) = delete;

  struct Entry {
    Bitmask accepted;                // Accepted whatever the context.
    std::vector<int32_t> uncertain;  // Run past the rule's end: depend on the context.
  };
  // The split at `context`, computed on first use.
  std::shared_ptr<const Entry> Get(const Matcher::Context& given);

  size_t num_contexts() const;
  const Grammar& grammar() const { return *grammar_; }
  const std::shared_ptr<const Grammar>& shared_grammar() const { return grammar_; }

 private:
  Entry Compute(const Matcher::Context& context) const;
  // `context` with each frame moved to the first of the positions that behave alike for
  // any token: inside a long run of one repeated element (x{1000} is a thousand copies),
  // every position with more copies ahead than a token has bytes reads the same.
  Matcher::Context Canonical(Matcher::Context context) const;

  std::shared_ptr<const Grammar> grammar_;
  const Vocabulary* vocabulary_;
  size_t max_contexts_;
  mutable std::mutex mutex_;
  absl::flat_hash_map<Matcher::Context, std::shared_ptr<const Entry>> entries_;
  // canonical_[rule][alternative][index]: the position it behaves as (empty: itself).
  std::vector<std::vector<std::vector<int32_t>>> canonical_;
};

class TokenMasker {
 public:
  // `cache`, when given, must be for the matchers' grammar and this vocabulary.
  explicit TokenMasker(const Vocabulary* vocabulary, MaskCache* cache = nullptr)
      : vocabulary_(vocabulary), cache_(cache) {}

  // The tokens `matcher` allows next. The matcher ends as it began.
  Bitmask Compute(Matcher& matcher) const;

 private:
  friend class MaskCache;
  // Compute without the cache: the trie walk.
  Bitmask Walk(Matcher& matcher) const;

  const Vocabulary* vocabulary_;
  MaskCache* cache_;
};

}  // namespace conveyor::grammar
