#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/cpu/bf16_arithmetic.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace {

struct Packed {
  Packed(const std::vector<float>& w, int n, int k)
      : data(static_cast<float*>(std::aligned_alloc(64, PackedGemmWeightBytes(n, k)))) {
    PackGemmWeight(w.data(), n, k, data);
  }
  ~Packed() { std::free(data); }
  float* data;
};

// Whether `n` floats are equal bit for bit (what batch invariance promises; -0.0 vs 0.0 or
// two NaNs would be differences).
bool SameBits(const float* a, const float* b, size_t n) {
  return std::memcmp(static_cast<const void*>(a), static_cast<const void*>(b), n * sizeof(float)) ==
         0;
}

std::vector<float> Random(size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

TEST(GemmTest, MatchesDoublePrecisionReference) {
  const int m = 19, n = 75, k = 130;  // Tails in every dimension.
  auto x = Random(m * k, 1), w = Random(n * k, 2), bias = Random(n, 3);
  Packed packed(w, n, k);
  std::vector<float> y(m * n, NAN);
  ThreadPool pool(2);
  GemmPacked(x.data(), k, m, packed.data, n, k, bias.data(), y.data(), n, &pool);
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double ref = bias[c];
      for (int i = 0; i < k; ++i) ref += static_cast<double>(x[r * k + i]) * w[c * k + i];
      EXPECT_NEAR(y[r * n + c], ref, 1e-4) << r << "," << c;
    }
  }
}

TEST(GemmTest, HonoursStridesAndLeavesOtherColumnsAlone) {
  const int m = 3, n = 40, k = 16, ldx = 20, ldy = 50;
  auto x = Random(m * ldx, 4), w = Random(n * k, 5);
  Packed packed(w, n, k);
  std::vector<float> y(m * ldy, 7.0f);
  GemmPacked(x.data(), ldx, m, packed.data, n, k, nullptr, y.data(), ldy, nullptr);
  for (int r = 0; r < m; ++r) {
    for (int c = n; c < ldy; ++c) EXPECT_EQ(y[r * ldy + c], 7.0f);
    double ref = 0;
    for (int i = 0; i < k; ++i) ref += static_cast<double>(x[r * ldx + i]) * w[i];
    EXPECT_NEAR(y[r * ldy], ref, 1e-5);
  }
}

