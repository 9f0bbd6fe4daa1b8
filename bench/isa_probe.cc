// isa_probe: tests, against the instructions of the CPU it runs on, the scalar arithmetic
// the bf16 GEMM is specified by (docs/cpu-weights.md), on many random inputs:
//
//   vdpbf16ps       each float32 lane: the odd bf16 product added first, then the even
//                   one, each sum rounded to nearest even, denormal inputs read as zero
//                   and denormal results flushed to zero (the chain every level computes)
//   vcvtne2ps2bf16  float32 -> bf16, nearest even, denormals to signed zero, NaN quieted
//   tdpbf16ps       (AMX-BF16, where CPUID reports it and Linux grants the tile state)
//                   several candidate orders, each counted for the outputs it reproduces
//                   bit for bit: the question an AMX tile path has to settle first
//
// Inputs come from three distributions: bf16 values of normal size, values around FLT_MIN
// (where flushing decides) and random bit patterns over the whole range, NaN and
// infinity included. Exit status 1 if vdpbf16ps or vcvtne2ps2bf16 differ from the model
// anywhere (the tdpbf16ps section only reports), 0 otherwise, also where the CPU lacks
// an instruction (it says so and skips it).
//
// Usage: isa_probe [--cases N] [--seed S]   (N random cases per distribution, default 4M)
// GCC 12 reports the intrinsics' own _mm512_undefined_*() placeholders as uninitialized
// (GCC bug 105593); the warnings point into the header, not at this code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/cpu_isa.h"

