#include "scheduler/ngram_proposer.h"

#include <algorithm>

namespace conveyor::scheduler {

std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, const NgramOptions& options,
                                  int k) {
  const int len = static_cast<int>(tokens.size());
  if (k <= 0) return {};
  for (int n = std::min(options.max_n, len - 1); n >= std::max(1, options.min_n); --n) {
    const std::span<const int32_t> suffix = tokens.subspan(len - n);
    // The latest start i < len - n whose n tokens equal the suffix (it may overlap the
    // suffix: a run of one token proposes more of it).
    for (int i = len - n - 1; i >= 0; --i) {
      if (std::equal(suffix.begin(), suffix.end(), tokens.begin() + i)) {
        const int from = i + n;
        const int to = std::min(len, from + k);
        return std::vector<int32_t>(tokens.begin() + from, tokens.begin() + to);
      }
    }
  }
  return {};
}

}  // namespace conveyor::scheduler
