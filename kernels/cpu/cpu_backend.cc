// The CPU backend: fp32 activations in host memory, GEMM through the batch-invariant
// packed kernel (gemm.h) over f32, bf16 or int8 weights, attention through tiled kernels
// (attention.h), everything else as per-token row kernels (row_kernels.h) or row copies split over
// a thread pool by rows. Each token's result is computed by one thread in a fixed order, so it does
// not depend on the batch around it.
#include <sys/mman.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/gemm_kernels.h"  // ToBf16Strided
#include "kernels/cpu/quant_gemm.h"
#include "kernels/cpu/row_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace {

// Floats (about 64 KiB) a ParallelFor chunk of a per-token operation should cover, so
// that a chunk's work outweighs handing it to another thread.
constexpr int64_t kChunkFloats = int64_t{16} << 10;

// Rows per chunk for an operation that touches `row_floats` floats per row.
int64_t RowGrain(int64_t row_floats) {
  return std::max<int64_t>(1, kChunkFloats / std::max<int64_t>(1, row_floats));
}

// A linear weight: packed panels (gemm.h), or GGUF blocks (quant_gemm.h).
class CpuLinearWeight final : public LinearWeight {
 public:
  // Takes ownership of the scales and bias (std::free'd), and of the panels unless they
  // live in the backend's WeightArena (`arena_memory`).
  CpuLinearWeight(PackedGemmWeight packed, float* bias, bool arena_memory)
      : packed_(packed), bias_(bias), arena_memory_(arena_memory) {}
  // Block-quantized: `parts` point into `blocks` (`block_bytes` of them; owned, std::free'd,
  // unless in the arena).
  CpuLinearWeight(std::vector<QuantizedRows> parts, int in, void* blocks, size_t block_bytes,
                  float* bias, bool arena_memory)
      : bias_(bias),
        arena_memory_(arena_memory),
        quant_parts_(std::move(parts)),
        quant_blocks_(blocks),
        quant_bytes_(block_bytes) {
    packed_.n = 0;
    for (const QuantizedRows& p : quant_parts_) packed_.n += p.rows;
    packed_.k = in;
  }
  ~CpuLinearWeight() override {
    if (!arena_memory_) std::free(quantized() ? quant_blocks_ : packed_.panels);
    std::free(packed_.scales);
    std::free(bias_);
  }
  CpuLinearWeight(const CpuLinearWeight&) = delete;
  CpuLinearWeight& operator=(const CpuLinearWeight&) = delete;
  int out_features() const override { return packed_.n; }
  int in_features() const override { return packed_.k; }
  size_t size_bytes() const override {
    const size_t weights = quantized() ? quant_bytes_
                                       : PackedGemmPanelBytes(packed_.type, packed_.n, packed_.k) +
                                             PackedGemmScaleBytes(packed_.type, packed_.n);
    return weights + (bias_ != nullptr ? packed_.n * sizeof(float) : 0);
  }
  bool quantized() const { return !quant_parts_.empty(); }
  const float* bias() const { return bias_; }

  // y[m, out] (row stride ldy) = x[m, in] (row stride ldx) · Wᵀ + b.
  void Apply(const float* x, int ldx, int m, float* y, int ldy, ThreadPool* pool) const {
    if (quantized()) {
      GemmQuantized(x, ldx, m, packed_.k, quant_parts_, bias_, y, ldy, pool);
    } else {
      GemmPackedAs(x, ldx, m, packed_, bias_, y, ldy, pool);
    }
  }

 private:
  PackedGemmWeight packed_;  // n and k only, when quantized.
  float* bias_;              // Null when the layer has none.
  bool arena_memory_;
  std::vector<QuantizedRows> quant_parts_;
  void* quant_blocks_ = nullptr;
  size_t quant_bytes_ = 0;
};

// 64-byte aligned memory, freed with std::free. A buffer of 2 MiB or more (weights, the
// KV cache) is aligned to 2 MiB and asked to be backed by transparent huge pages, where
// the kernel allows it ("madvise" mode is common): decode streams the weights and
// attention walks KV blocks scattered over gigabytes, and with 4 KiB pages both would
// miss the TLB every few kilobytes. A refusal only costs that speed.
void* AlignedBytes(size_t bytes) {
  constexpr size_t kHugePage = size_t{2} << 20;
  if (bytes < kHugePage)
    return std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
  const size_t size = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, size);
  if (p != nullptr) madvise(p, size, MADV_HUGEPAGE);
  return p;
}