namespace conveyor::bench {
namespace {

// ---- The scalar model --------------------------------------------------------------

float FloatOf(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
uint32_t BitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
float FromBf16(uint16_t b) { return FloatOf(static_cast<uint32_t>(b) << 16); }

// A denormal becomes a zero of its sign (DAZ on inputs, FTZ on results).
float Flush(float f) { return std::fabs(f) < FLT_MIN ? std::copysign(0.0f, f) : f; }

// One multiply-add step of the chain: exact product (two bf16 values multiply exactly in
// float32 unless the product is out of range), one rounding, then the flush.
float Step(float acc, uint16_t a, uint16_t b) {
  return Flush(std::fma(Flush(FromBf16(a)), Flush(FromBf16(b)), Flush(acc)));
}

float DpBf16Model(float acc, uint16_t a_even, uint16_t a_odd, uint16_t b_even, uint16_t b_odd) {
  return Step(Step(acc, a_odd, b_odd), a_even, b_even);
}

uint16_t ToBf16Model(float f) {
  const uint32_t u = BitsOf(f);
  if (std::isnan(f)) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet, sign kept
  if (std::fabs(f) < FLT_MIN) return static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t rounded = u + 0x7fff + ((u >> 16) & 1);
  return static_cast<uint16_t>(rounded >> 16);
}

// Equal bits, or both NaN (the payload of a NaN that two NaN inputs produce is not part
// of the spec the kernels rely on).
bool Same(float x, float y) { return BitsOf(x) == BitsOf(y) || (std::isnan(x) && std::isnan(y)); }

// ---- Inputs --------------------------------------------------------------------------

enum class Range { kNormal, kNearFltMin, kAnyBits };
const char* RangeName(Range r) {
  return r == Range::kNormal ? "normal" : r == Range::kNearFltMin ? "near FLT_MIN" : "any bits";
}

class Inputs {
 public:
  explicit Inputs(uint64_t seed) : rng_(seed) {}

  // A bf16 value. kNearFltMin: magnitudes 2^-71..2^-55, so that products of two land
  // within 2^16 of FLT_MIN (2^-126), and one in 16 a denormal or zero; kNormal: magnitudes
  // 2^-8..2^8.
  uint16_t Bf16(Range r) {
    const uint32_t sign = (rng_() & 1) << 15, mantissa = rng_() & 0x7f;
    switch (r) {
      case Range::kNormal:
        return static_cast<uint16_t>(sign | ((119 + rng_() % 17) << 7) | mantissa);
      case Range::kNearFltMin:
        return static_cast<uint16_t>(sign | ((rng_() % 16 == 0 ? 0 : 56 + rng_() % 17) << 7) |
                                     mantissa);
      case Range::kAnyBits:
      default:
        return static_cast<uint16_t>(rng_());
    }
  }
  // An accumulator of the same range as a product of two Bf16(r).
  float Acc(Range r) {
    const uint32_t sign = (rng_() & 1) << 31, mantissa = rng_() & 0x7fffff;
    switch (r) {
      case Range::kNormal:
        return FloatOf(static_cast<uint32_t>(sign | ((111 + rng_() % 33) << 23) | mantissa));
      case Range::kNearFltMin:
        return FloatOf(static_cast<uint32_t>(sign | ((rng_() % 6) << 23) | mantissa));  // to 2^-122
      case Range::kAnyBits:
      default:
        return FloatOf(static_cast<uint32_t>(rng_()));
    }
  }

 private:
  std::mt19937_64 rng_;
};

// ---- CPU features ----------------------------------------------------------------------

bool CpuidBit(unsigned leaf, unsigned subleaf, int reg, int bit) {
  unsigned r[4] = {0, 0, 0, 0};
  if (__get_cpuid_count(leaf, subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  return ((r[reg] >> bit) & 1u) != 0;
}

// ---- vdpbf16ps ---------------------------------------------------------------------------

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void DpBf16x16(const float* acc,
                                                                      const uint32_t* a,
                                                                      const uint32_t* b,
                                                                      float* out) {
  const __m512 c = _mm512_loadu_ps(acc);
  const __m512bh va = reinterpret_cast<__m512bh>(_mm512_loadu_si512(a));
  const __m512bh vb = reinterpret_cast<__m512bh>(_mm512_loadu_si512(b));
  _mm512_storeu_ps(out, _mm512_dpbf16_ps(c, va, vb));
}

__attribute__((target("avx512f,avx512bw,avx512bf16"))) void CvtNe2x16(const float* lo,
                                                                      const float* hi,
                                                                      uint16_t* out) {
  // Result: the 16 values of `lo` in the low half, `hi` in the high half.
  const __m512bh r = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(hi), _mm512_loadu_ps(lo));
  _mm512_storeu_si512(out, reinterpret_cast<__m512i>(r));
}

// Returns the number of lanes that differ from the model; prints the first few.
long ProbeDpBf16(long cases, uint64_t seed, Range range) {
  Inputs in(seed);
  long mismatches = 0;
  float acc[16], out[16];
  uint32_t a[16], b[16];
  for (long done = 0; done < cases; done += 16) {
    for (int i = 0; i < 16; ++i) {
      acc[i] = in.Acc(range);
      a[i] = in.Bf16(range) | static_cast<uint32_t>(in.Bf16(range)) << 16;
      b[i] = in.Bf16(range) | static_cast<uint32_t>(in.Bf16(range)) << 16;
    }
    DpBf16x16(acc, a, b, out);
    for (int i = 0; i < 16; ++i) {
      const float want = DpBf16Model(acc[i], a[i] & 0xffff, a[i] >> 16, b[i] & 0xffff, b[i] >> 16);
      if (Same(out[i], want)) continue;
      if (++mismatches <= 5) {
        std::printf("  vdpbf16ps differs: acc %08x a %08x b %08x -> %08x, model %08x\n",
                    BitsOf(acc[i]), a[i], b[i], BitsOf(out[i]), BitsOf(want));
      }
    }
  }
  return mismatches;
}

long ProbeCvtNe2(long cases, uint64_t seed, Range range) {
  Inputs in(seed);
  long mismatches = 0;
  float x[32];
  uint16_t out[32];
  for (long done = 0; done < cases; done += 32) {
    for (float& v : x) {
      // A float32 with the range's exponents and a full mantissa.
      v = in.Acc(range);
    }
    CvtNe2x16(x, x + 16, out);
    for (int i = 0; i < 32; ++i) {
      const uint16_t want = ToBf16Model(x[i]);
      const bool both_nan = std::isnan(FromBf16(out[i])) && std::isnan(FromBf16(want));
      if (out[i] == want || both_nan) continue;
      if (++mismatches <= 5) {
        std::printf("  vcvtne2ps2bf16 differs: %08x -> %04x, model %04x\n", BitsOf(x[i]), out[i],
                    want);
      }
    }
  }
  return mismatches;
}

// ---- tdpbf16ps -------------------------------------------------------------------------
//
// One instruction: C (1 × 16 float32) += A (1 × 16 pairs) · B (16 pairs × 16 columns).
// Candidate orders for output n, with e_k = A.pair[k].even · B.row[k].col[n].even and o_k
// likewise for the odd halves, every step one rounding with DAZ/FTZ:
//   chain, even first   c += e_0; c += o_0; c += e_1; …     (Intrinsics Guide), also with
//                       each product rounded and flushed before its sum
//   chain, odd first    c += o_0; c += e_0; c += o_1; …     (vdpbf16ps's order)
//   two lanes, then C   te = Σ e_k, to = Σ o_k from zero; c = (c + te) + to, or (c + to) + te,
//                       or c + (te + to)                    (the SDM's temporary)

struct TileCandidate {
  const char* name;
  float (*compute)(float c, const uint16_t* a, const uint16_t* b_col);  // a, b: 32 values
};

float ChainEvenFirst(float c, const uint16_t* a, const uint16_t* b) {
  for (int k = 0; k < 16; ++k) c = Step(Step(c, a[2 * k], b[2 * k]), a[2 * k + 1], b[2 * k + 1]);
  return c;
}
// The product rounded (and flushed) on its own before the sum: differs from Step only
// where a product falls below FLT_MIN.
float StepProductFlushed(float acc, uint16_t a, uint16_t b) {
  return Flush(Flush(Flush(FromBf16(a)) * Flush(FromBf16(b))) + Flush(acc));
}
float ChainEvenFirstProductsFlushed(float c, const uint16_t* a, const uint16_t* b) {
  for (int k = 0; k < 16; ++k) {
    c = StepProductFlushed(StepProductFlushed(c, a[2 * k], b[2 * k]), a[2 * k + 1], b[2 * k + 1]);
  }
  return c;
}
float ChainOddFirst(float c, const uint16_t* a, const uint16_t* b) {
  for (int k = 0; k < 16; ++k) c = Step(Step(c, a[2 * k + 1], b[2 * k + 1]), a[2 * k], b[2 * k]);
  return c;
}
void Lanes(const uint16_t* a, const uint16_t* b, float* even, float* odd) {
  *even = 0.0f, *odd = 0.0f;
  for (int k = 0; k < 16; ++k) {
    *even = Step(*even, a[2 * k], b[2 * k]);
    *odd = Step(*odd, a[2 * k + 1], b[2 * k + 1]);
  }
}
float LanesEvenThenOdd(float c, const uint16_t* a, const uint16_t* b) {
  float e, o;
  Lanes(a, b, &e, &o);
  return Flush(Flush(Flush(c) + e) + o);
}
float LanesOddThenEven(float c, const uint16_t* a, const uint16_t* b) {
  float e, o;
  Lanes(a, b, &e, &o);
  return Flush(Flush(Flush(c) + o) + e);
}
float LanesSummedFirst(float c, const uint16_t* a, const uint16_t* b) {
  float e, o;
  Lanes(a, b, &e, &o);
  return Flush(Flush(c) + Flush(e + o));
}

constexpr TileCandidate kTileCandidates[] = {
    {"chain, even first (Intrinsics Guide)", ChainEvenFirst},
    {"chain, even first, products flushed", ChainEvenFirstProductsFlushed},
    {"chain, odd first (vdpbf16ps order)", ChainOddFirst},
    {"two lanes, (C + even) + odd", LanesEvenThenOdd},
    {"two lanes, (C + odd) + even", LanesOddThenEven},
    {"two lanes, C + (even + odd)", LanesSummedFirst},
};

// Linux hands out the 8 KiB of tile data per process, on request (arch_prctl).
bool RequestTileState(std::string* why_not) {
  constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
  if (!CpuidBit(7, 0, 3, 24) || !CpuidBit(7, 0, 3, 22)) {
    *why_not = "CPUID reports no AMX-TILE/AMX-BF16";
    return false;
  }
  if (syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) != 0) {
    *why_not =
        std::string("arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) failed: ") + std::strerror(errno);
    return false;
  }
  return true;
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// tmm0 = C (1 row × 64 bytes), tmm1 = A (1 × 64), tmm2 = B (16 × 64).
__attribute__((target("amx-tile,amx-bf16"))) void TileDpBf16(float* c, const uint16_t* a,
                                                             const uint32_t* b) {
  TileConfig config;
  config.colsb[0] = 64, config.rows[0] = 1;
  config.colsb[1] = 64, config.rows[1] = 1;
  config.colsb[2] = 64, config.rows[2] = 16;
  _tile_loadconfig(&config);
  _tile_loadd(0, c, 64);
  _tile_loadd(1, a, 64);
  _tile_loadd(2, b, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, c, 64);
  _tile_release();
}

void ProbeTileDpBf16(long cases, uint64_t seed, Range range) {
  Inputs in(seed);
  std::array<long, std::size(kTileCandidates)> matches{};
  long none = 0, outputs = 0;
  uint16_t a[32], b_col[32];
  uint32_t b[16 * 16];  // row k, column n: the pair (even, odd) of k for column n
  float c[16], result[16];
  for (long done = 0; done < cases; done += 16) {
    for (int i = 0; i < 32; ++i) a[i] = in.Bf16(range);
    for (uint32_t& pair : b) pair = in.Bf16(range) | static_cast<uint32_t>(in.Bf16(range)) << 16;
    for (float& v : c) v = in.Acc(range);
    std::memcpy(result, c, sizeof c);
    TileDpBf16(result, a, b);
    for (int n = 0; n < 16; ++n) {
      for (int k = 0; k < 16; ++k) {
        b_col[2 * k] = static_cast<uint16_t>(b[k * 16 + n] & 0xffff);
        b_col[2 * k + 1] = static_cast<uint16_t>(b[k * 16 + n] >> 16);
      }
      bool any = false;
      for (size_t i = 0; i < std::size(kTileCandidates); ++i) {
        if (Same(result[n], kTileCandidates[i].compute(c[n], a, b_col))) ++matches[i], any = true;
      }
      if (!any && ++none <= 3) {
        std::printf("  no candidate: column %d, C %08x -> %08x (the first: %08x)\n", n,
                    BitsOf(c[n]), BitsOf(result[n]),
                    BitsOf(kTileCandidates[0].compute(c[n], a, b_col)));
      }
      ++outputs;
    }
  }
  for (size_t i = 0; i < std::size(kTileCandidates); ++i) {
    std::printf("  %-40s %ld of %ld outputs\n", kTileCandidates[i].name, matches[i], outputs);
  }
  std::printf("  %-40s %ld of %ld outputs\n", "none of them", none, outputs);
}

int Main(int argc, char** argv) {
  long cases = 4L << 20;
  uint64_t seed = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--cases") == 0) {
      cases = std::atol(argv[i + 1]);
    } else if (std::strcmp(argv[i], "--seed") == 0) {
      seed = std::strtoull(argv[i + 1], nullptr, 10);
    } else {
      std::fprintf(stderr, "usage: isa_probe [--cases N] [--seed S]\n");
      return 2;
    }
  }
  const Range ranges[] = {Range::kNormal, Range::kNearFltMin, Range::kAnyBits};
  long failures = 0;
  if (kernels::DetectedCpuIsa() >= kernels::CpuIsa::kAvx512Bf16) {
    for (Range r : ranges) {
      const long dp = ProbeDpBf16(cases, seed, r), cvt = ProbeCvtNe2(cases, seed + 1, r);
      std::printf("vdpbf16ps, %-12s %ld lanes, %ld differ from the model\n", RangeName(r), cases,
                  dp);
      std::printf("vcvtne2ps2bf16, %-12s %ld values, %ld differ from the model\n", RangeName(r),
                  cases, cvt);
      failures += dp + cvt;
    }
  } else {
    std::printf("vdpbf16ps, vcvtne2ps2bf16: skipped (no AVX512-BF16)\n");
  }
  std::string why_not;
  if (RequestTileState(&why_not)) {
    for (Range r : ranges) {
      std::printf("tdpbf16ps, %s: outputs each candidate order reproduces\n", RangeName(r));
      ProbeTileDpBf16(cases, seed + 2, r);
    }
  } else {
    std::printf("tdpbf16ps: skipped (%s)\n", why_not.c_str());
  }
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) { return conveyor::bench::Main(argc, argv); }
