// The CPU backend: fp32 activations in host memory, GEMM through the batch-invariant
// packed kernel (gemm.h), attention through tiled kernels (attention.h), everything
// else as per-token loops split over a thread pool. Each token's result is computed by
// one thread in a fixed order, so it does not depend on the batch around it.
#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <new>

#include "absl/strings/str_cat.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace {

// Tokens per ParallelFor chunk for cheap per-token operations.
constexpr int64_t kRowGrain = 16;

class CpuLinearWeight final : public LinearWeight {
 public:
  CpuLinearWeight(int out, int in, float* packed, float* bias)
      : out_(out), in_(in), packed_(packed), bias_(bias) {}
  ~CpuLinearWeight() override {
    std::free(packed_);
    std::free(bias_);
  }
  int out_features() const override { return out_; }
  int in_features() const override { return in_; }
  size_t size_bytes() const override {
    return PackedGemmWeightBytes(out_, in_) + (bias_ != nullptr ? out_ * sizeof(float) : 0);
  }
  const float* packed() const { return packed_; }
  const float* bias() const { return bias_; }

 private:
  int out_;
  int in_;
  float* packed_;
  float* bias_;  // Null when the layer has none.
};

float* AlignedFloats(size_t count) {
  const size_t bytes = std::max<size_t>(64, (count * sizeof(float) + 63) / 64 * 64);
  return static_cast<float*>(std::aligned_alloc(64, bytes));
}

