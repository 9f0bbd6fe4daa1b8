#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace internal {

void GemmPanelPortable(const float* x, int ldx, int m, const float* panel, int k,
                       const float* bias, float* y, int ldy, int cols) {
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < k; ++i) acc = std::fma(x[r * ldx + i], panel[i * kGemmPanelWidth + j], acc);
      y[static_cast<long>(r) * ldy + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace internal

namespace {

internal::GemmPanelKernel SelectKernel() {
  return __builtin_cpu_supports("avx512f") ? internal::GemmPanelAvx512
                                           : internal::GemmPanelPortable;
}

const internal::GemmPanelKernel kKernel = SelectKernel();

int NumPanels(int n) { return (n + kGemmPanelWidth - 1) / kGemmPanelWidth; }

}  // namespace

const char* GemmKernelName() {
  return kKernel == internal::GemmPanelAvx512 ? "avx512" : "portable";
}

size_t PackedGemmWeightBytes(int n, int k) {
  return static_cast<size_t>(NumPanels(n)) * k * kGemmPanelWidth * sizeof(float);
}

void PackGemmWeight(const float* w, int n, int k, float* packed) {
  for (int p = 0; p < NumPanels(n); ++p) {
    float* panel = packed + static_cast<size_t>(p) * k * kGemmPanelWidth;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < kGemmPanelWidth; ++j) {
        const int col = p * kGemmPanelWidth + j;
        panel[i * kGemmPanelWidth + j] = col < n ? w[static_cast<size_t>(col) * k + i] : 0.0f;
      }
    }
  }
}

void GemmPacked(const float* x, int ldx, int m, const float* packed, int n, int k,
                const float* bias, float* y, int ldy, ThreadPool* pool) {
  const int num_panels = NumPanels(n);
  const size_t panel_bytes = static_cast<size_t>(k) * kGemmPanelWidth * sizeof(float);
  // Panels a thread takes at once: enough to stay in L2 while every row tile of X
  // passes over them.
  int64_t panels_per_chunk =
      std::max<int64_t>(1, static_cast<int64_t>((512u << 10) / panel_bytes));
  // ...but small enough that every thread gets several chunks to balance the load.
  if (pool != nullptr) {
    panels_per_chunk = std::clamp<int64_t>(num_panels / (4 * pool->num_threads()), 1,
                                           panels_per_chunk);
  }
  auto run = [&](int64_t p_begin, int64_t p_end) {
    for (int r = 0; r < m; r += internal::kGemmMaxRows) {
      const int rows = std::min(internal::kGemmMaxRows, m - r);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int col = static_cast<int>(p) * kGemmPanelWidth;
        kKernel(x + static_cast<size_t>(r) * ldx, ldx, rows,
                packed + static_cast<size_t>(p) * k * kGemmPanelWidth, k,
                bias != nullptr ? bias + col : nullptr, y + static_cast<size_t>(r) * ldy + col,
                ldy, std::min(kGemmPanelWidth, n - col));
      }
    }
  };
  if (pool == nullptr) {
    run(0, num_panels);
  } else {
    pool->ParallelFor(num_panels, panels_per_chunk, run);
  }
}

}  // namespace conveyor::kernels