float* AlignedFloats(size_t count) {
  return static_cast<float*>(AlignedBytes(count * sizeof(float)));
}

// Weight panels under 2 MiB (the experts of an MoE layer: Qwen3-30B-A3B's are 1.2 MiB
// each in bf16, 18 000 of them) would each get their own 4 KiB pages from AlignedBytes,
// and a decode step that streams a few hundred of them would miss the TLB every 4 KiB.
// The arena packs them one after another into huge-page-backed chunks instead. Nothing
// is freed before the arena (the backend, which lives as long as its model) goes.
class WeightArena {
 public:
  static constexpr size_t kChunkBytes = size_t{64} << 20;
  WeightArena() = default;
  WeightArena(const WeightArena&) = delete;
  WeightArena& operator=(const WeightArena&) = delete;
  ~WeightArena() {
    for (void* chunk : chunks_) std::free(chunk);
  }
  // 64-byte aligned; null if out of memory. `bytes` must be under kChunkBytes.
  void* Allocate(size_t bytes) {
    bytes = (bytes + 63) / 64 * 64;
    const std::lock_guard<std::mutex> lock(mu_);
    if (chunks_.empty() || used_ + bytes > kChunkBytes) {
      void* chunk = AlignedBytes(kChunkBytes);
      if (chunk == nullptr) return nullptr;
      chunks_.push_back(chunk);
      used_ = 0;
    }
    void* p = static_cast<char*>(chunks_.back()) + used_;
    used_ += bytes;
    return p;
  }

 private:
  std::mutex mu_;
  std::vector<void*> chunks_;
  size_t used_ = 0;  // Of the last chunk.
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(int num_threads, CpuWeightDtype weights, CpuKvDtype kv, bool keep_quantized)
      : weight_type_(weights), kv_type_(kv), keep_quantized_(keep_quantized), pool_(num_threads) {}

  std::string name() const override {
    // bf16 says how it multiplies (vdpbf16ps or the FMAs: the same bits, gemm.h).
    const std::string arithmetic =
        weight_type_ == CpuWeightDtype::kBf16
            ? absl::StrCat(" (", Bf16ArithmeticName(kernels_.bf16_arithmetic), ")")
            : "";
    const std::string quantized =
        keep_quantized_ ? absl::StrCat("GGUF blocks kept (", QuantGemmKernelName(), "), else ")
                        : "";
    return absl::StrCat("cpu(", CpuIsaName(kernels_.isa), ", ", quantized,
                        CpuWeightDtypeName(weight_type_), " weights", arithmetic, ", ",
                        CpuKvDtypeName(kv_type_), " KV, ", pool_.num_threads(), " threads)");
  }
  size_t activation_bytes() const override { return sizeof(float); }
  size_t kv_element_bytes() const override {
    return kv_type_ == CpuKvDtype::kBf16 ? sizeof(uint16_t) : sizeof(float);
  }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = AlignedBytes(bytes);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  // An empty copy may come with null pointers (an empty vector's data()), which memcpy
  // must not be given even for 0 bytes.
  void CopyToBackend(void* dst, const void* src, size_t bytes) override {
    if (bytes != 0) std::memcpy(dst, src, bytes);
  }
  void CopyActivationsToHost(float* dst, const void* src, size_t count) override {
    if (count != 0) std::memcpy(dst, src, count * sizeof(float));
  }
  // Every operation completes before it returns, and none can fail once its buffers
  // exist: there is nothing to wait for and no error to record.
  absl::Status Synchronize() override { return absl::OkStatus(); }
  absl::Status last_error() const override { return absl::OkStatus(); }

  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinear(const float* weight, int out, int in,
                                                           const float* bias) override {
    return PackAs(weight_type_, weight, out, in, bias);
  }
  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinearFullPrecision(
      const float* weight, int out, int in, const float* bias) override {
    return PackAs(CpuWeightDtype::kF32, weight, out, in, bias);
  }

  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinearQuantized(
      std::span<const QuantizedRows> parts, int in, const float* bias) override {
    if (!keep_quantized_) {
      return absl::UnimplementedError(
          absl::StrCat(name(), " dequantizes GGUF blocks (--cpu_weight_dtype is not auto)"));
    }
    int out = 0;
    for (const QuantizedRows& p : parts) {
      if (in <= 0 || in % QuantBlockElements(p.type) != 0 || p.rows < 0) {
        return absl::InvalidArgumentError(absl::StrCat("PackLinearQuantized: ", in,
                                                       " inputs are not whole ",
                                                       QuantBlockTypeName(p.type), " blocks"));
      }
      out += p.rows;
    }
    if (out == 0) return absl::InvalidArgumentError("PackLinearQuantized: no rows");
    const size_t bytes = QuantizedPackBytes(parts, in);
    const bool in_arena = bytes < (size_t{2} << 20);
    void* blocks = in_arena ? arena_.Allocate(bytes) : AlignedBytes(bytes);
    float* bias_copy = bias != nullptr ? AlignedFloats(out) : nullptr;
    if (blocks == nullptr || (bias != nullptr && bias_copy == nullptr)) {
      if (!in_arena) std::free(blocks);
      std::free(bias_copy);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a ", out, "x", in, " quantized weight"));
    }
    // The blocks as this level's kernels read them (AVX-512 VNNI: repacked into panels).
    std::vector<QuantizedRows> copied = PackQuantized(parts, in, blocks);
    if (bias != nullptr) std::memcpy(bias_copy, bias, out * sizeof(float));
    return std::make_unique<CpuLinearWeight>(std::move(copied), in, blocks, bytes, bias_copy,
                                             in_arena);
  }

