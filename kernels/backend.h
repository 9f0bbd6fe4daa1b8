// The math a worker needs for one forward pass, behind one interface with a CPU and a
// CUDA implementation. The model (model/model.h) is written once against it.
//
// Errors. The operations return nothing, because on a GPU they only queue work whose
// failure shows later. Instead a backend records the first failure of any call (a bad
// launch, an unsupported shape, a library error, a fault seen when waiting) and keeps
// it: Synchronize() and last_error() return it, and the operation's name is in its
// message. The error is sticky (a device fault leaves a CUDA context unusable): the
// backend must be rebuilt. Allocate, PackLinear and the uploads return their errors
// directly.
//
// Buffers live in the backend's memory (host memory for `cpu`, device memory for `cuda`)
// and hold activations in the backend's compute dtype. Every operation works on a flat
// batch of tokens that mixes prefill chunks and decode tokens of different sequences.
//
// Batch invariance: every operation computes a token's outputs with a reduction order
// that depends only on that token's inputs (never on how many other tokens are in the
// batch or where it sits), so a sequence produces the same bits alone or batched.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/cpu_weight_dtype.h"
#include "kernels/quant_blocks.h"

namespace conveyor::kernels {

// A linear layer's weight [out_features, in_features] (+ optional bias), in whatever
// layout the backend computes fastest from. Made by Backend::PackLinear.
class LinearWeight {
 public:
  virtual ~LinearWeight() = default;
  virtual int out_features() const = 0;
  virtual int in_features() const = 0;
  // Bytes of backend memory the packed weight occupies.
  virtual size_t size_bytes() const = 0;
};

// One layer's paged KV cache: K and V, num_slots x num_kv_heads x head_dim elements each,
// where slot = block_id * block_size + offset_in_block. The order of those elements is the
// backend's own (only WriteKv writes them and only PagedAttention reads them): the CUDA
// backend keeps [num_slots, num_kv_heads, head_dim]; the CPU backend keeps each block's
// keys transposed, so attention reads a block's K as whole vectors of positions
// (internal::CpuKvLayout in kernels/cpu/attention.h).
struct KvLayer {
  void* k = nullptr;
  void* v = nullptr;
  int block_size = 0;  // Slots per block; the cache holds a whole number of blocks.
};

// Per-step attention metadata for the flat batch (all pointers in backend memory).
struct AttentionBatch {
  int num_tokens = 0;
  const int32_t* token_seq = nullptr;     // [num_tokens]: index of the token's sequence.
  const int32_t* token_pos = nullptr;     // [num_tokens]: the token's position in it.
  const int32_t* slot_mapping = nullptr;  // [num_tokens]: KV slot the token writes.
  int num_seqs = 0;
  // [num_seqs, max_blocks_per_seq]: each sequence's block table, padded.
  const int32_t* block_tables = nullptr;
  int max_blocks_per_seq = 0;
  int block_size = 0;
};

struct AttentionShape {
  int num_heads = 0;     // Query heads on this rank.
  int num_kv_heads = 0;  // KV heads on this rank.
  int head_dim = 0;
  float scale = 1.0f;  // Usually 1/sqrt(head_dim).
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual std::string name() const = 0;
  // Bytes per activation element (4 for fp32 compute).
  virtual size_t activation_bytes() const = 0;
  // Bytes per KV-cache element: the activations' dtype, unless the backend keeps the cache
  // narrower (the CPU backend with bf16 K/V under float32 activations).
  virtual size_t kv_element_bytes() const { return activation_bytes(); }

  // --- Memory -----------------------------------------------------------------------
  // Returns `bytes` of backend memory (64-byte aligned), or RESOURCE_EXHAUSTED.
  virtual absl::StatusOr<void*> Allocate(size_t bytes) = 0;
  virtual void Free(void* ptr) = 0;
  // Raw copies between host and backend memory (metadata such as token ids).
  virtual void CopyToBackend(void* dst, const void* host_src, size_t bytes) = 0;
  // Copies `count` activations (compute dtype) to host float32, converting.
  virtual void CopyActivationsToHost(float* host_dst, const void* src, size_t count) = 0;
  // Blocks until queued work is done (no wait for the CPU); returns last_error().
  virtual absl::Status Synchronize() = 0;
  // The first error any operation recorded since the backend was made (OK if none),
  // without waiting for queued work.
  virtual absl::Status last_error() const = 0;

