// Draft tokens for speculative decoding by prompt lookup: where the last n tokens of a
// sequence (prompt and output) occurred before, what followed them there is proposed to
// follow now. No model: text that repeats its input (quoting, editing, code, summaries
// that reuse phrases) is where it pays. The worker verifies the drafts
// (worker.proto, RunningSequence.draft_token_ids), so a wrong guess costs compute, never
// correctness.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace conveyor::scheduler {

struct NgramOptions {
  int min_n = 2;  // Shortest suffix matched (vLLM's prompt_lookup_min).
  int max_n = 4;  // Longest (prompt_lookup_max); longer matches are tried first.
};

// Up to `k` tokens that followed the latest earlier occurrence of `tokens`' last n tokens,
// for the largest n in [min_n, max_n] that occurs; empty if none does.
std::vector<int32_t> ProposeNgram(std::span<const int32_t> tokens, const NgramOptions& options,
                                  int k);

}  // namespace conveyor::scheduler
