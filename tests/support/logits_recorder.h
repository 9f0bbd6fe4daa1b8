// Keeps the logits of the latest step a StepRunner sampled on the host, per sequence,
// so tests can compare them across batch shapes and tensor-parallel layouts.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "worker/step_runner.h"

namespace conveyor::testing {

class LogitsRecorder final : public worker::LogitsTap {
 public:
  void OnLogits(uint64_t step_id, uint64_t seq_id, std::span<const float> logits) override {
    if (step_id != step_id_) {
      last_.clear();
      step_id_ = step_id;
    }
    last_[seq_id].assign(logits.begin(), logits.end());
  }

  // The logits that produced `seq_id`'s token in the latest step that sampled on the
  // host, or an empty span if it sampled nothing then.
  std::span<const float> Last(uint64_t seq_id) const {
    auto it = last_.find(seq_id);
    if (it == last_.end()) return {};
    return it->second;
  }

 private:
  uint64_t step_id_ = 0;
  std::unordered_map<uint64_t, std::vector<float>> last_;
};

}  // namespace conveyor::testing
