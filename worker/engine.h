// Executes StepRequests on one rank: validates the step's deltas against the sequences
// this rank holds, applies them, runs one forward pass over the flattened batch and
// samples a token for every sequence that reached the end of its known tokens.
//
// A step that fails validation returns INVALID_ARGUMENT naming the offending field and
// changes nothing, so the worker keeps serving.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "worker.pb.h"
#include "worker/device_sampler.h"
#include "worker/kv_cache.h"
#include "worker/model.h"
#include "worker/sampler.h"

namespace conveyor::worker {

class StepEngine {
 public:
  struct Options {
    int max_step_tokens = 8192;
    int max_step_sequences = 256;
    int tp_rank = 0;  // Only rank 0 reports sampled tokens.
    int max_logprobs = 20;
  };

  // `model` and `cache` must outlive the engine.
  StepEngine(LlamaModel* model, KvCache* cache, const Options& options);

  // Runs one step. On error nothing changed.
  absl::Status Step(const v1::StepRequest& request, v1::StepResponse* response);

  // Samples where the logits are from now on (steps of more rows than it takes copy
  // their logits to the host and sample there).
  void set_device_sampler(std::unique_ptr<DeviceSampler> sampler) {
    device_sampler_ = std::move(sampler);
  }

  // Forgets every sequence (a restarted scheduler starts from a clean slate).
  void Reset() { sequences_.clear(); }

  int num_sequences() const { return static_cast<int>(sequences_.size()); }
  uint64_t steps_executed() const { return steps_executed_; }
  const Options& options() const { return options_; }

  // The logits (before any sampling transform) that produced `seq_id`'s token in the
  // last step, or an empty span if it sampled nothing then or sampled on the device.
  std::span<const float> LastLogits(uint64_t seq_id) const;

 private:
  struct Sequence {
    std::vector<int32_t> tokens;  // Prompt, then generated tokens.
    int num_prompt_tokens = 0;
    int num_computed = 0;  // Tokens whose K/V are in the cache.
    std::vector<int32_t> block_table;
    SamplingParams sampling;
  };
  // One sequence scheduled in the step being validated.
  struct Scheduled {
    uint64_t seq_id = 0;
    const v1::NewSequence* new_seq = nullptr;  // Null for running sequences.
    const v1::RunningSequence* running = nullptr;
    int num_tokens = 0;
  };

  absl::Status Validate(const v1::StepRequest& request,
                        std::vector<Scheduled>* scheduled) const;
  absl::Status ValidateBlocks(const google::protobuf::RepeatedField<int32_t>& blocks,
                              const char* field, uint64_t seq_id) const;
  void BuildBatch(const std::vector<Scheduled>& scheduled);

  LlamaModel* model_;
  KvCache* cache_;
  Options options_;
  Sampler sampler_;
  std::unique_ptr<DeviceSampler> device_sampler_;  // Null: sample on the host.
  std::unordered_map<uint64_t, Sequence> sequences_;
  uint64_t steps_executed_ = 0;

  // Per-step scratch.
  ForwardBatch batch_;
  std::vector<uint64_t> sampling_seqs_;  // Sequence of each logit row.
  std::vector<float> logits_;            // [rows, vocab] when sampled on the host.
  std::vector<RowToSample> rows_to_sample_;
  std::vector<SampleResult> sampled_;
};

// Converts wire sampling parameters (zeros meaning "unset") to the sampler's.
SamplingParams FromProto(const v1::SamplingParams& p);

}  // namespace conveyor::worker
