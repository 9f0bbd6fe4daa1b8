// Host-side launchers of the CUDA backend's own kernels (everything but the GEMM).
// Each queues its kernel(s) on `stream` and returns the launch error (cudaSuccess when
// the launch was accepted; faults inside a kernel show up at the next synchronization).
// A launcher with nothing to do (zero rows) launches nothing. Pointers are device
// pointers; `T` below means the compute dtype named by `dtype`.
//
// Shape rules the launchers assume (the backend checks them before calling; see
// CheckPagedAttentionShape): head_dim is even and at most kMaxAttentionHeadDim.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace conveyor::kernels::cuda {

enum class DType { kBf16, kFp16 };

inline constexpr size_t DTypeBytes(DType) { return 2; }

// --- Conversions (convert_kernels.cu) ------------------------------------------------
// dst[i] = T(src[i]), rounding to nearest even.
cudaError_t LaunchF32ToCompute(const float* src, void* dst, size_t count, DType dtype,
                               cudaStream_t stream);
// dst[i] = float(src[i]) (exact).
cudaError_t LaunchComputeToF32(const void* src, float* dst, size_t count, DType dtype,
                               cudaStream_t stream);
// y[r, c] = T(float(y[r, c]) + float(bias[c])) for r < rows, c < cols of a row-major y
// whose rows are `ld` elements apart.
cudaError_t LaunchAddBias(void* y, const void* bias, int rows, int cols, int ld, DType dtype,
                          cudaStream_t stream);

// --- Row movement (rows_kernels.cu) --------------------------------------------------
// out[i, :] = table[rows[i], :] for i < n (embedding lookup and GatherRows).
cudaError_t LaunchGatherRows(const void* table, int hidden, const int32_t* rows, int n, void* out,
                             DType dtype, cudaStream_t stream);
// cache_k[slot[t]] = k[t, :width], cache_v[slot[t]] = v[t, :width] where row t of k and v
// starts at t * row_stride elements; negative slots are skipped (padding tokens).
cudaError_t LaunchWriteKv(const void* k, const void* v, int n, int row_stride, int width,
                          const int32_t* slot_mapping, void* cache_k, void* cache_v, DType dtype,
                          cudaStream_t stream);
// out[t, :] = Σ_j weights[t*k + j] · rows[sources[t*k + j], :] for t < n, summed in float32
// in the order j = 0..k-1 (an MoE layer's combine).
cudaError_t LaunchWeightedRowSum(const void* rows, int width, const int32_t* sources,
                                 const float* weights, int n, int k, void* out, DType dtype,
                                 cudaStream_t stream);

// --- Normalization (norm_kernels.cu) -------------------------------------------------
// out = x * rsqrt(mean(x²) + eps) * weight per row of [n, hidden]; weight is float32.
cudaError_t LaunchRmsNorm(const void* x, const float* weight, int n, int hidden, float eps,
                          void* out, DType dtype, cudaStream_t stream);
// residual = T(residual + x); out = RmsNorm(residual) * weight, one pass per row.
cudaError_t LaunchAddRmsNorm(void* residual, const void* x, const float* weight, int n, int hidden,
                             float eps, void* out, DType dtype, cudaStream_t stream);
// RmsNorm in place over each head_dim-long head of x: heads [num_heads] of row t start at
// t * row_stride elements (Qwen3's q and k norms); weight is float32 [head_dim].
cudaError_t LaunchHeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim,
                              const float* weight, float eps, DType dtype, cudaStream_t stream);

// --- Position encoding (rope_kernels.cu) ----------------------------------------------
// Rotate-half RoPE in place on q [n, num_heads, head_dim] and k [n, num_kv_heads,
// head_dim] (row t at t * row_stride), cos/sin from a float32 table
// [max_positions, head_dim/2] of cos followed by the same of sin.
cudaError_t LaunchRope(void* q, void* k, int n, int row_stride, const int32_t* positions,
                       const float* rope_table, int max_positions, int num_heads, int num_kv_heads,
                       int head_dim, DType dtype, cudaStream_t stream);

// --- MLP activation (activation_kernels.cu) -------------------------------------------
// out[t, i] = silu(gate_up[t, i]) * gate_up[t, ffn + i].
cudaError_t LaunchSiluMul(const void* gate_up, int n, int ffn, void* out, DType dtype,
                          cudaStream_t stream);

// --- Paged attention (attention_kernels.cu) -------------------------------------------
// Every context is cut into partitions of this many positions, always, so a token's
// result never depends on the batch around it.
inline constexpr int kAttentionPartitionTokens = 512;
inline constexpr int kMaxAttentionHeadDim = 256;

struct PagedAttentionArgs {
  const void* q = nullptr;  // [num_tokens, q_row_stride], head h at h * head_dim.
  int q_row_stride = 0;
  const void* k_cache = nullptr;  // [slots, num_kv_heads, head_dim]
  const void* v_cache = nullptr;
  void* out = nullptr;  // [num_tokens, num_heads * head_dim]
  const int32_t* token_seq = nullptr;
  const int32_t* token_pos = nullptr;
  const int32_t* block_tables = nullptr;  // [num_seqs, max_blocks_per_seq]
  int num_tokens = 0;
  int max_blocks_per_seq = 0;
  int block_size = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 1.0f;
};

