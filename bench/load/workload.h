// The requests a conveyor-bench run sends, drawn up front from one seeded generator so
// that a workload is the same whatever the server does: prompt and output lengths from a
// named distribution, random prompt ids, per-request sampling seeds, and the arrival
// times of the open loop.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace conveyor::bench {

struct RequestSpec {
  int index = 0;
  std::vector<int32_t> prompt;
  int max_new_tokens = 0;
  uint64_t seed = 0;
};

// The workload's shape (conveyor-bench's flags of the same names).
struct WorkloadOptions {
  std::string kind = "exponential";  // fixed, uniform, exponential or chat.
  int num_requests = 100;
  uint64_t seed = 1;
  int input_len = 512;                       // fixed/exponential
  int output_len = 128;                      // fixed
  std::string input_len_range = "128:1024";  // uniform: MIN:MAX
  std::string output_len_range = "16:256";   // uniform: MIN:MAX
  double output_mean = 128;                  // exponential
  int output_cap = 1024;                     // exponential
  double chat_input_median = 256;            // chat: log-normal lengths
  double chat_input_sigma = 0.8;
  double chat_output_median = 128;
  double chat_output_sigma = 0.8;
  int chat_max_input = 2048;
  int chat_max_output = 1024;
  // Non-empty: the prompts (token ids), request i taking prompt i mod size, instead of
  // random ids of the drawn length (conveyor-bench --prompts_file); output lengths are
  // drawn as `kind` says.
  std::vector<std::vector<int32_t>> prompts;
};

// Every request of the run: prompt ids in [3, vocab_size) (or `prompts`), prompt + output within
// `max_context` (longer draws are shortened, and a line says how many). On a bad option,
// empty with `*error` saying which flag to fix.
std::vector<RequestSpec> MakeWorkload(const WorkloadOptions& options, int vocab_size,
                                      int max_context, std::string* error);

// Arrival offsets (seconds from the start) for the open loop: gaps from a Gamma
// distribution of shape `burstiness` and mean 1/rate (1: Poisson); all 0 for rate inf.
std::vector<double> MakeArrivals(int n, double rate, double burstiness, uint64_t seed);

}  // namespace conveyor::bench
