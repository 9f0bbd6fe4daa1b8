// Cuts a request's streamed text at its first stop string.
//
// Text arrives in pieces (one detokenizer step each) and a stop string may span several
// of them, so the matcher holds back any tail of the text that could still grow into a
// stop string, and releases it once it cannot. No part of a stop string that occurs is
// ever emitted. Where several stop strings occur, the one completed first wins (on a tie
// the longer), so the result does not depend on how the text was split into pieces.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace conveyor::scheduler {

class StopMatcher {
 public:
  struct Result {
    std::string emit;      // Text that is safe to stream now.
    bool stopped = false;  // A stop string occurred; `emit` ends right before it.

    bool operator==(const Result&) const = default;
  };

  // Empty stop strings are ignored.
  explicit StopMatcher(std::vector<std::string> stop_strings);

  // Adds `text` to what came before. On a stop, the text from the stop string on is
  // discarded and later calls return {"", true}. Cuts never split a UTF-8 character of
  // valid input, even for a stop string that starts mid-character.
  Result Feed(std::string_view text);

  // Returns the text held back, for when generation ends without a stop; empty after
  // a stop.
  std::string Flush();

  // Whether a stop string has occurred, and which (empty before).
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  // Start of the longest tail of held_ that is a proper prefix of a stop string, or
  // held_.size() if none.
  size_t PossibleStopStart() const;

  std::vector<std::string> stop_strings_;
  size_t longest_stop_bytes_ = 0;
  // Text fed but not yet emitted: never holds a whole stop string.
  std::string held_;
  bool stopped_ = false;
  std::string matched_;
};

}  // namespace conveyor::scheduler
