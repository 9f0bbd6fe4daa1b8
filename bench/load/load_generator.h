// conveyor-bench's load generator: runs every request of a workload against a scheduler,
// over gRPC Generate streams (driven by a few threads with gRPC's callback API) or over
// the OpenAI-compatible HTTP API, in a closed loop (N clients, each sending its next
// request when the previous one ends) or an open loop (seeded arrivals, optionally
// capped), and records per request what a client sees: TTFT, every inter-token gap,
// TPOT, E2E, and the server's own usage report.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "bench/load/workload.h"
#include "conveyor.grpc.pb.h"
#include "grpcpp/grpcpp.h"
#include "nlohmann/json.hpp"

namespace conveyor::bench {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t0, Clock::time_point t) {
  return std::chrono::duration<double>(t - t0).count();
}

struct RequestResult {
  int index = 0;
  int prompt_tokens = 0;
  int requested_tokens = 0;
  bool ok = false;
  bool finished_normally = false;  // Got a final message with usage.
  std::string error;
  std::string finish_reason;
  double start_s = 0;  // Send time, seconds since the run's start.
  double ttft_ms = -1;
  double e2e_ms = -1;
  double tpot_ms = -1;
  int output_tokens = 0;
  double server_queue_ms = -1;
  double server_ttft_ms = -1;
  double server_e2e_ms = -1;
  int preemptions = 0;
  int cached_prompt_tokens = 0;
  std::vector<float> itl_ms;
};

// The per-request record of the JSON report (`itl`: with every inter-token gap).
nlohmann::json ToJson(const RequestResult& r, bool itl);

// How requests are sent (conveyor-bench's flags of the same names).
struct LoadOptions {
  bool ignore_eos = true;
  // Structured output: every request's output is constrained to this JSON Schema (JSON
  // text; empty: none). A constrained request cannot ignore EOS, so ignore_eos is off for
  // it: pick a schema whose sentences are longer than the outputs to keep lengths fixed.
  std::string json_schema;
  double temperature = 0;
  int concurrency = 0;      // Closed loop: this many clients; 0: open loop.
  double request_rate = 0;  // Open loop: requests/s (inf: all at once).
  double burstiness = 1.0;
  uint64_t seed = 1;        // Seeds the arrivals.
  int max_concurrency = 0;  // Open loop: most requests in flight (0: no limit).
  double timeout_s = 0;     // The run's longest time; what is left is cancelled (0: none).
};

class Call;

class LoadGenerator {
 public:
  // `http_server`: host:port of the HTTP API, for --api=http (empty: gRPC streams over
  // `channels`).
  LoadGenerator(const LoadOptions& options,
                const std::vector<std::shared_ptr<grpc::Channel>>& channels,
                const std::string& http_server);
  ~LoadGenerator();
  LoadGenerator(const LoadGenerator&) = delete;
  LoadGenerator& operator=(const LoadGenerator&) = delete;

  const LoadOptions& options() const { return options_; }

  // Runs every spec; returns the results in spec order.
  std::vector<RequestResult> Run(const std::vector<RequestSpec>& specs, Clock::time_point start);

  void OnTokens(int n) { tokens_received_.fetch_add(n, std::memory_order_relaxed); }
  void OnFinished(Call* call);
  int64_t tokens_received() const { return tokens_received_.load(std::memory_order_relaxed); }
  void Counts(int* sent, int* finished, int* failed, int* in_flight) {
    std::lock_guard<std::mutex> lock(mu_);
    *sent = sent_;
    *finished = finished_;
    *failed = failed_;
    *in_flight = in_flight_;
  }

 private:
  void Launch(const RequestSpec& spec, Clock::time_point start);

  const LoadOptions options_;
  std::vector<std::unique_ptr<v1::Conveyor::Stub>> stubs_;
  std::vector<std::unique_ptr<Call>> calls_;
  std::string http_host_, http_port_;
  std::atomic<int64_t> tokens_received_{0};
  std::mutex mu_;
  std::condition_variable cv_;
  int sent_ = 0, finished_ = 0, failed_ = 0, in_flight_ = 0;
};

// Waits until the server's workers are ready (its ModelInfo is filled in), for at most
// `wait_s`; nullopt, with a line saying why, if they are not.
std::optional<v1::ModelInfoResponse> WaitForServer(v1::Conveyor::Stub* stub, double wait_s);
// Sends `count` short requests one by one; false, with a line, if one fails.
bool Warmup(v1::Conveyor::Stub* stub, int count, int vocab);

}  // namespace conveyor::bench
