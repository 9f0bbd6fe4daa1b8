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
// the stacks short. Stacks are interned frame chains, deduplicated after every character.
//
// Not thread-safe; one per sequence. The Grammar is shared and immutable.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "grammar/grammar.h"

namespace conveyor::grammar {

class MaskCache;

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

  const std::shared_ptr<const Grammar>& grammar() const { return grammar_; }

  // A grammar position: the element `index` of alternative `alternative` of rule `rule`.
  struct Position {
    int32_t rule = 0;
    int32_t alternative = 0;
    int32_t index = 0;
    bool operator==(const Position&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Position& p) {
      return H::combine(std::move(h), p.rule, p.alternative, p.index);
    }
  };

  // The top frames of a parse stack, top first: where the parse is, and where it returns.
  using Context = std::vector<Position>;

  // Whether the bytes so far end on a character boundary (no character read in part).
  bool AtCharacterBoundary() const { return configs_[state_].pending_size == 0; }
  // The top `depth` frames (fewer where a stack is shallower) of every parse stack, each
  // distinct context once.
  std::vector<Context> NextContexts(int depth) const;

 private:
  friend class MaskCache;
  // A matcher whose one stack is `context` (top first) with nothing below it: it CanEnd()
  // where a parse has returned from the context's last frame, which is where what lies
  // below in a real stack takes over.
  Matcher(std::shared_ptr<const Grammar> grammar, const Context& context);

  // A parse stack is a chain of frames, interned: a frame is a position and the frame
  // below it, so a stack is one id and equal stacks are equal ids. Copying a state copies
  // ids only, and advancing one character allocates nothing once its frames exist.
  static constexpr int32_t kEmpty = -1;  // The empty stack: the sentence may end.
  struct Frame {
    Position position;
    int32_t below = kEmpty;
  };
  struct FrameKey {
    Position position;
    int32_t below;
    bool operator==(const FrameKey&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const FrameKey& k) {
      return H::combine(std::move(h), k.position, k.below);
    }
  };

  // A configuration: every parse stack at one point, and a character read in part. Also
  // interned, and each (configuration, byte) transition remembered once computed, so the
  // matcher is a DFA built as it is used: a byte it has seen in a configuration before
  // costs one lookup (a token walk inside a JSON string revisits one configuration).
  struct Config {
    std::vector<int32_t> stacks;  // Sorted, unique: tops are character elements, or kEmpty.
    uint8_t pending[4] = {0, 0, 0, 0};
    int pending_size = 0;
    int pending_need = 0;
    bool operator==(const Config&) const = default;
    template <typename H>
    friend H AbslHashValue(H h, const Config& c) {
      return H::combine(std::move(h), c.stacks, c.pending[0], c.pending[1], c.pending[2],
                        c.pending_size, c.pending_need);
    }
  };
  static constexpr int32_t kRefused = -1;
  // Transitions remembered at most (each a few bytes); beyond, new ones are computed each
  // time.
  static constexpr size_t kMaxTransitions = size_t{1} << 22;

  int32_t InternConfig(const Config& config);
  // The configuration after `byte`, or kRefused.
  int32_t Step(int32_t config, uint8_t byte);

  int32_t Intern(Position position, int32_t below);
  const Element& Top(int32_t stack) const;
  // Expands `stack` until its top is a character element, adding each result (and
  // kEmpty, where the sentence may end) to `out`.
  void Expand(int32_t stack, std::vector<int32_t>* out);
  // The stacks after the code point `c`, sorted and unique; empty if none allows it.
  void Advance(const std::vector<int32_t>& stacks, char32_t c, std::vector<int32_t>* out);
  // Whether a stack allows some code point in [lo, hi].
  bool AnyAllows(const std::vector<int32_t>& stacks, char32_t lo, char32_t hi) const;

  std::shared_ptr<const Grammar> grammar_;
  std::vector<Frame> frames_;
  absl::flat_hash_map<FrameKey, int32_t> frame_ids_;
  std::vector<Config> configs_;
  absl::flat_hash_map<Config, int32_t> config_ids_;
  absl::flat_hash_map<uint64_t, int32_t> transitions_;  // config << 8 | byte.
  int32_t state_ = 0;                                   // The current configuration.
  std::vector<int32_t> history_;  // The configuration before each accepted byte.
  std::vector<int32_t> work_;     // Expand's scratch.
};

}  // namespace conveyor::grammar