// The property the worker's batch invariance rests on: a row's output bits do not depend
// on how many rows are in the call, where the row sits, or how many threads run.
TEST(GemmTest, RowResultIndependentOfBatchPositionAndThreads) {
  const int n = 2048 + 5, k = 768;
  auto w = Random(static_cast<size_t>(n) * k, 6);
  auto row = Random(k, 7);
  Packed packed(w, n, k);
  std::vector<float> alone(n);
  GemmPacked(row.data(), k, 1, packed.data, n, k, nullptr, alone.data(), n, nullptr);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  int checked = 0;
  for (int m : {2, 7, 12, 13, 24, 37, 64}) {
    for (int pos : {0, m / 2, m - 1}) {
      auto x = Random(static_cast<size_t>(m) * k, 100 + m + pos);
      std::memcpy(x.data() + static_cast<size_t>(pos) * k, row.data(), k * sizeof(float));
      for (ThreadPool* pool : pools) {
        std::vector<float> y(static_cast<size_t>(m) * n);
        GemmPacked(x.data(), k, m, packed.data, n, k, nullptr, y.data(), n, pool);
        ASSERT_TRUE(SameBits(y.data() + static_cast<size_t>(pos) * n, alone.data(), n))
            << "m=" << m << " pos=" << pos;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 7 * 3 * 3);
}

// A weight packed as `type`, owning its buffers.
struct TypedPacked {
  TypedPacked(CpuWeightDtype type, const std::vector<float>& w, int n, int k) {
    weight.panels = std::aligned_alloc(64, PackedGemmPanelBytes(type, n, k));
    const size_t scale_bytes = PackedGemmScaleBytes(type, n);
    if (scale_bytes > 0) weight.scales = static_cast<float*>(std::aligned_alloc(64, scale_bytes));
    PackGemmWeightAs(type, w.data(), n, k, &weight);
  }
  ~TypedPacked() {
    std::free(weight.panels);
    std::free(weight.scales);
  }
  PackedGemmWeight weight;
};

// W as the packed type holds it: bf16-rounded, or int8 times its column's scale.
std::vector<double> Dequantized(CpuWeightDtype type, const std::vector<float>& w, int n, int k) {
  std::vector<double> out(w.size());
  for (int c = 0; c < n; ++c) {
    float most = 0;
    for (int i = 0; i < k; ++i) most = std::max(most, std::fabs(w[c * k + i]));
    const float scale = most / 127.0f;
    for (int i = 0; i < k; ++i) {
      const float v = w[c * k + i];
      out[c * k + i] = type == CpuWeightDtype::kBf16   ? internal::FromBf16(internal::ToBf16(v))
                       : type == CpuWeightDtype::kInt8 ? std::nearbyint(v / scale) * double{scale}
                                                       : v;
    }
  }
  return out;
}

class TypedGemmTest : public ::testing::TestWithParam<CpuWeightDtype> {};

// Against a float64 product with the weight (and for bf16 the activations) as stored: the
// only error left is the float32 chain's.
TEST_P(TypedGemmTest, MatchesDoublePrecisionOfTheStoredWeight) {
  const CpuWeightDtype type = GetParam();
  const int m = 19, n = 75, k = 130;
  auto x = Random(m * k, 11), w = Random(n * k, 12), bias = Random(n, 13);
  TypedPacked packed(type, w, n, k);
  const std::vector<double> stored = Dequantized(type, w, n, k);
  std::vector<float> y(m * n, NAN);
  ThreadPool pool(2);
  GemmPackedAs(x.data(), k, m, packed.weight, bias.data(), y.data(), n, &pool);
  double worst = 0, worst_vs_f32 = 0;
  for (int r = 0; r < m; ++r) {
    for (int c = 0; c < n; ++c) {
      double ref = bias[c], exact = bias[c];
      for (int i = 0; i < k; ++i) {
        // bf16 rounds the activations too (gemm_kernels.h).
        const float xi = type == CpuWeightDtype::kBf16
                             ? internal::FromBf16(internal::ToBf16(x[r * k + i]))
                             : x[r * k + i];
        ref += static_cast<double>(xi) * stored[c * k + i];
        exact += static_cast<double>(x[r * k + i]) * w[c * k + i];
      }
      worst = std::max(worst, std::fabs(y[r * n + c] - ref));
      worst_vs_f32 = std::max(worst_vs_f32, std::fabs(y[r * n + c] - exact));
    }
  }
  EXPECT_LT(worst, 1e-4) << CpuWeightDtypeName(type);
  // What rounding costs, on values of size ~sqrt(k)/3: bf16 keeps 8 bits of mantissa (of
  // weights and activations), int8 7 bits of the column's largest magnitude.
  const double rounding_bound = type == CpuWeightDtype::kF32    ? 1e-4
                                : type == CpuWeightDtype::kBf16 ? 0.05
                                                                : 0.1;
  EXPECT_LT(worst_vs_f32, rounding_bound) << CpuWeightDtypeName(type);
  std::printf("%s: largest error %.3g against the stored weight, %.3g against float32 W\n",
              CpuWeightDtypeName(type), worst, worst_vs_f32);
}

TEST_P(TypedGemmTest, RowResultIndependentOfBatchPositionAndThreads) {
  const CpuWeightDtype type = GetParam();
  const int n = 1024 + 7, k = 384;
  auto w = Random(static_cast<size_t>(n) * k, 14);
  auto row = Random(k, 15);
  TypedPacked packed(type, w, n, k);
  std::vector<float> alone(n);
  GemmPackedAs(row.data(), k, 1, packed.weight, nullptr, alone.data(), n, nullptr);
  ThreadPool pool2(2), pool3(3);
  ThreadPool* pools[] = {nullptr, &pool2, &pool3};
  for (int m : {2, 12, 13, 37, 64}) {
    for (int pos : {0, m - 1}) {
      auto x = Random(static_cast<size_t>(m) * k, 200 + m + pos);
      std::memcpy(x.data() + static_cast<size_t>(pos) * k, row.data(), k * sizeof(float));
      for (ThreadPool* pool : pools) {
        std::vector<float> y(static_cast<size_t>(m) * n);
        GemmPackedAs(x.data(), k, m, packed.weight, nullptr, y.data(), n, pool);
        ASSERT_TRUE(SameBits(y.data() + static_cast<size_t>(pos) * n, alone.data(), n))
            << CpuWeightDtypeName(type) << " m=" << m << " pos=" << pos;
      }
    }
  }
}

// A panel kernel's call on raw activations: for bf16 they are first rounded as
// GemmPackedAs rounds them, in the layout the kernel takes.
struct KernelCall {
  internal::GemmPanelKernel kernel;
  bool bf16_pairs = false;  // The AVX512-BF16 kernel's layout (else chain order).

  void operator()(CpuWeightDtype type, const std::vector<float>& x, int m, int k,
                  const PackedGemmWeight& w, size_t panel_offset, int scale_offset,
                  const float* bias, float* y, int ldy, int cols, bool prefetch) const {
    const void* panel = static_cast<const char*>(w.panels) + panel_offset;
    const float* scales = w.scales != nullptr ? w.scales + scale_offset : nullptr;
    if (type != CpuWeightDtype::kBf16) {
      kernel(x.data(), k, m, panel, scales, k, bias, y, ldy, cols, prefetch ? panel : nullptr,
             prefetch ? 2 * k : 0);
      return;
    }
    const int steps = internal::Bf16PaddedK(k);
    std::vector<float> rounded(static_cast<size_t>(m) * steps);
    internal::RoundBf16Activations(
        x.data(), k, m, k,
        bf16_pairs ? internal::Bf16Activations::kPairs : internal::Bf16Activations::kChainOrder,
        rounded.data());
    kernel(rounded.data(), bf16_pairs ? steps / 2 : steps, m, panel, nullptr, steps, bias, y, ldy,
           cols, prefetch ? panel : nullptr, prefetch ? 2 * k : 0);
  }
};

// Every instruction path this CPU can run gives the portable kernel's bits, for every
// weight type, every row count a call can have (each AVX2 tile shape: 1-2 rows over 32
// columns, groups of up to 6 over two halves), partial panels, with and without bias.
// The vector kernels also prefetch (here: the panel they read), which must not matter.
// bf16 runs a second time on values around FLT_MIN, where every path must flush the
// same denormal sums to zero as vdpbf16ps.
TEST_P(TypedGemmTest, EveryInstructionPathGivesThePortableBits) {
  const CpuWeightDtype type = GetParam();
  using internal::GemmPanelKernel;
  struct Path {
    CpuIsa isa;
    KernelCall call;
  };
  const auto pick = [type](GemmPanelKernel f32, GemmPanelKernel bf16, GemmPanelKernel int8) {
    return type == CpuWeightDtype::kBf16 ? bf16 : type == CpuWeightDtype::kInt8 ? int8 : f32;
  };
  const KernelCall portable{pick(internal::GemmPanelPortable, internal::GemmPanelBf16Portable,
                                 internal::GemmPanelInt8Portable)};
  std::vector<Path> paths = {
      {CpuIsa::kAvx2,
       {pick(internal::GemmPanelAvx2, internal::GemmPanelBf16Avx2, internal::GemmPanelInt8Avx2)}},
      {CpuIsa::kAvx512,
       {pick(internal::GemmPanelAvx512, internal::GemmPanelBf16Avx512,
             internal::GemmPanelInt8Avx512)}},
  };
  if (type == CpuWeightDtype::kBf16) {
    paths.push_back({CpuIsa::kAvx512Bf16, {internal::GemmPanelBf16Avx512Bf16, true}});
  }
  const std::vector<float> magnitudes =
      type == CpuWeightDtype::kBf16 ? std::vector<float>{1.0f, 3e-20f} : std::vector<float>{1.0f};
  int compared = 0;
  for (const float magnitude : magnitudes) {
    const auto random = [magnitude](size_t count, uint32_t seed) {
      auto v = Random(count, seed);
      for (float& e : v) e *= magnitude;
      return v;
    };
    for (const int k : {301, 300}) {
      for (const Path& path : paths) {
        if (path.isa > DetectedCpuIsa()) continue;
        for (int n : {32, 29, 17, 7}) {
          auto w = random(n * k, 17 + n);
          auto bias = random(n, 18 + n);
          TypedPacked packed(type, w, n, k);
          for (int m = 1; m <= internal::kGemmMaxRows; ++m) {
            auto x = random(m * k, 16 + m);
            for (const float* b :
                 {static_cast<const float*>(bias.data()), static_cast<const float*>(nullptr)}) {
              std::vector<float> got(m * n, NAN), want(m * n, NAN);
              path.call(type, x, m, k, packed.weight, 0, 0, b, got.data(), n, n, true);
              portable(type, x, m, k, packed.weight, 0, 0, b, want.data(), n, n, false);
              ASSERT_TRUE(SameBits(got.data(), want.data(), got.size()))
                  << CpuIsaName(path.isa) << " " << CpuWeightDtypeName(type) << " m=" << m
                  << " n=" << n << " k=" << k << " magnitude=" << magnitude
                  << (b != nullptr ? " with bias" : " without bias");
              ++compared;
            }
          }
        }
      }
      // The pair kernels (one row, two adjacent panels: what GemmPackedAs runs for
      // m == 1) against two portable calls.
      std::vector<Path> pairs = {
          {CpuIsa::kAvx2,
           {pick(internal::GemmPanelPairAvx2, internal::GemmPanelPairBf16Avx2,
                 internal::GemmPanelPairInt8Avx2)}},
          {CpuIsa::kAvx512,
           {pick(internal::GemmPanelPairAvx512, internal::GemmPanelPairBf16Avx512,
                 internal::GemmPanelPairInt8Avx512)}},
      };
      if (type == CpuWeightDtype::kBf16) {
        pairs.push_back({CpuIsa::kAvx512Bf16, {internal::GemmPanelPairBf16Avx512Bf16, true}});
      }
      for (const Path& path : pairs) {
        if (path.isa > DetectedCpuIsa()) continue;
        for (int n : {64, 61, 40, 33}) {
          auto w = random(n * k, 27 + n);
          auto bias = random(n, 28 + n);
          auto x = random(k, 29 + n);
          TypedPacked packed(type, w, n, k);
          const size_t second = PackedGemmPanelBytes(type, kGemmPanelWidth, k);
          for (const float* b :
               {static_cast<const float*>(bias.data()), static_cast<const float*>(nullptr)}) {
            std::vector<float> got(n, NAN), want(n, NAN);
            path.call(type, x, 1, k, packed.weight, 0, 0, b, got.data(), n, n, false);
            portable(type, x, 1, k, packed.weight, 0, 0, b, want.data(), n, kGemmPanelWidth, false);
            portable(type, x, 1, k, packed.weight, second, kGemmPanelWidth,
                     b != nullptr ? b + kGemmPanelWidth : nullptr, want.data() + kGemmPanelWidth, n,
                     n - kGemmPanelWidth, false);
            ASSERT_TRUE(SameBits(got.data(), want.data(), got.size()))
                << CpuIsaName(path.isa) << " pair " << CpuWeightDtypeName(type) << " n=" << n
                << " k=" << k << " magnitude=" << magnitude;
            ++compared;
          }
        }
      }
    }
  }
  if (compared == 0) GTEST_SKIP() << "CPU has neither AVX2+FMA nor AVX-512";
  std::printf("%s: %d kernel calls compared up to %s\n", CpuWeightDtypeName(type), compared,
              CpuIsaName(DetectedCpuIsa()));
}

// Two wrong bf16 chains, as a CPU whose instruction differed from the specification might
// compute them (chain-order activations, gemm_kernels.h): the pair's even product first,
// or no flushing of denormal sums.
template <bool kEvenFirst, bool kFlush>
void WrongBf16Panel(const float* x, int ldx, int m, const void* panel, const float*, int k,
                    const float* bias, float* y, int ldy, int cols, const void*, int) {
  const auto* w = static_cast<const uint16_t*>(panel);
  const auto flush = [](float v) {
    return kFlush && std::fabs(v) < FLT_MIN ? std::copysign(0.0f, v) : v;
  };
  for (int r = 0; r < m; ++r) {
    for (int j = 0; j < cols; ++j) {
      float acc = 0.0f;
      for (int step = 0; step < k; ++step) {
        const int i = kEvenFirst ? step ^ 1 : step;  // Chain-order position of the product.
        const float weight =
            internal::FromBf16(w[(i >> 1) * 2 * kGemmPanelWidth + 2 * j + ((i & 1) ^ 1)]);
        acc = flush(std::fma(x[r * ldx + i], weight, acc));
      }
      y[static_cast<long>(r) * ldy + j] = bias != nullptr ? flush(acc + flush(bias[j])) : acc;
    }
  }
}

// The start-up check that keeps vdpbf16ps off a CPU where it would give other bits
// (ChooseBf16Arithmetic, bf16_arithmetic.h): it passes every kernel this CPU runs, and fails
// kernels that order or flush the chain differently.
TEST(GemmTest, Bf16SelfCheckPassesTheKernelsAndCatchesOtherChains) {
  using internal::Bf16Activations;
  int checked = 0;
  EXPECT_EQ(internal::Bf16KernelMismatches(internal::GemmPanelBf16Portable,
                                           Bf16Activations::kChainOrder, &checked),
            0);
  EXPECT_EQ(checked, 2 * internal::kGemmMaxRows * kGemmPanelWidth);
  struct Path {
    CpuIsa isa;
    internal::GemmPanelKernel kernel;
    Bf16Activations layout;
  };
  for (const Path& path :
       {Path{CpuIsa::kAvx2, internal::GemmPanelBf16Avx2, Bf16Activations::kChainOrder},
        Path{CpuIsa::kAvx512, internal::GemmPanelBf16Avx512, Bf16Activations::kChainOrder},
        Path{CpuIsa::kAvx512Bf16, internal::GemmPanelBf16Avx512Bf16, Bf16Activations::kPairs}}) {
    if (path.isa > DetectedCpuIsa()) continue;
    EXPECT_EQ(internal::Bf16KernelMismatches(path.kernel, path.layout), 0) << CpuIsaName(path.isa);
  }
  const int even_first =
      internal::Bf16KernelMismatches(WrongBf16Panel<true, true>, Bf16Activations::kChainOrder);
  const int unflushed =
      internal::Bf16KernelMismatches(WrongBf16Panel<false, false>, Bf16Activations::kChainOrder);
  // Each is wrong on a good share of the outputs, not on a lucky few.
  EXPECT_GT(even_first, checked / 10);
  EXPECT_GT(unflushed, checked / 10);
  std::printf("of %d outputs, the even-first chain differs in %d, the unflushed one in %d\n",
              checked, even_first, unflushed);
}

// The vector roundings of activations give the scalar one's bits, on every kind of float
// (normal, denormal, zero, infinite, NaN) and every row tail, in both layouts.
TEST(GemmTest, VectorBf16RoundingMatchesTheScalarOne) {
  struct Rounding {
    CpuIsa isa;
    internal::Bf16Activations layout;
    void (*round)(const float* x, int ldx, int m, int k, void* out);
    int element_bytes;
  };
  const Rounding roundings[] = {
      {CpuIsa::kAvx2, internal::Bf16Activations::kChainOrder, internal::RoundBf16ChainOrderAvx2, 4},
      {CpuIsa::kAvx512Bf16, internal::Bf16Activations::kPairs, internal::RoundBf16PairsAvx512Bf16,
       2},
  };
  int checked = 0;
  for (const Rounding& rounding : roundings) {
    if (rounding.isa > DetectedCpuIsa()) continue;
    std::mt19937 rng(5);
    for (int k : {1, 2, 7, 8, 9, 15, 16, 17, 31, 32, 33, 64, 301}) {
      const int m = 3, ldx = k + 5, padded = internal::Bf16PaddedK(k);
      std::vector<float> x(static_cast<size_t>(m) * ldx);
      for (float& v : x) {
        const uint32_t bits = rng();  // Every exponent: denormals, infinities and NaNs too.
        std::memcpy(&v, &bits, sizeof(v));
      }
      // One guard element past the rows' padded width: neither may write it.
      const size_t bytes = static_cast<size_t>(m) * padded * rounding.element_bytes;
      std::vector<unsigned char> want(bytes + 4, 0xAB), got = want;
      internal::RoundBf16Activations(x.data(), ldx, m, k, rounding.layout, want.data());
      rounding.round(x.data(), ldx, m, k, got.data());
      EXPECT_EQ(got, want) << CpuIsaName(rounding.isa) << " k=" << k;
      ++checked;
    }
  }
  if (checked == 0) GTEST_SKIP() << "CPU has no AVX2";
}

INSTANTIATE_TEST_SUITE_P(WeightTypes, TypedGemmTest,
                         ::testing::Values(CpuWeightDtype::kF32, CpuWeightDtype::kBf16,
                                           CpuWeightDtype::kInt8),
                         [](const auto& info) { return CpuWeightDtypeName(info.param); });

TEST(GemmTest, Bf16RoundsToNearestEven) {
  EXPECT_EQ(internal::ToBf16(1.0f), 0x3f80);
  EXPECT_EQ(internal::FromBf16(internal::ToBf16(1.0f + 1.0f / 256)), 1.0f);  // Tie: to even.
  EXPECT_EQ(internal::FromBf16(internal::ToBf16(1.0f + 3.0f / 256)), 1.0f + 4.0f / 256);
  EXPECT_TRUE(std::isnan(internal::FromBf16(internal::ToBf16(NAN))));
  EXPECT_EQ(internal::FromBf16(internal::ToBf16(-0.0f)), 0.0f);
  // vcvtne2ps2bf16's rules: a denormal becomes a zero of its sign, a NaN a quiet NaN.
  EXPECT_EQ(internal::ToBf16(1e-40f), 0x0000);
  EXPECT_EQ(internal::ToBf16(-1e-40f), 0x8000);
  EXPECT_EQ(internal::ToBf16(std::numeric_limits<float>::min()), 0x0080);
  uint32_t signaling = 0x7f800001u;
  float nan = 0;
  std::memcpy(&nan, &signaling, sizeof(nan));
  EXPECT_EQ(internal::ToBf16(nan), 0x7fc0);
}

}  // namespace
}  // namespace conveyor::kernels
