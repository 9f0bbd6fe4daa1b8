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
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/model_config.h"
#include "kernels/backend.h"
#include "model/communicator.h"
#include "model/kv_cache.h"

namespace conveyor::model {

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

// A step's logits where the model leaves them, in backend memory and the compute dtype:
// [world, rows, shard], each rank's vocabulary slice of every row after the all-gather;
// token v of row r sits at (v / shard, r, v % shard) for v < vocab_size. Valid until the
// model's next Forward.
struct DeviceLogits {
  const void* data = nullptr;
  int rows = 0;
  int world = 1;
  int shard = 0;
  int vocab_size = 0;
  // Rows the buffer is laid out for: `rows` unless a graph padded the batch, in which
  // case rows [rows, layout_rows) are padding.
  int layout_rows = 0;
};

// Where a model's tensors come from: a checkpoint, or (for tests and benchmarks of shapes
// we cannot ship: testing/random_weights.h) deterministic random values.
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
  // batch (the collectives pair up in order); every rank gets the full logits. A device
  // error (kernels/backend.h) is returned, naming the operation that failed.
  absl::Status Forward(const ForwardBatch& batch, const KvCache& cache, float* logits);
  // Forward without the copy: the logits stay in backend memory, for a sampler that runs
  // there. The work may still be queued when it returns: a fault of it shows at the
  // backend's next Synchronize (errors recorded while queueing are returned here).
  absl::StatusOr<DeviceLogits> ForwardToDevice(const ForwardBatch& batch, const KvCache& cache);

  // Allocates the activation buffers for steps of up to `max_tokens` tokens and
  // `max_logit_rows` sampled rows now, rather than on the first step that needs them, so
  // that memory measured afterwards (to size the KV cache) is really free.
  absl::Status ReserveActivations(int max_tokens, int max_logit_rows) {
    return Reserve(max_tokens, max_logit_rows, 0);
  }

  // From now on, steps that only decode (one token per sequence, each sampled) with at
  // most `max_batch` sequences run as CUDA graphs: the batch is padded to a power of two
  // and the block tables to a power-of-two width, and each such shape is captured on
  // first use and replayed after. Cuts the launch cost of the hundreds of small kernels
  // of a small-batch decode step. UNIMPLEMENTED on backends without graphs. Activation
  // buffers that must grow later drop every graph (call ReserveActivations first).
  absl::Status EnableDecodeGraphs(int max_batch);
  void DisableDecodeGraphs() { graph_max_batch_ = 0; }

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
  // The forward pass after the metadata upload: what a graph captures.
  absl::Status Compute(const int32_t* ids, const kernels::AttentionBatch& attn,
                       const int32_t* logit_rows, int rows, const KvCache& cache);
  // Whether `batch` is a decode step a graph can run.
  bool GraphEligible(const ForwardBatch& batch, const KvCache& cache) const;
  absl::StatusOr<DeviceLogits> ForwardGraph(const ForwardBatch& batch, const KvCache& cache);

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
  kernels::BackendBuffer logits_;    // [world, rows, vocab_shard]: every rank's slice.
  kernels::BackendBuffer metadata_;  // Token ids, seqs, positions, slots, tables, rows.
  std::vector<int32_t> shard_ids_;   // Token ids as rows of embedding_.
  std::vector<float> gathered_;      // logits_ on the host, before reordering.

  // Decode graphs (EnableDecodeGraphs): ids by padded (batch, table width), their fixed
  // metadata buffer and the cache they were captured against.
  int graph_max_batch_ = 0;  // 0: off.
  std::map<std::pair<int, int>, int> graphs_;
  kernels::BackendBuffer graph_metadata_;
  int graph_metadata_ints_ = 0;
  const KvCache* graph_cache_ = nullptr;
  std::vector<int32_t> graph_host_;
};

}  // namespace conveyor::model
