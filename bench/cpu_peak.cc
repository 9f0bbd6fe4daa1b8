// cpu_peak: the arithmetic ceiling of each x86 instruction the CPU GEMM could use, on one
// core: 12 independent accumulators in a loop of one instruction (vfmadd231ps,
// vdpbf16ps, vpdpbusd on 512-bit registers), so neither latency nor memory limits it.
// Each is compiled for its own instructions (target attributes, not -march) and run only
// where CPUID reports them. Prints G instructions/s and G multiply-adds/s; the ratios say
// what a kernel on that instruction could gain (docs/cpu-weights.md).
//
// Usage: cpu_peak [--seconds S]   (default 0.5 per instruction)
// GCC 12 reports the intrinsics' own _mm512_undefined_*() placeholders as uninitialized
// (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {

constexpr int kChains = 12;

template <typename Body>
double InstructionsPerSecond(double seconds, Body body) {
  long iterations = 1 << 20;
  for (;;) {
    const auto start = std::chrono::steady_clock::now();
    body(iterations);
    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (elapsed >= seconds) return static_cast<double>(iterations) * kChains / elapsed;
    iterations *= 2;
  }
}

volatile float g_sink_f;
volatile int g_sink_i;

__attribute__((target("avx512f,fma"))) void Fma(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(1e-7f);
  for (long n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_fmadd_ps(acc[i], a, b);
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  g_sink_f = sum;
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void DpBf16(long iterations) {
  __m512 acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_ps(1e-3f * i);
  const __m512bh a = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x3f803f80));
  const __m512bh b = reinterpret_cast<__m512bh>(_mm512_set1_epi32(0x33d633d6));
  for (long n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbf16_ps(acc[i], a, b);
  }
  float sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_ps(acc[i]);
  g_sink_f = sum;
}

__attribute__((target("avx512f,avx512vnni"))) void DpBusd(long iterations) {
  __m512i acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = _mm512_set1_epi32(i);
  const __m512i a = _mm512_set1_epi32(0x01020304), b = _mm512_set1_epi32(0x01010101);
  for (long n = 0; n < iterations; ++n) {
#pragma GCC unroll 12
    for (int i = 0; i < kChains; ++i) acc[i] = _mm512_dpbusd_epi32(acc[i], a, b);
  }
  int sum = 0;
  for (int i = 0; i < kChains; ++i) sum += _mm512_reduce_add_epi32(acc[i]);
  g_sink_i = sum;
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 0.5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0 && i + 1 < argc) {
      seconds = std::atof(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: cpu_peak [--seconds S]\n");
      return 2;
    }
  }
  __builtin_cpu_init();
  struct Row {
    const char* name;
    bool present;
    void (*body)(long);
    int macs;  // Multiply-adds per instruction.
  };
  const Row rows[] = {
      {"vfmadd231ps zmm (f32)", __builtin_cpu_supports("avx512f") != 0, Fma, 16},
      {"vdpbf16ps zmm (bf16 pairs)",
       __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512bf16"), DpBf16, 32},
      {"vpdpbusd zmm (u8 x s8 quads)", __builtin_cpu_supports("avx512vnni") != 0, DpBusd, 64},
  };
  std::printf("one core, %d accumulators, %.1f s each\n", kChains, seconds);
  double fma_macs = 0;
  for (const Row& row : rows) {
    if (!row.present) {
      std::printf("  %-30s not on this CPU\n", row.name);
      continue;
    }
    const double ips = InstructionsPerSecond(seconds, row.body);
    const double macs = ips * row.macs;
    if (row.body == Fma) fma_macs = macs;
    std::printf("  %-30s %6.2f G instr/s %7.1f G multiply-adds/s", row.name, ips / 1e9, macs / 1e9);
    if (fma_macs > 0) std::printf("  %.2fx f32 FMA", macs / fma_macs);
    std::printf("\n");
  }
  return 0;
}