  // --- Weights ----------------------------------------------------------------------
  // Packs a float32 row-major weight [out, in] (and bias [out] or null) for Linear.
  virtual absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinear(const float* weight,
                                                                   int out_features,
                                                                   int in_features,
                                                                   const float* bias) = 0;
  // PackLinear for a weight whose rounding could change a discrete choice (an MoE router:
  // which experts a token goes to). Kept in float32 where the backend would narrow its
  // weights below the activations' precision (the CPU's bf16 and int8 weights); elsewhere
  // the same as PackLinear.
  virtual absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinearFullPrecision(const float* weight,
                                                                                int out_features,
                                                                                int in_features,
                                                                                const float* bias) {
    return PackLinear(weight, out_features, in_features, bias);
  }
  // Packs a weight whose rows are kept in GGUF blocks: `parts` stacked in order (out
  // features: the sum of their rows), each row `in_features` wide (a whole number of its
  // blocks), and bias [out] or null. The bytes are copied. UNIMPLEMENTED where the backend
  // does not compute on these blocks (the default; the CPU backend unless made to keep
  // them): the caller then dequantizes and calls PackLinear.
  virtual absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinearQuantized(
      std::span<const QuantizedRows> parts, int in_features, const float* bias) {
    return absl::UnimplementedError(name() + " does not compute on block-quantized weights");
  }
  // Copies a float32 host tensor into backend memory in the compute dtype (embeddings).
  virtual absl::StatusOr<void*> UploadCompute(const float* host, size_t count) = 0;
  // Copies a float32 host tensor into backend memory kept as float32 (norm weights, the
  // RoPE table: small, and precision matters there).
  virtual absl::StatusOr<void*> UploadF32(const float* host, size_t count) = 0;

  // --- Operations (activation pointers in backend memory) ----------------------------
  // out[t, :] = table[ids[t], :] for t < n; ids are in [0, rows) (checked by the caller).
  virtual void Embedding(const void* table, int hidden, const int32_t* ids, int n, void* out) = 0;
  // out = RMSNorm(x) * weight, per row of [n, hidden]; weight is float32.
  virtual void RmsNorm(const void* x, const void* weight, int n, int hidden, float eps,
                       void* out) = 0;
  // residual += x; out = RMSNorm(residual) * weight, per row.
  virtual void AddRmsNorm(void* residual, const void* x, const void* weight, int n, int hidden,
                          float eps, void* out) = 0;
  // out[n, out_features] = x[n, in_features] · Wᵀ (+ bias).
  virtual void Linear(const void* x, int n, const LinearWeight& weight, void* out) = 0;
  // A grouped GEMM (the experts of a mixture-of-experts layer): rows [offsets[g],
  // offsets[g + 1]) of x times weights[g], into the same rows of out, for g < num_groups.
  // `offsets` is host memory, non-decreasing from 0; empty groups read nothing, so each
  // weight is read once for all of its rows. The weights share their shapes. The default
  // runs one Linear per group.
  virtual void GroupedLinear(const void* x, const LinearWeight* const* weights, const int* offsets,
                             int num_groups, void* out);
  // Normalises each head of x in place: for t < n and h < num_heads, the head_dim values
  // at x + t * row_stride + h * head_dim become RMSNorm(head) * weight (float32
  // [head_dim]). Qwen3's norm of q and k.
  virtual void HeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim,
                           const void* weight, float eps) = 0;
  // Rotates q [n, num_heads, head_dim] and k [n, num_kv_heads, head_dim] in place by
  // each token's position (rotate-half convention), with cos/sin rows from `rope_table`
  // (float32 [max_positions, head_dim / 2] cos, then the same of sin). q and k may be strided:
  // row t starts at base + t * row_stride elements.
  virtual void Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
                    const void* rope_table, int max_positions, const AttentionShape& shape) = 0;
  // Writes k, v rows (strided as in Rope) into their KV slots.
  virtual void WriteKv(const void* k, const void* v, int n, int row_stride,
                       const int32_t* slot_mapping, const AttentionShape& shape, KvLayer layer) = 0;
  // out[t] = softmax(q[t]·Kᵀ·scale) V over positions 0..token_pos[t] of the token's
  // sequence (causal; K/V of the token itself must already be written).
  virtual void PagedAttention(const void* q, int q_row_stride, const AttentionBatch& batch,
                              const AttentionShape& shape, KvLayer layer, void* out) = 0;
  // out[t, :] = silu(gate_up[t, :ffn]) * gate_up[t, ffn:] for [n, 2 * ffn] input.
  virtual void SiluMul(const void* gate_up, int n, int ffn, void* out) = 0;
  // out[i, :] = x[rows[i], :] for i < n_rows.
  virtual void GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows,
                          void* out) = 0;
  // out[t, :] = Σ_j weights[t * k + j] · rows[sources[t * k + j], :], summed in the order
  // j = 0, 1, …, k-1, for t < n (an MoE layer combining a token's experts). `sources` and
  // `weights` (float32) are in backend memory.
  virtual void WeightedRowSum(const void* rows, int width, const int32_t* sources,
                              const float* weights, int n, int k, void* out) = 0;

  // --- Graphs (optional: the CUDA backend's CUDA graphs) ------------------------------
  // Operations called between BeginCapture and EndCapture are recorded instead of run;
  // Replay(id) runs the recording again: the same operations on the same pointers and
  // shapes, whatever the memory then holds, for a fraction of the launch cost. Nothing
  // that allocates, copies from the host or synchronises may be called while capturing.
  // Backends without graphs return UNIMPLEMENTED from BeginCapture.
  virtual bool supports_graphs() const { return false; }
  virtual absl::Status BeginCapture() {
    return absl::UnimplementedError(name() + " has no graphs");
  }
  // Ends the capture; the graph's id for Replay.
  virtual absl::StatusOr<int> EndCapture() {
    return absl::UnimplementedError(name() + " has no graphs");
  }
  virtual void Replay(int graph) {}
  // Forgets every graph (their pointers are about to be freed).
  virtual void DropGraphs() {}
};

