#include "scheduler/stop_checker.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "common/utf8.h"

namespace conveyor::scheduler {
namespace {

bool Contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

}  // namespace

std::string_view FinishReasonName(FinishReason reason) {
  switch (reason) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kEos:
      return "eos";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kDeadline:
      return "deadline";
    case FinishReason::kError:
      return "error";
  }
  return "error";  // Unreachable: the switch covers every value.
}

StopChecker::Verdict StopChecker::Check(Request& r) const {
  const int32_t id = r.tokens[r.num_known_tokens() - 1];
  Verdict verdict;
  // EOS and stop ids end the text before themselves, so they are never detokenized: the
  // one rule for tokens that end generation is that they appear in token_ids (and in
  // usage) but add no text, as a stop string adds none.
  bool stop_string = false;
  if (Contains(r.eos_token_ids, id)) {
    verdict.finish = FinishReason::kEos;
  } else if (Contains(r.stop_token_ids, id)) {
    verdict.finish = FinishReason::kStop;
    verdict.stop_token_id = id;
  } else {
    StopMatcher::Result result = r.stop_matcher->Feed(r.detokenizer->Append(id));
    verdict.text = ValidUtf8(result.emit);
    if (result.stopped) {
      verdict.finish = FinishReason::kStop;
      verdict.stop_string = r.stop_matcher->matched();
      stop_string = true;
    }
  }
  if (!verdict.finish.has_value() &&
      (r.num_output_tokens() >= r.max_new_tokens || r.num_known_tokens() >= max_context_tokens_)) {
    verdict.finish = FinishReason::kLength;
  }
  // Text held back for a possible stop string or an incomplete character is final now,
  // and may itself complete a stop string. After a stop string, what is held back comes
  // after it and is discarded; after EOS, a stop id or the length limit it is output.
  if (verdict.finish.has_value() && !stop_string) {
    StopMatcher::Result tail = r.stop_matcher->Feed(r.detokenizer->Flush());
    verdict.text.append(ValidUtf8(tail.emit));
    if (tail.stopped) {
      verdict.finish = FinishReason::kStop;
      verdict.stop_string = r.stop_matcher->matched();
      verdict.stop_token_id.reset();
    } else {
      verdict.text.append(ValidUtf8(r.stop_matcher->Flush()));
    }
  }
  return verdict;
}

}  // namespace conveyor::scheduler
