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
// y[r, c] = T(float(y[r, c]) + float(bias[c])) for a row-major [rows, cols] y.
cudaError_t LaunchAddBias(void* y, const void* bias, int rows, int cols, DType dtype,
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

// --- Normalization (norm_kernels.cu) -------------------------------------------------
// out = x * rsqrt(mean(x²) + eps) * weight per row of [n, hidden]; weight is float32.
cudaError_t LaunchRmsNorm(const void* x, const float* weight, int n, int hidden, float eps,
                          void* out, DType dtype, cudaStream_t stream);
// residual = T(residual + x); out = RmsNorm(residual) * weight, one pass per row.
cudaError_t LaunchAddRmsNorm(void* residual, const void* x, const float* weight, int n, int hidden,
                             float eps, void* out, DType dtype, cudaStream_t stream);

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

}  // namespace conveyor::kernels::cuda
