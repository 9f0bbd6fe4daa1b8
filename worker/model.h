// A Llama-family decoder (Llama, Mistral, Qwen2) on one backend: its weights, its RoPE
// table, and the forward pass over a flat batch that mixes prefill chunks and decode
// tokens of different sequences, reading and writing the paged KV cache.
//
// Tensor parallelism (Megatron-style): with a communicator of W ranks, rank r holds
//  - its 1/W of the attention heads: q and kv heads in the fused QKV (column-parallel),
//    the matching input columns of o_proj (row-parallel, then all-reduce; bias on rank 0);
//  - its 1/W of the MLP: gate/up rows (column-parallel), down_proj columns (row-parallel,
//    then all-reduce);
//  - its 1/W of the vocabulary (ceil, the last shard padded with zeros): embedding rows
//    (other ranks' tokens embed to zero, then all-reduce) and LM head rows, whose logits
//    are all-gathered so that every rank holds the full logits and samples identically.
// Attention heads, KV heads and the intermediate size must divide by W.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/model_config.h"
#include "kernels/backend.h"
#include "worker/communicator.h"
#include "worker/kv_cache.h"

namespace conveyor::worker {

// One step's tokens, flattened. Host memory; the model copies it to the backend.
struct ForwardBatch {
  std::vector<int32_t> token_ids;     // [num_tokens]
  std::vector<int32_t> token_seq;     // [num_tokens]: index into the block tables.
  std::vector<int32_t> token_pos;     // [num_tokens]: position in the sequence.
  std::vector<int32_t> slot_mapping;  // [num_tokens]: KV slot to write.
  int num_seqs = 0;
  int max_blocks_per_seq = 0;
  std::vector<int32_t> block_tables;  // [num_seqs, max_blocks_per_seq], padded with 0.
  // Rows of the batch whose logits are wanted (usually each sequence's last token).
  std::vector<int32_t> logit_rows;

  int num_tokens() const { return static_cast<int>(token_ids.size()); }
  void Clear();
};

// Where a model's tensors come from: a checkpoint, or (for benchmarks of shapes we
// cannot ship) deterministic random values.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  virtual bool Contains(const std::string& name) const = 0;
  // Writes tensor `name` as float32 into `out`; its shape must be `shape`.
  virtual absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                               float* out) const = 0;
  // Like ReadF32 but writes only indices [begin, end) of dimension `dim` (0 or 1 of a
  // matrix, 0 of a vector), densely packed: one tensor-parallel shard.
  virtual absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& shape,
                                    int dim, int64_t begin, int64_t end, float* out) const = 0;
};

// Random weights with the scales of tests/model_gen (projections ~ U with variance
// 1/fan_in, norms 1), the same for the same seed and tensor name.
std::unique_ptr<WeightSource> MakeRandomWeightSource(uint64_t seed);

class LlamaModel {
 public:
  // Loads rank comm->rank()'s shard of the checkpoint in `model_dir` onto `backend`;
  // a null `comm` means one rank. `backend` and `comm` must outlive the model. Every
  // missing tensor or wrong shape is an error naming the tensor and file; a model whose
  // heads or intermediate size do not divide by the world size is INVALID_ARGUMENT.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& model_dir,
                                                          kernels::Backend* backend,
                                                          Communicator* comm = nullptr);
  // Builds a model of shape `config` from `weights`, sharded as Load does.
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Create(const ModelConfig& config,
                                                            const WeightSource& weights,
                                                            kernels::Backend* backend,
                                                            Communicator* comm = nullptr);
  ~LlamaModel();
  LlamaModel(const LlamaModel&) = delete;
  LlamaModel& operator=(const LlamaModel&) = delete;

  // Runs `batch` through the model, writing each token's K/V into `cache`, and copies
  // the logits of batch.logit_rows to `logits` (host, [logit_rows.size(), vocab_size]).
  // The caller has validated ids, positions and slots. Every rank must run the same
  // batch (the collectives pair up in order); every rank gets the full logits.
  absl::Status Forward(const ForwardBatch& batch, const KvCache& cache, float* logits);

  const ModelConfig& config() const { return config_; }
  // KV heads this rank holds, and so the KV cache's head count.
  int local_num_kv_heads() const { return num_kv_heads_; }
  // Backend bytes taken by weights and the RoPE table.
  size_t weight_bytes() const { return weight_bytes_; }

 private:
  struct Layer {
    kernels::BackendBuffer input_norm;
    kernels::BackendBuffer post_attention_norm;
    std::unique_ptr<kernels::LinearWeight> qkv;  // Fused [q; k; v].
    std::unique_ptr<kernels::LinearWeight> o;
    std::unique_ptr<kernels::LinearWeight> gate_up;  // Fused [gate; up].
    std::unique_ptr<kernels::LinearWeight> down;
  };

  LlamaModel(ModelConfig config, kernels::Backend* backend, Communicator* comm);
  absl::Status LoadWeights(const WeightSource& weights);
  absl::Status BuildRopeTable();
  // Grows the activation buffers to hold `num_tokens` tokens and `num_logit_rows` rows.
  absl::Status Reserve(int num_tokens, int num_logit_rows, int metadata_ints);

  ModelConfig config_;
  kernels::Backend* backend_;
  std::unique_ptr<Communicator> own_comm_;  // The single-rank one when none was given.
  Communicator* comm_;
  // This rank's share: heads, intermediate size, vocabulary rows [vocab_begin_,
  // vocab_begin_ + vocab_shard_) (the last shard may reach past vocab_size: zeros).
  int num_heads_, num_kv_heads_, ffn_, vocab_shard_, vocab_begin_;
  size_t weight_bytes_ = 0;

  // [vocab_shard + 1, hidden]: this rank's rows, then a zero row that tokens of other
  // shards look up.
  kernels::BackendBuffer embedding_;
  std::vector<Layer> layers_;
  kernels::BackendBuffer final_norm_;
  std::unique_ptr<kernels::LinearWeight> lm_head_;
  kernels::BackendBuffer rope_table_;  // [max_context, head_dim/2] cos, then sin.

  // Activation scratch, grown on demand.
  int reserved_tokens_ = 0;
  int reserved_logit_rows_ = 0;
  int reserved_metadata_ints_ = 0;
  kernels::BackendBuffer residual_, normed_, qkv_, attention_, projected_, gate_up_, mlp_;
  kernels::BackendBuffer final_rows_;
  kernels::BackendBuffer logits_;  // [world, rows, vocab_shard]: every rank's slice.
  kernels::BackendBuffer metadata_;  // Token ids, seqs, positions, slots, tables, rows.
  std::vector<int32_t> shard_ids_;   // Token ids as rows of embedding_.
  std::vector<float> gathered_;      // logits_ on the host, before reordering.
};

}  // namespace conveyor::worker
