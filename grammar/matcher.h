// Reads text byte by byte against a Grammar and says, at every point, whether the text so
// far can still become a sentence (the bytes are accepted) and whether it is one already
// (CanEnd): what a token mask needs to know (docs/structured-output.md).
//
// The state is a set of parse stacks, as a pushdown automaton over the grammar keeps them:
// each stack is a path of rule positions whose top is the character set the next code
// point must be in (or empty: the sentence may end). A byte that is part of a longer UTF-8
// character is accepted when some code point that starts with the bytes so far is allowed
// by some stack, so a token may end in the middle of a character. A rule reference in last
// position replaces its caller's frame (a tail call), so right-recursive repetition keeps
// the stacks short. Stacks are deduplicated after every character.
//
// Not thread-safe; one per sequence. The Grammar is shared and immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "grammar/grammar.h"

namespace conveyor::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<const Grammar> grammar);

  // Feeds `bytes`; false if the grammar cannot continue with them, and then the state is
  // what it was before the call.
  bool Accept(std::string_view bytes);
  bool AcceptByte(uint8_t byte);

  // The bytes so far are a sentence of the grammar (EOS may come now).
  bool CanEnd() const;
  // Some byte may follow.
  bool CanContinue() const;

  // Bytes accepted since construction (or Reset, or Commit): those Rollback can take back.
  size_t num_accepted() const { return history_.size(); }
  // Takes back the last `n` accepted bytes (n <= num_accepted()).
  void Rollback(size_t n);
  // Makes the bytes accepted so far permanent, freeing what Rollback would need (a
  // sequence commits each sampled token, so its matcher's memory stays flat).
  void Commit() { history_.clear(); }
  // Back to the start.
  void Reset();

 private:
  struct Position {
    int32_t rule = 0;
    int32_t alternative = 0;
    int32_t index = 0;  // The next element of the alternative.
    bool operator==(const Position&) const = default;
  };
  using Stack = std::vector<Position>;  // Top at the back.

  struct State {
    std::vector<Stack> stacks;  // Tops are character elements; an empty stack may end.
    // A character read in part: its bytes so far and how many it has in all.
    uint8_t pending[4] = {0, 0, 0, 0};
    int pending_size = 0;
    int pending_need = 0;
  };

  static void Deduplicate(std::vector<Stack>* stacks);
  const Element& Top(const Stack& stack) const;
  // Expands `stack` until its top is a character element, adding each result (and the
  // empty stack, where the sentence may end) to `out`.
  void Expand(Stack stack, std::vector<Stack>* out) const;
  // The stacks after the code point `c`; empty if none allows it.
  std::vector<Stack> Advance(const std::vector<Stack>& stacks, char32_t c) const;
  // Whether a stack allows some code point in [lo, hi].
  bool AnyAllows(const std::vector<Stack>& stacks, char32_t lo, char32_t hi) const;

  std::shared_ptr<const Grammar> grammar_;
  State state_;
  std::vector<State> history_;  // The state before each accepted byte.
};

}  // namespace conveyor::grammar
