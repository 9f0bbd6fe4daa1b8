#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>

#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace internal {

// Ignores the prefetch hint: a CPU without AVX-512 has other bottlenecks.
void GemmPanelPortable(const float* x, int ldx, int m, const float* panel, int k, const float* bias,
                       float* y, int ldy, int cols, const float* prefetch, int prefetch_lines) {
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < k; ++i)
        acc = std::fma(x[r * ldx + i], panel[i * kGemmPanelWidth + j], acc);
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
  const size_t panel_floats = static_cast<size_t>(k) * kGemmPanelWidth;
  const size_t panel_bytes = panel_floats * sizeof(float);
  // Panels a thread takes at once: enough to stay in L2 while every row tile of X
  // passes over them.
  int64_t panels_per_chunk = std::max<int64_t>(1, static_cast<int64_t>((512u << 10) / panel_bytes));
  // ...but small enough that every thread gets several chunks: to balance the load, and
  // because a thread's first chunk cannot be prefetched (see run_chunk).
  if (pool != nullptr) {
    panels_per_chunk =
        std::clamp<int64_t>(num_panels / (8 * pool->num_threads()), 1, panels_per_chunk);
  }
  const int64_t num_chunks = (num_panels + panels_per_chunk - 1) / panels_per_chunk;
  const int row_tiles = (m + internal::kGemmMaxRows - 1) / internal::kGemmMaxRows;
  auto chunk_panels = [&](int64_t chunk) {
    return std::min<int64_t>(panels_per_chunk, num_panels - chunk * panels_per_chunk);
  };
  // Computes chunk `chunk` while prefetching chunk `next` (none if out of range) into L2.
  // A chunk's first row tile reads its panels from memory; the later ones read them from
  // L2 and leave memory idle, so they fetch the next chunk, whose first row tile then
  // finds its panels in L2 too. One row tile (m <= kGemmMaxRows) has nothing to overlap.
  auto run_chunk = [&](int64_t chunk, int64_t next) {
    const int64_t p_begin = chunk * panels_per_chunk;
    const int64_t p_end = p_begin + chunk_panels(chunk);
    const float* prefetch = nullptr;
    int64_t prefetch_lines = 0, lines_per_call = 0;
    if (next < num_chunks && row_tiles > 1) {
      prefetch = packed + static_cast<size_t>(next * panels_per_chunk) * panel_floats;
      prefetch_lines = static_cast<int64_t>(chunk_panels(next) * panel_bytes / 64);
      // At least a line per two k steps, so that with many row tiles the prefetch is done
      // in the first few and the rest run the kernel's plain loop.
      const int64_t calls = (row_tiles - 1) * (p_end - p_begin);
      lines_per_call = std::max<int64_t>((prefetch_lines + calls - 1) / calls, k / 2);
    }
    for (int r = 0; r < m; r += internal::kGemmMaxRows) {
      const int rows = std::min(internal::kGemmMaxRows, m - r);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int col = static_cast<int>(p) * kGemmPanelWidth;
        const int lines = r == 0 ? 0 : static_cast<int>(std::min(lines_per_call, prefetch_lines));
        kKernel(x + static_cast<size_t>(r) * ldx, ldx, rows,
                packed + static_cast<size_t>(p) * panel_floats, k,
                bias != nullptr ? bias + col : nullptr, y + static_cast<size_t>(r) * ldy + col, ldy,
                std::min(kGemmPanelWidth, n - col), prefetch, lines);
        prefetch += static_cast<size_t>(lines) * (64 / sizeof(float));
        prefetch_lines -= lines;
      }
    }
  };
  // Each thread claims its next chunk before computing the current one, so it knows what
  // to prefetch. Chunks are claimed in order from a shared counter, which balances the
  // load as a ParallelFor over chunks would.
  std::atomic<int64_t> next_chunk{0};
  auto run = [&](int64_t, int64_t) {
    int64_t chunk = next_chunk.fetch_add(1, std::memory_order_relaxed);
    while (chunk < num_chunks) {
      const int64_t next = next_chunk.fetch_add(1, std::memory_order_relaxed);
      run_chunk(chunk, next);
      chunk = next;
    }
  };
  if (pool == nullptr || num_chunks == 1) {
    run(0, 1);
  } else {
    pool->ParallelFor(std::min<int64_t>(num_chunks, pool->num_threads()), 1, run);
  }
}

}  // namespace conveyor::kernels
