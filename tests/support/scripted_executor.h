// The scripted StepExecutor that scheduler/step_executor.h promises: stands in for the
// workers in scheduler tests that need no model. It keeps the ledger a worker keeps (per
// sequence: the tokens it knows, how many are computed, its blocks), checks every step
// against it as worker/step_runner.cc does, samples tokens from a per-sequence script, fails
// the steps it is told to, and records every StepRequest it gets.
//
// A step the ledger rejects returns INVALID_ARGUMENT, as a worker would, and is also
// listed in violations(), so a test can assert that the engine never sent one.
//
// Thread-safe: the engine calls Step on its loop thread while the test scripts and reads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "scheduler/step_executor.h"
#include "worker.pb.h"

namespace conveyor::testing {

class ScriptedExecutor final : public scheduler::StepExecutor {
 public:
  // `block_size`: tokens per KV block, for the worker's capacity check.
  explicit ScriptedExecutor(int block_size) : block_size_(block_size) {}

  // The tokens sequence `seq_id` samples, in order, before it falls back to the default.
  void ScriptTokens(uint64_t seq_id, std::vector<int32_t> tokens) {
    std::lock_guard<std::mutex> lock(mu_);
    auto& script = scripts_[seq_id];
    script.insert(script.end(), tokens.begin(), tokens.end());
  }
  // What a sequence samples once its script runs out (or without one).
  void set_default_token(int32_t token) {
    std::lock_guard<std::mutex> lock(mu_);
    default_token_ = token;
  }
  // Step call number `call` (1-based, every call counts) fails with `status` and changes
  // nothing, as a step rejected or lost on the way would.
  void FailCall(int call, absl::Status status) {
    std::lock_guard<std::mutex> lock(mu_);
    failures_[call] = std::move(status);
  }
  // Every call sleeps this long first, so that a test can act while requests run.
  void set_step_delay(std::chrono::microseconds delay) {
    std::lock_guard<std::mutex> lock(mu_);
    delay_ = delay;
  }

  absl::StatusOr<worker::v1::StepResponse> Step(const worker::v1::StepRequest& request) override {
    std::chrono::microseconds delay;
    {
      std::lock_guard<std::mutex> lock(mu_);
      delay = delay_;
    }
    if (delay.count() > 0) std::this_thread::sleep_for(delay);
    std::lock_guard<std::mutex> lock(mu_);
    requests_.push_back(request);
    absl::StatusOr<worker::v1::StepResponse> result = Run(request);
    cv_.notify_all();
    return result;
  }

