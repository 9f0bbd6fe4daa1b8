#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <vector>

#include "absl/strings/str_cat.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace internal {

uint16_t ToBf16(float f) {
  uint32_t bits = 0;
  std::memcpy(&bits, &f, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40);
  if ((bits & 0x7f800000u) == 0) return static_cast<uint16_t>((bits >> 16) & 0x8000u);
  bits += 0x7fffu + ((bits >> 16) & 1u);  // Round to nearest, ties to even.
  return static_cast<uint16_t>(bits >> 16);
}

void ToBf16Strided(const float* in, int n, uint16_t* out, ptrdiff_t stride) {
  for (int i = 0; i < n; ++i) out[i * stride] = ToBf16(in[i]);
}

float FromBf16(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f = 0;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

void RoundBf16Activations(const float* x, int ldx, int m, int k, Bf16Activations layout,
                          void* out) {
  const int padded = Bf16PaddedK(k);
  for (int r = 0; r < m; ++r) {
    const float* row = x + static_cast<size_t>(r) * ldx;
    if (layout == Bf16Activations::kPairs) {
      char* dst = static_cast<char*>(out) + static_cast<size_t>(r) * padded * sizeof(uint16_t);
      for (int i = 0; i < padded; i += 2) {
        const uint32_t pair = ToBf16(row[i]) | (i + 1 < k ? uint32_t{ToBf16(row[i + 1])} << 16 : 0);
        std::memcpy(dst + i * sizeof(uint16_t), &pair, sizeof(pair));
      }
    } else {
      float* dst = static_cast<float*>(out) + static_cast<size_t>(r) * padded;
      for (int i = 0; i < padded; ++i) {
        const int from = i ^ 1;  // The pair's odd element first.
        dst[i] = from < k ? FromBf16(ToBf16(row[from])) : 0.0f;
      }
    }
  }
}

namespace {

// The portable kernels: one FMA chain per output over k, as the AVX-512 and AVX2 ones,
// so all give the same bits. They ignore the prefetch hint: a CPU without AVX2 has other
// bottlenecks.
template <typename Widen>
void PortablePanel(const float* x, int ldx, int m, int k, const float* scales, const float* bias,
                   float* y, int ldy, int cols, Widen widen) {
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < k; ++i)
        acc = std::fma(x[r * ldx + i], widen(i * kGemmPanelWidth + j), acc);
      if (scales != nullptr) acc = acc * scales[j];
      y[static_cast<long>(r) * ldy + j] = bias != nullptr ? acc + bias[j] : acc;
    }
  }
}

}  // namespace

void GemmPanelPortable(const float* x, int ldx, int m, const void* panel, const float*, int k,
                       const float* bias, float* y, int ldy, int cols, const void*, int) {
  const auto* w = static_cast<const float*>(panel);
  PortablePanel(x, ldx, m, k, nullptr, bias, y, ldy, cols, [w](int i) { return w[i]; });
}

// vdpbf16ps's arithmetic in scalar operations: x is in chain order, step i takes the
// weight of k = i ^ 1, and every sum flushes a denormal to zero.
void GemmPanelBf16Portable(const float* x, int ldx, int m, const void* panel, const float*, int k,
                           const float* bias, float* y, int ldy, int cols, const void*, int) {
  const auto* w = static_cast<const uint16_t*>(panel);
  const auto flush = [](float v) { return std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v; };
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int i = 0; i < k; ++i) {
        const float weight = FromBf16(w[(i >> 1) * 2 * kGemmPanelWidth + 2 * j + ((i & 1) ^ 1)]);
        acc = flush(std::fma(x[r * ldx + i], weight, acc));
      }
      // MXCSR's denormals-are-zero applies to the bias as an input too.
      y[static_cast<long>(r) * ldy + j] = bias != nullptr ? flush(acc + flush(bias[j])) : acc;
    }
  }
}

void GemmPanelInt8Portable(const float* x, int ldx, int m, const void* panel, const float* scales,
                           int k, const float* bias, float* y, int ldy, int cols, const void*,
                           int) {
  const auto* w = static_cast<const int8_t*>(panel);
  PortablePanel(x, ldx, m, k, scales, bias, y, ldy, cols,
                [w](int i) { return static_cast<float>(w[i]); });
}

}  // namespace internal