inline void Backend::GroupedLinear(const void* x, const LinearWeight* const* weights,
                                   const int* offsets, int num_groups, void* out) {
  if (num_groups == 0) return;
  const size_t in_bytes = weights[0]->in_features() * activation_bytes();
  const size_t out_bytes = weights[0]->out_features() * activation_bytes();
  for (int g = 0; g < num_groups; ++g) {
    const int rows = offsets[g + 1] - offsets[g];
    if (rows == 0) continue;
    Linear(static_cast<const char*>(x) + offsets[g] * in_bytes, rows, *weights[g],
           static_cast<char*>(out) + offsets[g] * out_bytes);
  }
}

// Owns backend memory: frees it through the backend that allocated it.
struct BackendDeleter {
  Backend* backend = nullptr;
  void operator()(void* ptr) const {
    if (ptr != nullptr) backend->Free(ptr);
  }
};
using BackendBuffer = std::unique_ptr<void, BackendDeleter>;

// Allocates `bytes` on `backend` as an owning buffer.
inline absl::StatusOr<BackendBuffer> AllocateBuffer(Backend* backend, size_t bytes) {
  absl::StatusOr<void*> ptr = backend->Allocate(bytes);
  if (!ptr.ok()) return ptr.status();
  return BackendBuffer(*ptr, BackendDeleter{backend});
}

// The CPU backend: our own fixed-reduction-order GEMM (AVX-512 where available),
// multi-threaded over `num_threads` threads (0: one per core), with weights stored as
// `weights` and the KV cache as `kv` (docs/cpu-attention.md). With `keep_quantized`,
// PackLinearQuantized keeps GGUF block-quantized weights in their blocks (quant_gemm.h)
// and `weights` applies to the rest; without, it is UNIMPLEMENTED, so they are dequantized.
std::unique_ptr<Backend> MakeCpuBackend(int num_threads,
                                        CpuWeightDtype weights = CpuWeightDtype::kF32,
                                        CpuKvDtype kv = CpuKvDtype::kF32,
                                        bool keep_quantized = false);

}  // namespace conveyor::kernels
