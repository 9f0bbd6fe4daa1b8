#include "scheduler/stop_matcher.h"

#include <algorithm>
#include <utility>

namespace conveyor::scheduler {
namespace {

// The start of the UTF-8 character holding byte `pos` of `text` (`pos` itself if it
// starts one or is text.size()). Stop strings are matched as bytes, so one that starts
// with a continuation byte could otherwise cut a character in two.
size_t CharacterStart(std::string_view text, size_t pos) {
  while (pos > 0 && pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) {
    --pos;
  }
  return pos;
}

}  // namespace

StopMatcher::StopMatcher(std::vector<std::string> stop_strings)
    : stop_strings_(std::move(stop_strings)) {
  std::erase_if(stop_strings_, [](const std::string& stop) { return stop.empty(); });
  for (const std::string& stop : stop_strings_) {
    longest_stop_bytes_ = std::max(longest_stop_bytes_, stop.size());
  }
}

StopMatcher::Result StopMatcher::Feed(std::string_view text) {
  if (stopped_) return {"", true};
  held_.append(text);

  // held_ had no stop string before, so any it has now ends in `text`. The earliest end
  // is where generation would have stopped had the text come one byte at a time.
  size_t stop_start = std::string::npos;
  size_t stop_end = std::string::npos;
  const std::string* first = nullptr;
  for (const std::string& stop : stop_strings_) {
    const size_t start = held_.find(stop);
    if (start == std::string::npos) continue;
    const size_t end = start + stop.size();
    if (end < stop_end || (end == stop_end && start < stop_start)) {
      stop_start = start;
      stop_end = end;
      first = &stop;
    }
  }
  if (first != nullptr) {
    stopped_ = true;
    matched_ = *first;
    Result result{held_.substr(0, CharacterStart(held_, stop_start)), true};
    held_.clear();
    return result;
  }

  const size_t keep_from = CharacterStart(held_, PossibleStopStart());
  Result result{held_.substr(0, keep_from), false};
  held_.erase(0, keep_from);
  return result;
}

std::string StopMatcher::Flush() { return std::exchange(held_, std::string()); }

size_t StopMatcher::PossibleStopStart() const {
  const std::string_view held = held_;
  // Longest tails first; a tail as long as a stop string would be a match.
  const size_t longest_tail =
      longest_stop_bytes_ > 0 ? std::min(held.size(), longest_stop_bytes_ - 1) : 0;
  for (size_t tail = longest_tail; tail > 0; --tail) {
    const std::string_view tail_text = held.substr(held.size() - tail);
    for (const std::string& stop : stop_strings_) {
      if (stop.size() > tail && stop.starts_with(tail_text)) {
        return held.size() - tail;
      }
    }
  }
  return held.size();
}

}  // namespace conveyor::scheduler
