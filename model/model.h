// A Llama-family decoder (Llama, Mistral, Qwen2, Qwen3, and the mixture-of-experts
// Qwen3-MoE and Mixtral) on one backend: its weights, its RoPE table, and the forward
// pass over a flat batch that mixes prefill chunks and decode tokens of different
// sequences, reading and writing the paged KV cache.
//
// A mixture-of-experts layer (docs/models.md): the router's logits come to the host,
// which picks each token's experts (softmax in float, top k, ties to the lower index)
// and sorts the (token, expert) pairs by expert; the backend gathers the tokens' rows in
// that order, runs every expert on its rows in one grouped GEMM (each expert's weights
// read once per step, however many of the batch's tokens chose it), and sums each
// token's expert outputs in ascending expert order, weighted. Every step of that is a
// function of the token alone, so the layer is batch-invariant like the rest.
//
// Tensor parallelism (Megatron-style): with a communicator of W ranks, rank r holds
//  - its 1/W of the attention heads: q and kv heads in the fused QKV (column-parallel),
//    the matching input columns of o_proj (row-parallel, then all-reduce; bias on rank 0);
//  - its 1/W of the MLP: gate/up rows (column-parallel), down_proj columns (row-parallel,
//    then all-reduce); in an MoE layer, 1/W of every expert so (each expert sharded, not
//    experts spread over ranks: every rank does the same share of any routing, and the
//    layer needs only the dense layer's one all-reduce), with the router on every rank;
//  - its 1/W of the vocabulary (ceil, the last shard padded with zeros): embedding rows
//    (other ranks' tokens embed to zero, then all-reduce) and LM head rows, whose logits
//    are all-gathered so that every rank holds the full logits and samples identically.
// Attention heads, KV heads and the intermediate sizes must divide by W.
#pragma once

#include <cstddef>
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
  // Rows [row_begin, row_end) and columns [col_begin, col_end) of matrix `name` (shape
  // `shape`) in the block-quantized layout it is stored in, rows in ReadF32's order: sets
  // `type` and appends the rows' bytes to `out`. UNIMPLEMENTED where the tensor is not
  // stored in one of kernels::QuantBlockType's layouts or the columns do not fall on its
  // block boundaries (the default: a source of float tensors); the caller then reads it
  // with ReadF32Slice.
  virtual absl::Status ReadQuantizedRows(const std::string& name, const std::vector<int64_t>& shape,
                                         int64_t row_begin, int64_t row_end, int64_t col_begin,
                                         int64_t col_end, kernels::QuantBlockType* type,
                                         std::vector<std::byte>* out) const {
    return absl::UnimplementedError(name + " is not block-quantized");
  }
};

// The config of the checkpoint at `path` as LlamaModel::Load reads it: config.json of a
// Hugging Face directory, or the metadata of a file ending in ".gguf".
absl::StatusOr<ModelConfig> LoadCheckpointConfig(const std::string& path);

class LlamaModel {
 public:
  // Loads rank comm->rank()'s shard of the checkpoint in `model_dir` (a Hugging Face
  // safetensors directory, whose GPTQ/AWQ layers come as the ggml blocks they map to,
  // checkpoint/quantized_linear.h, or a path ending in ".gguf": one GGUF file,
  // checkpoint/gguf_weights.h, whose block-quantized linear weights stay in their blocks
  // where the backend's PackLinearQuantized takes them, else are dequantized) onto `backend`;
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
  // Decode graphs captured since the last drop, one per padded (batch, width) shape.
  int num_decode_graphs() const { return static_cast<int>(graphs_.size()); }

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
    kernels::BackendBuffer q_norm, k_norm;       // Qwen3: float32 [head_dim] each.
    std::unique_ptr<kernels::LinearWeight> o;
    // Dense layers: the MLP.
    std::unique_ptr<kernels::LinearWeight> gate_up;  // Fused [gate; up].
    std::unique_ptr<kernels::LinearWeight> down;
    // Sparse layers: the router (float32 where the backend allows) and each expert's
    // fused [gate; up] and down, as raw pointers too for GroupedLinear.
    std::unique_ptr<kernels::LinearWeight> router;
    std::vector<std::unique_ptr<kernels::LinearWeight>> expert_gate_up, expert_down;
    std::vector<const kernels::LinearWeight*> expert_gate_up_ptrs, expert_down_ptrs;
  };

  LlamaModel(ModelConfig config, kernels::Backend* backend, Communicator* comm);
  absl::Status LoadWeights(const WeightSource& weights);
  absl::Status BuildRopeTable();
  // Grows the activation buffers to hold `num_tokens` tokens and `num_logit_rows` rows.
  absl::Status Reserve(int num_tokens, int num_logit_rows, int metadata_ints);
  // The forward pass after the metadata upload: what a graph captures.
  absl::Status Compute(const int32_t* ids, const kernels::AttentionBatch& attn,
                       const int32_t* logit_rows, int rows, const KvCache& cache);
  // The sparse MLP of layer `l` on normed_'s n rows, into projected_ (before the
  // all-reduce). Waits for the router's logits on the host: no graph can capture it.
  absl::Status MixtureOfExperts(const Layer& l, int n);
  // Grows the MoE scratch to n tokens' expert rows.
  absl::Status ReserveExperts(int n);
  // Whether `batch` is a decode step a graph can run.
  bool GraphEligible(const ForwardBatch& batch, const KvCache& cache) const;
  absl::StatusOr<DeviceLogits> ForwardGraph(const ForwardBatch& batch, const KvCache& cache);

  ModelConfig config_;
  kernels::Backend* backend_;
  std::unique_ptr<Communicator> own_comm_;  // The single-rank one when none was given.
  Communicator* comm_;
  // This rank's share: heads, intermediate sizes (dense, each expert), vocabulary rows
  // [vocab_begin_, vocab_begin_ + vocab_shard_) (the last shard may reach past
  // vocab_size: zeros).
  int num_heads_, num_kv_heads_, ffn_, expert_ffn_, vocab_shard_, vocab_begin_;
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

  // MoE scratch, grown on demand: for n tokens with k experts each, the gathered rows
  // [n*k, hidden], the experts' gate/up [n*k, 2*expert_ffn] and activations
  // [n*k, expert_ffn], their outputs [n*k, hidden], the router's logits [n, experts], and
  // the routing as backend metadata (gather order, sources, weights) and on the host.
  int reserved_expert_tokens_ = 0;
  kernels::BackendBuffer expert_in_, expert_gate_up_, expert_act_, expert_out_, router_logits_;
  kernels::BackendBuffer routing_;
  std::vector<float> host_router_logits_;
  std::vector<int32_t> host_routing_;       // Gather order [n*k], then sources [n*k].
  std::vector<float> host_expert_weights_;  // [n*k]; routing_ holds them after the ints.
  std::vector<int> expert_offsets_;         // [experts + 1].
  // Routing scratch: one token's experts by probability, their probabilities, and each
  // expert's next free row while the pairs are grouped.
  std::vector<int> routing_order_;
  std::vector<float> routing_probs_;
  std::vector<int> expert_fill_;

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
