#include "kernels/cpu/gemm.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "gtest/gtest.h"
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
        ASSERT_EQ(0, std::memcmp(y.data() + static_cast<size_t>(pos) * n, alone.data(),
                                 n * sizeof(float)))
            << "m=" << m << " pos=" << pos;
        ++checked;
      }
    }
  }
  EXPECT_EQ(checked, 7 * 3 * 3);
}

TEST(GemmTest, PortableAndAvx512KernelsAgreeBitForBit) {
  if (!__builtin_cpu_supports("avx512f")) GTEST_SKIP() << "CPU has no AVX-512";
  const int m = 12, n = 29, k = 301;
  auto x = Random(m * k, 8), w = Random(n * k, 9), bias = Random(n, 10);
  Packed packed(w, n, k);
  std::vector<float> a(m * n), b(m * n);
  // The AVX-512 kernel also prefetches (here: the panel it reads), which must not matter.
  internal::GemmPanelAvx512(x.data(), k, m, packed.data, k, bias.data(), a.data(), n, n,
                            packed.data, 2 * k);
  internal::GemmPanelPortable(x.data(), k, m, packed.data, k, bias.data(), b.data(), n, n, nullptr,
                              0);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

}  // namespace
}  // namespace conveyor::kernels