  // Compute dtype is float32, so both uploads are plain copies.
  absl::StatusOr<void*> UploadCompute(const float* host, size_t count) override {
    return UploadF32(host, count);
  }
  absl::StatusOr<void*> UploadF32(const float* host, size_t count) override {
    auto mem = Allocate(count * sizeof(float));
    if (!mem.ok()) return mem.status();
    std::memcpy(*mem, host, count * sizeof(float));
    return *mem;
  }

  void Embedding(const void* table, int hidden, const int32_t* ids, int n, void* out) override {
    CopyRows(static_cast<const float*>(table), hidden, ids, n, static_cast<float*>(out));
  }

  void RmsNorm(const void* x, const void* weight, int n, int hidden, float eps,
               void* out) override {
    const float* xs = static_cast<const float*>(x);
    const float* w = static_cast<const float*>(weight);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, RowGrain(hidden), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        row_kernels_.rms_norm(xs + t * hidden, w, hidden, eps, o + t * hidden);
      }
    });
  }

  void AddRmsNorm(void* residual, const void* x, const void* weight, int n, int hidden, float eps,
                  void* out) override {
    float* res = static_cast<float*>(residual);
    const float* xs = static_cast<const float*>(x);
    const float* w = static_cast<const float*>(weight);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, RowGrain(2 * int64_t{hidden}), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        row_kernels_.add_rms_norm(res + t * hidden, xs + t * hidden, w, hidden, eps,
                                  o + t * hidden);
      }
    });
  }

  void Linear(const void* x, int n, const LinearWeight& weight, void* out) override {
    const auto& w = static_cast<const CpuLinearWeight&>(weight);
    w.Apply(static_cast<const float*>(x), w.in_features(), n, static_cast<float*>(out),
            w.out_features(), &pool_);
  }

  // Each group's GEMM on one thread when there are enough groups to share out (an MoE
  // layer's experts, each with a few rows at decode); otherwise the groups one after
  // another, each split over the pool. Either way a row's result is GemmPackedAs's, which
  // does not depend on the threads or the rows around it.
  void GroupedLinear(const void* x, const LinearWeight* const* weights, const int* offsets,
                     int num_groups, void* out) override {
    if (num_groups == 0) return;
    const int in = weights[0]->in_features();
    const int out_width = weights[0]->out_features();
    const float* xs = static_cast<const float*>(x);
    float* ys = static_cast<float*>(out);
    auto run = [&](int g, ThreadPool* pool) {
      const int rows = offsets[g + 1] - offsets[g];
      if (rows == 0) return;
      const auto& w = static_cast<const CpuLinearWeight&>(*weights[g]);
      w.Apply(xs + static_cast<size_t>(offsets[g]) * in, in, rows,
              ys + static_cast<size_t>(offsets[g]) * out_width, out_width, pool);
    };
    int used = 0;
    for (int g = 0; g < num_groups; ++g) used += offsets[g + 1] > offsets[g] ? 1 : 0;
    if (used < 2 * pool_.num_threads()) {
      for (int g = 0; g < num_groups; ++g) run(g, &pool_);
      return;
    }
    pool_.ParallelFor(num_groups, 1, [&](int64_t begin, int64_t end) {
      for (int64_t g = begin; g < end; ++g) run(static_cast<int>(g), nullptr);
    });
  }

  void HeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim, const void* weight,
                   float eps) override {
    float* xs = static_cast<float*>(x);
    const float* w = static_cast<const float*>(weight);
    pool_.ParallelFor(n, RowGrain(int64_t{num_heads} * head_dim), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        for (int h = 0; h < num_heads; ++h) {
          float* head = xs + t * row_stride + static_cast<int64_t>(h) * head_dim;
          row_kernels_.rms_norm(head, w, head_dim, eps, head);
        }
      }
    });
  }

  void Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
            const void* rope_table, int max_positions, const AttentionShape& shape) override {
    const int half = shape.head_dim / 2;
    const float* cos_table = static_cast<const float*>(rope_table);
    const float* sin_table = cos_table + static_cast<size_t>(max_positions) * half;
    float* qs = static_cast<float*>(q);
    float* ks = static_cast<float*>(k);
    const int64_t row_floats =
        static_cast<int64_t>(shape.num_heads + shape.num_kv_heads) * shape.head_dim;
    pool_.ParallelFor(n, RowGrain(row_floats), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cs = cos_table + static_cast<size_t>(positions[t]) * half;
        const float* sn = sin_table + static_cast<size_t>(positions[t]) * half;
        row_kernels_.rope(qs + t * row_stride, shape.num_heads, shape.head_dim, cs, sn);
        row_kernels_.rope(ks + t * row_stride, shape.num_kv_heads, shape.head_dim, cs, sn);
      }
    });
  }

  void WriteKv(const void* k, const void* v, int n, int row_stride, const int32_t* slot_mapping,
               const AttentionShape& shape, KvLayer layer) override {
    if (kv_type_ == CpuKvDtype::kBf16) {
      WriteKvAs<uint16_t>(k, v, n, row_stride, slot_mapping, shape, layer);
    } else {
      WriteKvAs<float>(k, v, n, row_stride, slot_mapping, shape, layer);
    }
  }

  void PagedAttention(const void* q, int q_row_stride, const AttentionBatch& batch,
                      const AttentionShape& shape, KvLayer layer, void* out) override {
    PagedAttentionCpu(static_cast<const float*>(q), q_row_stride, batch, shape, layer, kv_type_,
                      static_cast<float*>(out), &pool_);
  }

  void SiluMul(const void* gate_up, int n, int ffn, void* out) override {
    const float* gu = static_cast<const float*>(gate_up);
    float* o = static_cast<float*>(out);
    // Reads gate and up, writes out: three floats per output.
    pool_.ParallelFor(n, RowGrain(3 * int64_t{ffn}), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* g = gu + t * 2 * ffn;
        row_kernels_.silu_mul(g, g + ffn, ffn, o + t * ffn);
      }
    });
  }

  void GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows, void* out) override {
    CopyRows(static_cast<const float*>(x), hidden, rows, n_rows, static_cast<float*>(out));
  }

  void WeightedRowSum(const void* rows, int width, const int32_t* sources, const float* weights,
                      int n, int k, void* out) override {
    const float* src = static_cast<const float*>(rows);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, RowGrain(int64_t{k + 1} * width), [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* y = o + t * width;
        std::fill(y, y + width, 0.0f);
        for (int j = 0; j < k; ++j) {
          const float w = weights[t * k + j];
          const float* r = src + static_cast<size_t>(sources[t * k + j]) * width;
          for (int i = 0; i < width; ++i) y[i] += w * r[i];
        }
      }
    });
  }

 private:
  absl::StatusOr<std::unique_ptr<LinearWeight>> PackAs(CpuWeightDtype type, const float* weight,
                                                       int out, int in, const float* bias) {
    PackedGemmWeight packed;
    const size_t panel_bytes = PackedGemmPanelBytes(type, out, in);
    const bool in_arena = panel_bytes < (size_t{2} << 20);
    packed.panels = in_arena ? arena_.Allocate(panel_bytes) : AlignedBytes(panel_bytes);
    const size_t scale_bytes = PackedGemmScaleBytes(type, out);
    packed.scales = scale_bytes > 0 ? static_cast<float*>(AlignedBytes(scale_bytes)) : nullptr;
    float* bias_copy = bias != nullptr ? AlignedFloats(out) : nullptr;
    if (packed.panels == nullptr || (scale_bytes > 0 && packed.scales == nullptr) ||
        (bias != nullptr && bias_copy == nullptr)) {
      if (!in_arena) std::free(packed.panels);
      std::free(packed.scales);
      std::free(bias_copy);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a ", out, "x", in, " weight"));
    }
    PackGemmWeightAs(type, weight, out, in, &packed);
    if (bias != nullptr) std::memcpy(bias_copy, bias, out * sizeof(float));
    return std::make_unique<CpuLinearWeight>(packed, bias_copy, in_arena);
  }

  // out[c * stride] = in[c] for c < n, as T (bf16: rounded to nearest even).
  template <typename T>
  static void Narrow(const float* in, int n, T* out, ptrdiff_t stride) {
    if constexpr (std::is_same_v<T, uint16_t>) {
      internal::ToBf16Strided(in, n, out, stride);
    } else {
      for (int c = 0; c < n; ++c) out[c * stride] = in[c];
    }
  }

  // K goes into its slot's column of the block (transposed), V into its row
  // (CpuKvLayout); as bf16, each value rounded to nearest even.
  template <typename T>
  void WriteKvAs(const void* k, const void* v, int n, int row_stride, const int32_t* slot_mapping,
                 const AttentionShape& shape, KvLayer layer) {
    const internal::CpuKvLayout layout{shape.num_kv_heads, shape.head_dim, layer.block_size};
    const int d = shape.head_dim;
    T* k_cache = static_cast<T*>(layer.k);
    T* v_cache = static_cast<T*>(layer.v);
    const int64_t grain = RowGrain(2 * static_cast<int64_t>(shape.num_kv_heads) * d);
    pool_.ParallelFor(n, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const size_t slot = static_cast<size_t>(slot_mapping[t]);
        const float* k_row = static_cast<const float*>(k) + t * row_stride;
        const float* v_row = static_cast<const float*>(v) + t * row_stride;
        for (int h = 0; h < shape.num_kv_heads; ++h) {
          Narrow<T>(k_row + h * d, d, k_cache + layout.K(slot, h, 0), layer.block_size);
          Narrow<T>(v_row + h * d, d, v_cache + layout.V(slot, h, 0), 1);
        }
      }
    });
  }

  // out[i, :] = src[rows[i], :] for i < n, rows of `width` floats.
  void CopyRows(const float* src, int width, const int32_t* rows, int n, float* out) {
    pool_.ParallelFor(n, RowGrain(width), [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
        std::memcpy(out + i * width, src + static_cast<size_t>(rows[i]) * width,
                    width * sizeof(float));
      }
    });
  }

  // The process's kernel set (cpu_kernels.h); the GEMM and attention take theirs from it
  // too.
  const internal::CpuKernels& kernels_ = internal::ActiveCpuKernels();
  const internal::RowKernels& row_kernels_ = *kernels_.rows;
  const CpuWeightDtype weight_type_;
  const CpuKvDtype kv_type_;
  const bool keep_quantized_;
  WeightArena arena_;  // Before any weight is made, after every weight is gone.
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int num_threads, CpuWeightDtype weights, CpuKvDtype kv,
                                        bool keep_quantized) {
  return std::make_unique<CpuBackend>(num_threads, weights, kv, keep_quantized);
}

}  // namespace conveyor::kernels
