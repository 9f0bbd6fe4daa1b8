// Runs sequences through a LlamaModel directly: no scheduler, no RPC, no sampler. It
// hands out KV blocks from a free list, builds each step's flat batch and returns the
// logits. For benchmarks and cross-backend checks (bench/step_bench.cc, tests/gpu/),
// where the worker's StepRunner and its protobuf messages would be in the way; serving
// goes through StepRunner.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace conveyor::model {

class DirectRunner {
 public:
  // `model` and `cache` must outlive the runner; it assumes it is the cache's only user.
  DirectRunner(LlamaModel* model, KvCache* cache);

  // Adds a sequence and returns its index. Its first `num_cached` tokens count as already
  // in the KV cache without being computed (benchmarks: attention reads whatever the
  // slots hold, and its cost does not depend on the values).
  int Add(std::vector<int32_t> tokens, int num_cached = 0);
  // Appends a token to sequence `seq`; the next Step that includes `seq` computes it.
  void Append(int seq, int32_t token);
  const std::vector<int32_t>& tokens(int seq) const { return seqs_[seq].tokens; }
  int num_computed(int seq) const { return seqs_[seq].computed; }

  // One forward pass over the pending tokens of `seqs` (at most `max_chunk` of each;
  // 0: all). `logits` becomes [rows, vocab_size]: with `all_positions`, one row per token
  // computed, in batch order; otherwise one row per sequence whose pending tokens are all
  // computed after this pass (its last token's logits), in the order of `seqs`. Returns
  // the number of rows; RESOURCE_EXHAUSTED when the cache runs out of blocks.
  absl::StatusOr<int> Step(std::span<const int> seqs, int max_chunk, bool all_positions,
                           std::vector<float>* logits);
  // As Step, but the logits stay in backend memory (for a DeviceSampler).
  absl::StatusOr<DeviceLogits> StepOnDevice(std::span<const int> seqs, int max_chunk,
                                            bool all_positions);

  // Runs every sequence in `seqs` to completion of its pending tokens (prefill), in
  // steps of at most `max_step_tokens` tokens, and discards the logits.
  absl::Status ComputeAll(std::span<const int> seqs, int max_step_tokens);

  // Forgets every sequence and frees its blocks.
  void Clear();

 private:
  // Makes room in the cache and fills batch_ and chunks_ for Step / StepOnDevice.
  absl::Status BuildBatch(std::span<const int> seqs, int max_chunk, bool all_positions);

  struct Sequence {
    std::vector<int32_t> tokens;
    int computed = 0;
    std::vector<int32_t> blocks;
  };

  LlamaModel* model_;
  KvCache* cache_;
  std::vector<Sequence> seqs_;
  std::vector<int32_t> free_blocks_;
  ForwardBatch batch_;
  std::vector<int> chunks_;  // Tokens of each sequence in batch_.
};

// Index of the largest value (the first of equal ones).
int Argmax(std::span<const float> values);

}  // namespace conveyor::model