namespace {

using internal::GemmPanelKernel;

// 64-byte aligned memory, as packed panels are (the vector kernels load them aligned).
std::unique_ptr<void, decltype(&std::free)> AlignedBuffer(size_t bytes) {
  return {std::aligned_alloc(64, (bytes + 63) / 64 * 64), std::free};
}

// This thread's 64-byte aligned scratch of at least `bytes`, kept between calls.
char* ThreadScratch(size_t bytes) {
  thread_local std::unique_ptr<void, decltype(&std::free)> buffer{nullptr, std::free};
  thread_local size_t size = 0;
  if (size < bytes) {
    buffer = AlignedBuffer(bytes);
    if (!buffer) throw std::bad_alloc();
    size = bytes;
  }
  return static_cast<char*>(buffer.get());
}

int NumPanels(int n) { return (n + kGemmPanelWidth - 1) / kGemmPanelWidth; }

size_t ElementBytes(CpuWeightDtype type) {
  switch (type) {
    case CpuWeightDtype::kBf16:
      return 2;
    case CpuWeightDtype::kInt8:
      return 1;
    case CpuWeightDtype::kF32:
    default:
      return 4;
  }
}

// The k steps a panel of `type` holds: bf16 takes k in pairs.
int PanelSteps(CpuWeightDtype type, int k) {
  return type == CpuWeightDtype::kBf16 ? internal::Bf16PaddedK(k) : k;
}

// Writes each panel's elements k-major ([k][32]), columns past n as zero.
template <typename T, typename Convert>
void PackPanels(const float* w, int n, int k, T* packed, Convert convert) {
  for (int p = 0; p < NumPanels(n); ++p) {
    T* panel = packed + static_cast<size_t>(p) * k * kGemmPanelWidth;
    for (int i = 0; i < k; ++i) {
      for (int j = 0; j < kGemmPanelWidth; ++j) {
        const int col = p * kGemmPanelWidth + j;
        panel[i * kGemmPanelWidth + j] =
            col < n ? convert(col, w[static_cast<size_t>(col) * k + i]) : T{0};
      }
    }
  }
}

}  // namespace

const char* GemmKernelName() { return CpuIsaName(internal::ActiveCpuKernels().isa); }

std::string Bf16ArithmeticChoice() {
  return absl::StrCat(Bf16ArithmeticName(internal::ActiveCpuKernels().bf16_arithmetic), " (",
                      internal::ActiveBf16ArithmeticReason(), ")");
}

size_t PackedGemmPanelBytes(CpuWeightDtype type, int n, int k) {
  return static_cast<size_t>(NumPanels(n)) * PanelSteps(type, k) * kGemmPanelWidth *
         ElementBytes(type);
}

size_t PackedGemmScaleBytes(CpuWeightDtype type, int n) {
  return type == CpuWeightDtype::kInt8 ? NumPanels(n) * kGemmPanelWidth * sizeof(float) : 0;
}

size_t PackedGemmWeightBytes(int n, int k) {
  return PackedGemmPanelBytes(CpuWeightDtype::kF32, n, k);
}

void PackGemmWeightAs(CpuWeightDtype type, const float* w, int n, int k, PackedGemmWeight* out) {
  out->type = type;
  out->n = n;
  out->k = k;
  switch (type) {
    case CpuWeightDtype::kF32:
      PackPanels(w, n, k, static_cast<float*>(out->panels), [](int, float v) { return v; });
      return;
    case CpuWeightDtype::kBf16: {
      // Pair j of a panel's column c: bf16(w[c][2j]), then bf16(w[c][2j + 1]) (zero past k).
      auto* packed = static_cast<uint16_t*>(out->panels);
      const int steps = internal::Bf16PaddedK(k);
      for (int p = 0; p < NumPanels(n); ++p) {
        uint16_t* panel = packed + static_cast<size_t>(p) * steps * kGemmPanelWidth;
        for (int i = 0; i < steps; ++i) {
          for (int j = 0; j < kGemmPanelWidth; ++j) {
            const int col = p * kGemmPanelWidth + j;
            panel[(i >> 1) * 2 * kGemmPanelWidth + 2 * j + (i & 1)] =
                col < n && i < k ? internal::ToBf16(w[static_cast<size_t>(col) * k + i]) : 0;
          }
        }
      }
      return;
    }
    case CpuWeightDtype::kInt8: {
      // One scale per output column: its largest magnitude maps to 127.
      for (int col = 0; col < NumPanels(n) * kGemmPanelWidth; ++col) {
        float most = 0.0f;
        if (col < n) {
          for (int i = 0; i < k; ++i)
            most = std::max(most, std::fabs(w[static_cast<size_t>(col) * k + i]));
        }
        out->scales[col] = most > 0.0f ? most / 127.0f : 1.0f;
      }
      const float* scales = out->scales;
      PackPanels(w, n, k, static_cast<int8_t*>(out->panels), [scales](int col, float v) {
        return static_cast<int8_t>(std::clamp(std::nearbyint(v / scales[col]), -127.0f, 127.0f));
      });
      return;
    }
  }
}

void PackGemmWeight(const float* w, int n, int k, float* packed) {
  PackedGemmWeight out;
  out.panels = packed;
  PackGemmWeightAs(CpuWeightDtype::kF32, w, n, k, &out);
}

