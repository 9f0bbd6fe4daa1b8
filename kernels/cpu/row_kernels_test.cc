#include "kernels/cpu/row_kernels.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"

namespace conveyor::kernels {
namespace {

using internal::RowKernels;

// Row lengths around the 16-float register: tails of every kind, and the small model's.
const int kLengths[] = {1, 2, 7, 15, 16, 17, 31, 33, 64, 100, 768, 1000};

std::vector<float> RandomFloats(size_t count, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(count);
  for (float& x : v) x = dist(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

double ReferenceInverseRms(const std::vector<float>& x, float eps) {
  long double sum = 0;
  for (float v : x) sum += static_cast<long double>(v) * v;
  return static_cast<double>(1.0L / std::sqrt(sum / x.size() + eps));
}

const RowKernels& KernelsOf(CpuIsa isa) { return *internal::CpuKernelsFor(isa).rows; }

class RowKernelsTest : public testing::TestWithParam<CpuIsa> {
 protected:
  void SetUp() override {
    if (GetParam() > DetectedCpuIsa()) GTEST_SKIP() << "CPU cannot run " << CpuIsaName(GetParam());
  }
  const RowKernels& kernels() const { return KernelsOf(GetParam()); }
};

TEST_P(RowKernelsTest, RmsNormMatchesExtendedPrecision) {
  constexpr float kEps = 1e-5f;
  for (int hidden : kLengths) {
    const std::vector<float> x = RandomFloats(hidden, hidden, 3.0f);
    const std::vector<float> w = RandomFloats(hidden, hidden + 1);
    std::vector<float> out(hidden);
    kernels().rms_norm(x.data(), w.data(), hidden, kEps, out.data());
    const double inv = ReferenceInverseRms(x, kEps);
    for (int i = 0; i < hidden; ++i) {
      const double expected = x[i] * inv * w[i];
      // Three float roundings (inverse RMS, two products).
      EXPECT_NEAR(out[i], expected, 4e-7 * std::abs(expected) + 1e-30) << hidden << " " << i;
    }
  }
}

TEST_P(RowKernelsTest, AddRmsNormAddsThenNormalizes) {
  constexpr float kEps = 1e-6f;
  for (int hidden : kLengths) {
    const std::vector<float> residual = RandomFloats(hidden, 10 + hidden);
    const std::vector<float> x = RandomFloats(hidden, 20 + hidden);
    const std::vector<float> w = RandomFloats(hidden, 30 + hidden);
    std::vector<float> sum = residual;
    std::vector<float> out(hidden), expected_out(hidden);
    kernels().add_rms_norm(sum.data(), x.data(), w.data(), hidden, kEps, out.data());
    for (int i = 0; i < hidden; ++i) EXPECT_EQ(sum[i], residual[i] + x[i]) << hidden;
    kernels().rms_norm(sum.data(), w.data(), hidden, kEps, expected_out.data());
    EXPECT_TRUE(SameBits(out, expected_out)) << hidden;
  }
}

TEST_P(RowKernelsTest, RopeRotatesPairs) {
  for (int head_dim : {2, 8, 32, 64, 80, 128}) {
    const int half = head_dim / 2;
    const int heads = 3;
    std::vector<float> q = RandomFloats(static_cast<size_t>(heads) * head_dim, head_dim);
    const std::vector<float> before = q;
    std::vector<float> cos(half), sin(half);
    for (int i = 0; i < half; ++i) {
      cos[i] = static_cast<float>(std::cos(0.37 * (i + 1)));
      sin[i] = static_cast<float>(std::sin(0.37 * (i + 1)));
    }
    kernels().rope(q.data(), heads, head_dim, cos.data(), sin.data());
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < half; ++i) {
        const float x1 = before[h * head_dim + i];
        const float x2 = before[h * head_dim + i + half];
        EXPECT_EQ(q[h * head_dim + i], x1 * cos[i] - x2 * sin[i]) << head_dim;
        EXPECT_EQ(q[h * head_dim + i + half], x2 * cos[i] + x1 * sin[i]) << head_dim;
      }
    }
  }
}

TEST_P(RowKernelsTest, SiluMulMatchesDoublePrecision) {
  for (int n : kLengths) {
    std::vector<float> gate = RandomFloats(n, 40 + n, 4.0f);
    const std::vector<float> up = RandomFloats(n, 50 + n);
    // Where exp(-g) overflows or underflows, and signed zeros.
    const float extremes[] = {0.0f, -0.0f, 88.0f, -88.0f, 100.0f, -100.0f, 1e30f, -1e30f};
    for (int i = 0; i < n && i < 8; ++i) gate[i] = extremes[i];
    std::vector<float> out(n);
    kernels().silu_mul(gate.data(), up.data(), n, out.data());
    for (int i = 0; i < n; ++i) {
      const double g = gate[i];
      const double expected = g / (1.0 + std::exp(-g)) * up[i];
      EXPECT_NEAR(out[i], expected, 5e-7 * std::abs(expected) + 1e-37) << n << " " << g;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sets, RowKernelsTest,
                         testing::Values(CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512),
                         [](const testing::TestParamInfo<CpuIsa>& info) {
                           return std::string(CpuIsaName(info.param));
                         });

// ExpAvx512 / ExpAvx2 written out in scalar IEEE operations (each rounds as its vector
// lane does): nearbyint for roundscale, fmaf for the FMAs, ldexp for scalef. The vector
// sets' SiLU must give exactly this, which ties AVX2 to AVX-512 on a machine that has
// only one of them.
float ScalarVectorExp(float x) {
  x = std::isnan(x) ? -104.0f : std::max(x, -104.0f);
  const float n = std::nearbyint(x * 1.44269504088896341f);
  float r = std::fma(-n, 0.693359375f, x);
  r = std::fma(-n, -2.12194440e-4f, r);
  float poly = 1.9875691500e-4f;
  poly = std::fma(poly, r, 1.3981999507e-3f);
  poly = std::fma(poly, r, 8.3334519073e-3f);
  poly = std::fma(poly, r, 4.1665795894e-2f);
  poly = std::fma(poly, r, 1.6666665459e-1f);
  poly = std::fma(poly, r, 5.0000001201e-1f);
  const float y = std::fma(poly, r * r, r) + 1.0f;
  return std::ldexp(y, static_cast<int>(n));
}

float ScalarVectorSiluMul(float g, float up) {
  const float e = ScalarVectorExp(-std::fabs(g));
  const float numerator = g < 0.0f ? g * e : g;
  return numerator / (1.0f + e) * up;
}

// RMSNorm and RoPE are specified to the bit (row_kernels.h), so a model gives the same
// activations on a CPU with AVX-512, AVX2 or neither; SiLU is the same on both vector sets.
TEST(RowKernelSetsTest, EveryVectorSetAgreesToTheBit) {
  const RowKernels& p = internal::kPortableRowKernels;
  int sets = 0;
  for (CpuIsa isa : {CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    if (isa > DetectedCpuIsa()) continue;
    ++sets;
    const RowKernels& a = KernelsOf(isa);
    for (int hidden : kLengths) {
      const std::vector<float> x = RandomFloats(hidden, 60 + hidden, 10.0f);
      const std::vector<float> y = RandomFloats(hidden, 70 + hidden);
      const std::vector<float> w = RandomFloats(hidden, 80 + hidden);
      std::vector<float> out_a(hidden), out_p(hidden);
      a.rms_norm(x.data(), w.data(), hidden, 1e-5f, out_a.data());
      p.rms_norm(x.data(), w.data(), hidden, 1e-5f, out_p.data());
      EXPECT_TRUE(SameBits(out_a, out_p)) << a.name << " rms_norm " << hidden;
      std::vector<float> res_a = x, res_p = x;
      a.add_rms_norm(res_a.data(), y.data(), w.data(), hidden, 1e-5f, out_a.data());
      p.add_rms_norm(res_p.data(), y.data(), w.data(), hidden, 1e-5f, out_p.data());
      EXPECT_TRUE(SameBits(res_a, res_p)) << a.name << " add_rms_norm residual " << hidden;
      EXPECT_TRUE(SameBits(out_a, out_p)) << a.name << " add_rms_norm " << hidden;
      if (hidden % 2 == 0) {
        std::vector<float> heads_a = x, heads_p = x;
        a.rope(heads_a.data(), 1, hidden, y.data(), w.data());
        p.rope(heads_p.data(), 1, hidden, y.data(), w.data());
        EXPECT_TRUE(SameBits(heads_a, heads_p)) << a.name << " rope " << hidden;
      }
    }
    // SiLU over a dense sweep of gates: both signs, exp's whole range down to where it
    // flushes to zero (|g| > 104) and through the denormals (|g| in 87..104).
    std::vector<float> gate, up;
    for (float g = -120.0f; g <= 120.0f; g += 0.0137f) {
      gate.push_back(g);
      up.push_back(1.0f + g / 256.0f);
    }
    for (float g : {0.0f, -0.0f, 1e-30f, -1e-30f, 1e30f, -1e30f, 87.3365f, -87.3365f}) {
      gate.push_back(g);
      up.push_back(0.75f);
    }
    std::vector<float> out(gate.size()), expected(gate.size());
    a.silu_mul(gate.data(), up.data(), static_cast<int>(gate.size()), out.data());
    for (size_t i = 0; i < gate.size(); ++i) expected[i] = ScalarVectorSiluMul(gate[i], up[i]);
    // Both vector sets to the bit (AVX2 first shown on a Zen 3, AVX-512 on a Zen 5).
    for (size_t i = 0; i < gate.size(); ++i) {
      ASSERT_EQ(std::bit_cast<uint32_t>(out[i]), std::bit_cast<uint32_t>(expected[i]))
          << a.name << " silu_mul(" << gate[i] << "): " << out[i] << " vs " << expected[i];
    }
  }
  if (sets == 0) GTEST_SKIP() << "CPU has neither AVX2+FMA nor AVX-512";
}

// --- The backend's row operations: a token's bits alone = in a batch, any thread count.

constexpr int kHidden = 200;  // Not a multiple of 16: every row has a tail.
constexpr int kFfn = 72;
constexpr int kHeads = 4, kKvHeads = 2, kHeadDim = 48;
constexpr int kQkvWidth = (kHeads + 2 * kKvHeads) * kHeadDim;
constexpr int kBatch = 300;  // Several chunks per thread.
constexpr int kPositions = 512;

// Outputs of every row operation for `ids` (indices into shared random inputs).
std::vector<std::vector<float>> RunRowOps(Backend* b, const std::vector<int32_t>& ids) {
  const int n = static_cast<int>(ids.size());
  const std::vector<float> table = RandomFloats(static_cast<size_t>(kBatch) * kHidden, 1);
  const std::vector<float> deltas = RandomFloats(static_cast<size_t>(kBatch) * kHidden, 2);
  const std::vector<float> weight = RandomFloats(kHidden, 3);
  const std::vector<float> qkv_all = RandomFloats(static_cast<size_t>(kBatch) * kQkvWidth, 4);
  const std::vector<float> gate_up_all = RandomFloats(static_cast<size_t>(kBatch) * 2 * kFfn, 5);
  std::vector<float> rope(2 * kPositions * kHeadDim / 2);
  for (size_t i = 0; i < rope.size(); ++i) rope[i] = static_cast<float>(std::sin(0.01 * i));
  auto rows_of = [&](const std::vector<float>& all, int width) {
    std::vector<float> v(static_cast<size_t>(n) * width);
    for (int t = 0; t < n; ++t) {
      std::memcpy(&v[static_cast<size_t>(t) * width], &all[static_cast<size_t>(ids[t]) * width],
                  width * sizeof(float));
    }
    return v;
  };
  std::vector<float> residual(static_cast<size_t>(n) * kHidden);
  b->Embedding(table.data(), kHidden, ids.data(), n, residual.data());
  std::vector<float> normed(residual.size()), normed2(residual.size());
  b->RmsNorm(residual.data(), weight.data(), n, kHidden, 1e-5f, normed.data());
  std::vector<float> x = rows_of(deltas, kHidden);
  b->AddRmsNorm(residual.data(), x.data(), weight.data(), n, kHidden, 1e-5f, normed2.data());
  std::vector<float> qkv = rows_of(qkv_all, kQkvWidth);
  std::vector<int32_t> positions(n);
  for (int t = 0; t < n; ++t) positions[t] = (ids[t] * 37) % kPositions;
  AttentionShape shape;
  shape.num_heads = kHeads;
  shape.num_kv_heads = kKvHeads;
  shape.head_dim = kHeadDim;
  float* k = qkv.data() + kHeads * kHeadDim;
  float* v = k + kKvHeads * kHeadDim;
  b->Rope(qkv.data(), k, n, kQkvWidth, positions.data(), rope.data(), kPositions, shape);
  // Each token writes slot ids[t] (blocks of 16 slots); the cache's rows come back in
  // token order, read through the CPU backend's layout.
  const int kBlock = 16;
  const size_t slot_floats = kKvHeads * kHeadDim;
  const size_t cache_floats = (kBatch + kBlock - 1) / kBlock * kBlock * slot_floats;
  std::vector<float> k_cache(cache_floats), v_cache(cache_floats);
  b->WriteKv(k, v, n, kQkvWidth, ids.data(), shape, {k_cache.data(), v_cache.data(), kBlock});
  const internal::CpuKvLayout layout{kKvHeads, kHeadDim, kBlock};
  std::vector<float> k_rows, v_rows;
  for (int t = 0; t < n; ++t) {
    for (int h = 0; h < kKvHeads; ++h) {
      for (int c = 0; c < kHeadDim; ++c) {
        k_rows.push_back(k_cache[layout.K(ids[t], h, c)]);
        v_rows.push_back(v_cache[layout.V(ids[t], h, c)]);
      }
    }
  }
  std::vector<float> gate_up = rows_of(gate_up_all, 2 * kFfn);
  std::vector<float> mlp(static_cast<size_t>(n) * kFfn);
  b->SiluMul(gate_up.data(), n, kFfn, mlp.data());
  return {normed, residual, normed2, qkv, k_rows, v_rows, mlp};
}

TEST(CpuBackendRowOpsTest, TokenAloneMatchesTokenInBatchForAnyThreadCount) {
  std::vector<int32_t> batch(kBatch);
  for (int t = 0; t < kBatch; ++t) batch[t] = (t * 7 + 3) % kBatch;  // A permutation.
  const char* kNames[] = {"RmsNorm",   "residual",  "AddRmsNorm", "Rope",
                          "WriteKv k", "WriteKv v", "SiluMul"};
  std::unique_ptr<Backend> one = MakeCpuBackend(1);
  for (int threads : {1, 2, 3}) {
    std::unique_ptr<Backend> backend = MakeCpuBackend(threads);
    const std::vector<std::vector<float>> batched = RunRowOps(backend.get(), batch);
    for (int t : {0, 1, 17, kBatch - 1}) {
      const std::vector<std::vector<float>> alone = RunRowOps(one.get(), {batch[t]});
      for (size_t op = 0; op < alone.size(); ++op) {
        const size_t width = alone[op].size();
        EXPECT_EQ(
            0, std::memcmp(alone[op].data(), batched[op].data() + t * width, width * sizeof(float)))
            << kNames[op] << ", token " << t << ", " << threads << " threads";
      }
    }
  }
}

}  // namespace
}  // namespace conveyor::kernels