// Returns 1/sqrt(mean(x²) + eps), accumulated in double in index order.
float InverseRms(const float* x, int hidden, float eps) {
  double sum = 0.0;
  for (int i = 0; i < hidden; ++i) sum += static_cast<double>(x[i]) * x[i];
  return static_cast<float>(1.0 / std::sqrt(sum / hidden + eps));
}

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads) : pool_(num_threads) {}

  std::string name() const override {
    return absl::StrCat("cpu(", GemmKernelName(), ", ", pool_.num_threads(), " threads)");
  }
  size_t activation_bytes() const override { return sizeof(float); }

  absl::StatusOr<void*> Allocate(size_t bytes) override {
    void* p = std::aligned_alloc(64, std::max<size_t>(64, (bytes + 63) / 64 * 64));
    if (p == nullptr) {
      return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", bytes, " bytes"));
    }
    return p;
  }
  void Free(void* ptr) override { std::free(ptr); }
  void CopyToBackend(void* dst, const void* src, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void CopyActivationsToHost(float* dst, const void* src, size_t count) override {
    std::memcpy(dst, src, count * sizeof(float));
  }
  void Synchronize() override {}

  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinear(const float* weight, int out,
                                                           int in, const float* bias) override {
    float* packed = AlignedFloats(PackedGemmWeightBytes(out, in) / sizeof(float));
    float* bias_copy = bias != nullptr ? AlignedFloats(out) : nullptr;
    if (packed == nullptr || (bias != nullptr && bias_copy == nullptr)) {
      std::free(packed);
      std::free(bias_copy);
      return absl::ResourceExhaustedError(
          absl::StrCat("cannot allocate a ", out, "x", in, " weight"));
    }
    PackGemmWeight(weight, out, in, packed);
    if (bias != nullptr) std::memcpy(bias_copy, bias, out * sizeof(float));
    return std::make_unique<CpuLinearWeight>(out, in, packed, bias_copy);
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

  void Embedding(const void* table, int hidden, const int32_t* ids, int n,
                 void* out) override {
    const float* t = static_cast<const float*>(table);
    float* o = static_cast<float*>(out);
    for (int i = 0; i < n; ++i) {
      std::memcpy(o + static_cast<size_t>(i) * hidden, t + static_cast<size_t>(ids[i]) * hidden,
                  hidden * sizeof(float));
    }
  }

  void RmsNorm(const void* x, const void* weight, int n, int hidden, float eps,
               void* out) override {
    const float* xs = static_cast<const float*>(x);
    const float* w = static_cast<const float*>(weight);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* row = xs + t * hidden;
        const float inv = InverseRms(row, hidden, eps);
        for (int i = 0; i < hidden; ++i) o[t * hidden + i] = row[i] * inv * w[i];
      }
    });
  }

  void AddRmsNorm(void* residual, const void* x, const void* weight, int n, int hidden,
                  float eps, void* out) override {
    float* res = static_cast<float*>(residual);
    const float* xs = static_cast<const float*>(x);
    const float* w = static_cast<const float*>(weight);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        float* row = res + t * hidden;
        for (int i = 0; i < hidden; ++i) row[i] += xs[t * hidden + i];
        const float inv = InverseRms(row, hidden, eps);
        for (int i = 0; i < hidden; ++i) o[t * hidden + i] = row[i] * inv * w[i];
      }
    });
  }

  void Linear(const void* x, int n, const LinearWeight& weight, void* out) override {
    const auto& w = static_cast<const CpuLinearWeight&>(weight);
    GemmPacked(static_cast<const float*>(x), w.in_features(), n, w.packed(), w.out_features(),
               w.in_features(), w.bias(), static_cast<float*>(out), w.out_features(), &pool_);
  }

  void Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
            const void* rope_table, int max_positions, const AttentionShape& shape) override {
    const int half = shape.head_dim / 2;
    const float* cos_table = static_cast<const float*>(rope_table);
    const float* sin_table = cos_table + static_cast<size_t>(max_positions) * half;
    float* qs = static_cast<float*>(q);
    float* ks = static_cast<float*>(k);
    auto rotate = [half](float* head, const float* cs, const float* sn) {
      for (int i = 0; i < half; ++i) {
        const float x1 = head[i];
        const float x2 = head[i + half];
        head[i] = x1 * cs[i] - x2 * sn[i];
        head[i + half] = x2 * cs[i] + x1 * sn[i];
      }
    };
    pool_.ParallelFor(n, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* cs = cos_table + static_cast<size_t>(positions[t]) * half;
        const float* sn = sin_table + static_cast<size_t>(positions[t]) * half;
        for (int h = 0; h < shape.num_heads; ++h) {
          rotate(qs + t * row_stride + h * shape.head_dim, cs, sn);
        }
        for (int h = 0; h < shape.num_kv_heads; ++h) {
          rotate(ks + t * row_stride + h * shape.head_dim, cs, sn);
        }
      }
    });
  }

  void WriteKv(const void* k, const void* v, int n, int row_stride,
               const int32_t* slot_mapping, const AttentionShape& shape,
               KvLayer layer) override {
    const size_t slot_floats = static_cast<size_t>(shape.num_kv_heads) * shape.head_dim;
    for (int t = 0; t < n; ++t) {
      const size_t slot = static_cast<size_t>(slot_mapping[t]);
      std::memcpy(static_cast<float*>(layer.k) + slot * slot_floats,
                  static_cast<const float*>(k) + static_cast<size_t>(t) * row_stride,
                  slot_floats * sizeof(float));
      std::memcpy(static_cast<float*>(layer.v) + slot * slot_floats,
                  static_cast<const float*>(v) + static_cast<size_t>(t) * row_stride,
                  slot_floats * sizeof(float));
    }
  }

  void PagedAttention(const void* q, int q_row_stride, const AttentionBatch& batch,
                      const AttentionShape& shape, KvLayer layer, void* out) override {
    PagedAttentionCpu(static_cast<const float*>(q), q_row_stride, batch, shape, layer,
                      static_cast<float*>(out), &pool_);
  }

  void SiluMul(const void* gate_up, int n, int ffn, void* out) override {
    const float* gu = static_cast<const float*>(gate_up);
    float* o = static_cast<float*>(out);
    pool_.ParallelFor(n, kRowGrain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const float* g = gu + t * 2 * ffn;
        const float* u = g + ffn;
        for (int i = 0; i < ffn; ++i) o[t * ffn + i] = g[i] / (1.0f + std::exp(-g[i])) * u[i];
      }
    });
  }

  void GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows,
                  void* out) override {
    for (int i = 0; i < n_rows; ++i) {
      std::memcpy(static_cast<float*>(out) + static_cast<size_t>(i) * hidden,
                  static_cast<const float*>(x) + static_cast<size_t>(rows[i]) * hidden,
                  hidden * sizeof(float));
    }
  }

 private:
  ThreadPool pool_;
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

}  // namespace conveyor::kernels