// Returns nullptr if the kernels support `args`' shape and pointers, else why not.
const char* CheckPagedAttentionShape(const PagedAttentionArgs& args, DType dtype);
// Float32 scratch bytes one token's partial results take (0 when no context can
// need more than one partition).
size_t PagedAttentionScratchBytesPerToken(const PagedAttentionArgs& args);
// out[t] = softmax(q[t]·Kᵀ·scale)·V over positions 0..token_pos[t] of the token's
// sequence. `scratch` must hold PagedAttentionScratchBytesPerToken(args) times
// `tokens_per_launch` bytes; tokens are processed in launches of that many.
cudaError_t LaunchPagedAttention(const PagedAttentionArgs& args, float* scratch,
                                 int tokens_per_launch, DType dtype, cudaStream_t stream);

// --- Weight-only quantized linear layers (quant_linear_kernels.cu) --------------------
// The layout quant_layout.h describes, on the device: rows of `in` weights, each weight
// scale · float(code − zero) − min, rounded as there (no FMA), so the dequantized weights
// equal ggml's bit for bit before any rounding to the compute dtype.
struct QuantLinearPart {
  const uint8_t* codes = nullptr;  // [rows, in · bits / 8]
  const float* scales = nullptr;   // [rows, in / group]
  const float* mins = nullptr;     // As scales, or null (no mins).
  int rows = 0;
  int in = 0;
  int bits = 8;  // 4 or 8.
  int group = 32;
  int zero = 0;
};

// Tokens the fused decode GEMV takes at once; larger batches dequantize into a weight tile
// and use the GEMM.
inline constexpr int kMaxQuantGemvTokens = 8;

// Returns nullptr if the kernels support `part` (bits 4 or 8; group a multiple of 8 that
// divides in; codes 8-byte and scales 4-byte aligned), else why not.
const char* CheckQuantLinearPart(const QuantLinearPart& part);
// y[t, r] = T(Σ_i x[t, i] · w[r, i] + bias[r]) for t < n <= kMaxQuantGemvTokens and
// r < part.rows: one warp per row, the weights dequantized in registers, float32 sums
// (each lane's in a fixed order, then a butterfly over the warp: a token's result does not
// depend on n). x is [n, in] contiguous, y row-strided by ldy, bias [rows] or null.
cudaError_t LaunchQuantGemv(const QuantLinearPart& part, const void* x, int n, const void* bias,
                            void* y, int ldy, DType dtype, cudaStream_t stream);
// out[r, :] = T(w[row_begin + r, :]) for r < num_rows: rows dequantized into a contiguous
// [num_rows, in] tile (16-byte aligned) for the GEMM.
cudaError_t LaunchQuantDequantize(const QuantLinearPart& part, int row_begin, int num_rows,
                                  void* out, DType dtype, cudaStream_t stream);

// --- Sampling (sampling_kernels.cu) ---------------------------------------------------
// The host sampler's semantics (model/sampler.h) for a batch of logit rows whose
// logits are the model's all-gathered [world, rows, shard] buffer in the compute dtype
// (token v of row r at (v / shard, r, v % shard)); model/cuda/cuda_sampler.cc drives it.
inline constexpr int kMaxSampleLogprobs = 20;

struct SampleRowParams {
  float temperature = 0.0f;  // 0: greedy.
  int top_k = 0;             // 0: off.
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int penalty_begin = 0;  // The row's entries [begin, end) of the penalty list.
  int penalty_end = 0;
  int num_logprobs = 0;  // Top alternatives, at most kMaxSampleLogprobs.
  int want_logprob = 0;  // The chosen token's log-probability.
  uint64_t seed = 0;
  uint64_t draw_index = 0;
};

// A distinct token of a row's context that a penalty applies to.
struct PenaltyEntry {
  int32_t token = 0;
  int32_t in_context = 0;    // In prompt or output: the repetition penalty applies.
  int32_t output_count = 0;  // Occurrences in the output: presence/frequency apply.
};

struct SampleRowResult {
  int32_t token_id;
  float logprob;  // Raw log-softmax of token_id (when asked).
  int32_t num_top;
  int32_t top_ids[kMaxSampleLogprobs];
  float top_logprobs[kMaxSampleLogprobs];
};

// Stage 1, every row: float32 copy of the row into `work` [rows, vocab], its log-softmax
// normaliser (`row_lse`) and top log-probabilities, the penalties applied to `work`, the
// argmax (the result of greedy rows); drawing rows get ids 0..vocab-1 in `ids`.
// `rows` rows are sampled; the logits are laid out for `layout_rows` >= rows (a padded
// batch).
cudaError_t LaunchSamplePrepare(const void* logits, int rows, int layout_rows, int shard, int vocab,
                                const SampleRowParams* params, const PenaltyEntry* penalties,
                                float* work, int32_t* ids, float* row_lse, SampleRowResult* results,
                                DType dtype, cudaStream_t stream);
// Stage 2: sorts segments [segment_begin[i], segment_end[i]) of keys (and ids with
// them) descending, stably. With temp == nullptr, sets *temp_bytes to what it needs.
cudaError_t SortRowsDescending(void* temp, size_t* temp_bytes, const float* keys_in,
                               float* keys_out, const int32_t* ids_in, int32_t* ids_out,
                               int64_t num_items, int num_segments, const int32_t* segment_begin,
                               const int32_t* segment_end, cudaStream_t stream);
// Stage 3, rows `draw_rows[0..num_draw)`: top-k, min-p, top-p and the seeded draw over
// the sorted rows.
cudaError_t LaunchSampleDraw(const void* logits, int layout_rows, int shard, int vocab,
                             const SampleRowParams* params, const int32_t* draw_rows, int num_draw,
                             const float* sorted_logits, const int32_t* sorted_ids,
                             const float* row_lse, SampleRowResult* results, DType dtype,
                             cudaStream_t stream);

}  // namespace conveyor::kernels::cuda