  // Every StepRequest received so far, failed ones included, in order.
  std::vector<worker::v1::StepRequest> requests() const {
    std::lock_guard<std::mutex> lock(mu_);
    return requests_;
  }
  int num_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(requests_.size());
  }
  // Waits until `n` Step calls have returned; false on timeout.
  bool WaitForCalls(int n, std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, timeout, [&] { return static_cast<int>(requests_.size()) >= n; });
  }
  // Why steps were rejected (empty if the engine only sent coherent steps).
  std::vector<std::string> violations() const {
    std::lock_guard<std::mutex> lock(mu_);
    return violations_;
  }
  // Sequences the simulated worker holds.
  int num_sequences() const {
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int>(sequences_.size());
  }

 private:
  struct Sequence {
    int num_known = 0;  // Tokens sent or sampled.
    int num_computed = 0;
    int num_blocks = 0;
  };

  absl::StatusOr<worker::v1::StepResponse> Run(const worker::v1::StepRequest& request) {
    const int call = static_cast<int>(requests_.size());
    // As worker/step_runner.cc: a step built on another runs only right after it ran.
    const bool in_order = request.previous_step_id() == 0 ||
                          (request.previous_step_id() == last_step_id_ && last_step_ok_);
    last_step_id_ = request.step_id();
    last_step_ok_ = false;
    if (auto it = failures_.find(call); it != failures_.end()) return it->second;
    if (!in_order) {
      return absl::AbortedError(absl::StrCat("step ", request.step_id(), " follows step ",
                                             request.previous_step_id(), ", which did not run"));
    }
    if (absl::Status valid = Validate(request); !valid.ok()) {
      violations_.push_back(absl::StrCat("step ", request.step_id(), ": ", valid.message()));
      return valid;
    }
    last_step_ok_ = true;
    if (request.reset()) {
      sequences_.clear();
    } else {
      for (uint64_t id : request.dropped_seq_ids()) sequences_.erase(id);
    }
    worker::v1::StepResponse response;
    response.set_step_id(request.step_id());
    // Running sequences first, then new ones: the order the worker batches them in.
    for (const worker::v1::RunningSequence& r : request.running()) {
      Sequence& s = sequences_.at(r.seq_id());
      s.num_blocks += r.new_block_ids_size();
      Compute(r.seq_id(), s, r.num_tokens(), &response);
    }
    for (const worker::v1::NewSequence& n : request.new_sequences()) {
      Sequence& s = sequences_[n.seq_id()];
      s = Sequence{n.token_ids_size(), n.num_cached_tokens(), n.block_ids_size()};
      Compute(n.seq_id(), s, n.num_tokens(), &response);
    }
    return response;
  }

  // Computes `num_tokens` of `s`; samples when it reaches the end of what it knows.
  void Compute(uint64_t seq_id, Sequence& s, int num_tokens, worker::v1::StepResponse* response) {
    s.num_computed += num_tokens;
    if (s.num_computed != s.num_known) return;
    int32_t token = default_token_;
    if (auto it = scripts_.find(seq_id); it != scripts_.end() && !it->second.empty()) {
      token = it->second.front();
      it->second.pop_front();
    }
    ++s.num_known;
    worker::v1::SampledToken* sampled = response->add_tokens();
    sampled->set_seq_id(seq_id);
    sampled->set_token_id(token);
  }

  // worker/step_runner.cc's checks that do not need a model.
  absl::Status Validate(const worker::v1::StepRequest& request) const {
    std::set<uint64_t> dropped;
    if (request.reset()) {
      for (const auto& [id, s] : sequences_) dropped.insert(id);
    } else {
      for (uint64_t id : request.dropped_seq_ids()) {
        if (!sequences_.contains(id)) return Invalid(id, "dropped but unknown");
        if (!dropped.insert(id).second) return Invalid(id, "dropped twice");
      }
    }
    std::set<uint64_t> seen;
    auto check = [&](uint64_t id, int computed, int num_tokens, int known, int blocks) {
      if (!seen.insert(id).second) return Invalid(id, "scheduled twice");
      if (num_tokens < 1) return Invalid(id, "num_tokens < 1");
      if (computed + num_tokens > known) return Invalid(id, "computes past its known tokens");
      if (computed + num_tokens > blocks * block_size_) return Invalid(id, "too few blocks");
      return absl::OkStatus();
    };
    for (const worker::v1::RunningSequence& r : request.running()) {
      auto it = sequences_.find(r.seq_id());
      if (it == sequences_.end() || dropped.contains(r.seq_id())) {
        return Invalid(r.seq_id(), "running but unknown");
      }
      const Sequence& s = it->second;
      if (absl::Status ok = check(r.seq_id(), s.num_computed, r.num_tokens(), s.num_known,
                                  s.num_blocks + r.new_block_ids_size());
          !ok.ok()) {
        return ok;
      }
    }
    for (const worker::v1::NewSequence& n : request.new_sequences()) {
      if (sequences_.contains(n.seq_id()) && !dropped.contains(n.seq_id())) {
        return Invalid(n.seq_id(), "new but already held");
      }
      if (n.token_ids_size() == 0) return Invalid(n.seq_id(), "no token_ids");
      if (n.num_output_tokens() < 0 || n.num_output_tokens() >= n.token_ids_size()) {
        return Invalid(n.seq_id(), "num_output_tokens outside [0, len(token_ids))");
      }
      if (n.num_cached_tokens() < 0 || n.num_cached_tokens() >= n.token_ids_size()) {
        return Invalid(n.seq_id(), "num_cached_tokens outside [0, len(token_ids))");
      }
      if (absl::Status ok = check(n.seq_id(), n.num_cached_tokens(), n.num_tokens(),
                                  n.token_ids_size(), n.block_ids_size());
          !ok.ok()) {
        return ok;
      }
    }
    return absl::OkStatus();
  }

  static absl::Status Invalid(uint64_t seq_id, const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_id, ": ", what));
  }

  const int block_size_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, std::deque<int32_t>> scripts_;
  int32_t default_token_ = 5;
  std::map<int, absl::Status> failures_;
  std::chrono::microseconds delay_{0};
  std::map<uint64_t, Sequence> sequences_;
  uint64_t last_step_id_ = 0;
  bool last_step_ok_ = false;
  std::vector<worker::v1::StepRequest> requests_;
  std::vector<std::string> violations_;
};

}  // namespace conveyor::testing