void GemmPackedAs(const float* x, int ldx, int m, const PackedGemmWeight& w, const float* bias,
                  float* y, int ldy, ThreadPool* pool) {
  const int n = w.n;
  const internal::GemmKernels& kernels = internal::ActiveCpuKernels().gemm;
  // bf16 computes on bf16 activations, rounded here once per call (per thread's buffer:
  // the pool's threads only read it).
  int k = w.k;
  if (w.type == CpuWeightDtype::kBf16) {
    thread_local std::vector<float> rounded;
    k = internal::Bf16PaddedK(w.k);
    rounded.resize(static_cast<size_t>(m) * k);
    if (kernels.round_bf16 != nullptr) {
      kernels.round_bf16(x, ldx, m, w.k, rounded.data());
    } else {
      internal::RoundBf16Activations(x, ldx, m, w.k, kernels.bf16_activations, rounded.data());
    }
    x = rounded.data();
    ldx = kernels.bf16_activations == internal::Bf16Activations::kPairs ? k / 2 : k;
  }
  const int row_tiles = (m + internal::kGemmMaxRows - 1) / internal::kGemmMaxRows;
  // bf16 on the FMAs widens each weight in registers, again for every row tile. Where the
  // level has widen_bf16 and there are several row tiles, each chunk of panels is widened
  // once instead, into float32 in the chain's order (exact), and the float32 kernel runs
  // the row tiles on that under FTZ/DAZ: the same FMAs on the same values in the same
  // order, so the same bits as with one row tile.
  const bool widen =
      w.type == CpuWeightDtype::kBf16 && kernels.widen_bf16 != nullptr && row_tiles > 1;
  const GemmPanelKernel kernel = widen                             ? kernels.f32
                                 : w.type == CpuWeightDtype::kBf16 ? kernels.bf16
                                 : w.type == CpuWeightDtype::kInt8 ? kernels.int8
                                                                   : kernels.f32;
  // One row takes the panels two at a time where the ISA has a pair kernel.
  const GemmPanelKernel pair = m != 1                            ? nullptr
                               : w.type == CpuWeightDtype::kBf16 ? kernels.bf16_pair
                               : w.type == CpuWeightDtype::kInt8 ? kernels.int8_pair
                                                                 : kernels.f32_pair;
  const char* panels = static_cast<const char*>(w.panels);
  const int num_panels = NumPanels(n);
  const size_t panel_bytes = static_cast<size_t>(k) * kGemmPanelWidth * ElementBytes(w.type);
  const size_t widened_bytes = static_cast<size_t>(k) * kGemmPanelWidth * sizeof(float);
  // Panels a thread takes at once: enough to stay in L2 (widened, where they are) while
  // every row tile of X passes over them.
  int64_t panels_per_chunk = std::max<int64_t>(
      1, static_cast<int64_t>((512u << 10) / (widen ? widened_bytes : panel_bytes)));
  // ...but small enough that every thread gets several chunks: to balance the load, and
  // because a thread's first chunk cannot be prefetched (see run_chunk).
  if (pool != nullptr) {
    panels_per_chunk =
        std::clamp<int64_t>(num_panels / (8 * pool->num_threads()), 1, panels_per_chunk);
  }
  // A pair kernel needs its panels two by two.
  if (pair != nullptr) panels_per_chunk += panels_per_chunk % 2;
  const int64_t num_chunks = (num_panels + panels_per_chunk - 1) / panels_per_chunk;
  auto chunk_panels = [&](int64_t chunk) {
    return std::min<int64_t>(panels_per_chunk, num_panels - chunk * panels_per_chunk);
  };
  // Computes chunk `chunk` while prefetching chunk `next` (none if out of range) into L2.
  // A chunk's first row tile reads its panels from memory; the later ones read them from
  // L2 and leave memory idle, so they fetch the next chunk, whose first row tile then
  // finds its panels in L2 too. With one row tile (m <= kGemmMaxRows) each call
  // prefetches the next panel instead.
  auto run_chunk = [&](int64_t chunk, int64_t next) {
    const int64_t p_begin = chunk * panels_per_chunk;
    const int64_t p_end = p_begin + chunk_panels(chunk);
    // Where the kernel reads panel p: panels + (p - first) * stride.
    const char* source = panels;
    size_t stride = panel_bytes;
    int64_t first = 0;
    if (widen) {
      char* widened = ThreadScratch(static_cast<size_t>(p_end - p_begin) * widened_bytes);
      for (int64_t p = p_begin; p < p_end; ++p) {
        kernels.widen_bf16(panels + static_cast<size_t>(p) * panel_bytes, k,
                           reinterpret_cast<float*>(widened + (p - p_begin) * widened_bytes));
      }
      source = widened;
      stride = widened_bytes;
      first = p_begin;
    }
    // The row tiles that read the panels from L2 (with widening, all of them).
    const int l2_tiles = widen ? row_tiles : row_tiles - 1;
    const char* prefetch = nullptr;
    int64_t prefetch_lines = 0, lines_per_call = 0;
    if (next < num_chunks && row_tiles > 1) {
      prefetch = panels + static_cast<size_t>(next * panels_per_chunk) * panel_bytes;
      prefetch_lines = static_cast<int64_t>(chunk_panels(next) * panel_bytes / 64);
      // At least a line per two k steps, so that with many row tiles the prefetch is done
      // in the first few and the rest run the kernel's plain loop.
      const int64_t calls = l2_tiles * (p_end - p_begin);
      lines_per_call = std::max<int64_t>((prefetch_lines + calls - 1) / calls, k / 2);
    }
    for (int r = 0; r < m; r += internal::kGemmMaxRows) {
      const int rows = std::min(internal::kGemmMaxRows, m - r);
      for (int64_t p = p_begin; p < p_end; ++p) {
        const int col = static_cast<int>(p) * kGemmPanelWidth;
        if (pair != nullptr && p + 1 < p_end) {  // m == 1: one row tile.
          // int8 prefetches the two panels this thread computes next, as below. f32 and
          // bf16 do not: the hardware's own prefetching serves them better. Decode at
          // batch 1, before -> with the prefetch, in A/B runs: int8 2.61-3.51 -> 2.14-2.56
          // ms per step, bf16 4.54-5.28 -> 4.73-5.47, f32 7.68-8.69 -> 8.55-10.02.
          const int64_t next_pair = w.type != CpuWeightDtype::kInt8 ? -1
                                    : p + 2 < p_end                 ? p + 2
                                    : next < num_chunks             ? next * panels_per_chunk
                                                                    : -1;
          pair(x, ldx, 1, panels + static_cast<size_t>(p) * panel_bytes,
               w.scales != nullptr ? w.scales + col : nullptr, k,
               bias != nullptr ? bias + col : nullptr, y + col, ldy,
               std::min(2 * kGemmPanelWidth, n - col),
               next_pair < 0 ? nullptr : panels + static_cast<size_t>(next_pair) * panel_bytes,
               next_pair < 0 ? 0 : static_cast<int>(2 * panel_bytes / 64));
          ++p;
          continue;
        }
        // What this call prefetches while it computes. With several row tiles: its share
        // of the next chunk (none on the first tile, which reads the panels from memory,
        // unless they were widened: then every tile reads them from L2).
        // With one, nothing reads these panels again from L2, so the whole panel this
        // thread computes next: the weight stream then overlaps the arithmetic instead of
        // alternating with it (one thread, the `small` model's GEMMs from memory, bf16:
        // m=8 6.2-6.4 -> 4.5-4.6 ms, m=12 8.3 -> 5.0-6.4 ms; m=1 takes the pair kernel).
        const char* call_prefetch = prefetch;
        const bool from_memory = r == 0 && !widen;
        int lines = from_memory ? 0 : static_cast<int>(std::min(lines_per_call, prefetch_lines));
        if (row_tiles == 1) {
          const int64_t next_panel = p + 1 < p_end       ? p + 1
                                     : next < num_chunks ? next * panels_per_chunk
                                                         : -1;
          call_prefetch =
              next_panel < 0 ? nullptr : panels + static_cast<size_t>(next_panel) * panel_bytes;
          lines = next_panel < 0 ? 0 : static_cast<int>(panel_bytes / 64);
        }
        kernel(x + static_cast<size_t>(r) * ldx, ldx, rows,
               source + static_cast<size_t>(p - first) * stride,
               w.scales != nullptr ? w.scales + col : nullptr, k,
               bias != nullptr ? bias + col : nullptr, y + static_cast<size_t>(r) * ldy + col, ldy,
               std::min(kGemmPanelWidth, n - col), call_prefetch, lines);
        if (row_tiles > 1) {
          prefetch += static_cast<size_t>(lines) * 64;
          prefetch_lines -= lines;
        }
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
      if (widen) {
        internal::WithDenormalsFlushed([&] { run_chunk(chunk, next); });
      } else {
        run_chunk(chunk, next);
      }
      chunk = next;
    }
  };
  if (pool == nullptr || num_chunks == 1) {
    run(0, 1);
  } else {
    pool->ParallelFor(std::min<int64_t>(num_chunks, pool->num_threads()), 1, run);
  }
}

void GemmPacked(const float* x, int ldx, int m, const float* packed, int n, int k,
                const float* bias, float* y, int ldy, ThreadPool* pool) {
  PackedGemmWeight w;
  w.n = n;
  w.k = k;
  w.panels = const_cast<float*>(packed);
  GemmPackedAs(x, ldx, m, w, bias, y, ldy, pool);
}

}  // namespace conveyor::kernels
