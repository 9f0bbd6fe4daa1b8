// The CUDA backend's weight-only path for GGUF block-quantized weights
// (Backend::PackLinearQuantized, kernels/cuda/quant_layout.h, quant_linear_kernels.cu),
// for every block type, against ggml's dequantization (checkpoint/ggml_types.h):
//
// - Without a GPU (these run in CI): the repacked layout's weights equal ggml's bit for bit,
//   and bad input is refused.
// - With a GPU (each test skips itself without one): unit-vector inputs read every
//   dequantized weight back through both paths (the fused GEMV for n <= 8, the dequantized
//   tile and the GEMM above), which must equal ggml's value rounded to the compute dtype
//   exactly; random inputs at n in {1, 3, 8, 17, 64} against a float64 matmul on ggml's
//   dequantized weights, every element within the error bound stated at
//   ElementErrorBound; weights of several parts (mixed types, as Q4_K_M's qkv is) and
//   bias; the weight split into several tiles by a small scratch; replay in a CUDA graph;
//   and the GEMV's batch invariance (n <= 8). Each check prints a "[ METRIC ]" line for
//   tests/gpu/run.sh's table.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "checkpoint/ggml_types.h"
#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/quant_layout.h"
#include "kernels/quant_blocks.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/support/random_quant_blocks.h"

namespace conveyor::kernels {
namespace {

// Tokens the fused GEMV takes; more go through the dequantized tile and the GEMM.
constexpr int kGemvTokens = cuda::kMaxQuantGemvTokens;

constexpr QuantBlockType kTypes[] = {QuantBlockType::kQ8_0, QuantBlockType::kQ4_0,
                                     QuantBlockType::kQ4_1, QuantBlockType::kQ4_K,
                                     QuantBlockType::kQ5_K, QuantBlockType::kQ6_K};

using testing::GgmlWeights;
using testing::RandomBlocks;

// --- The layout, on the host --------------------------------------------------------

class QuantLayoutTest : public ::testing::TestWithParam<QuantBlockType> {};

TEST_P(QuantLayoutTest, RepackedWeightsEqualGgmlDequantizationBitForBit) {
  const QuantBlockType type = GetParam();
  std::mt19937 rng(11);
  for (const int k : {256, 768}) {
    const int rows = 9;
    const std::vector<uint8_t> blocks = RandomBlocks(type, rows, k, rng);
    const std::vector<float> want = GgmlWeights(type, blocks, rows, k);
    const absl::StatusOr<cuda::GpuQuantRows> got =
        cuda::RepackQuantizedRows({type, rows, blocks.data()}, k);
    ASSERT_TRUE(got.ok()) << got.status();
    const cuda::GpuQuantFormat& f = got->format;
    EXPECT_EQ(got->codes.size(), static_cast<size_t>(rows) * k * f.bits / 8);
    EXPECT_EQ(got->scales.size(), static_cast<size_t>(rows) * k / f.group);
    EXPECT_EQ(got->mins.size(), f.has_min ? got->scales.size() : 0u);
    size_t mismatches = 0;
    for (int r = 0; r < rows; ++r) {
      for (int c = 0; c < k; ++c) {
        const float w = cuda::GpuQuantWeight(*got, r, c);
        const float ref = want[static_cast<size_t>(r) * k + c];
        if (std::bit_cast<uint32_t>(w) != std::bit_cast<uint32_t>(ref)) {
          if (mismatches++ < 5) {
            ADD_FAILURE() << QuantBlockTypeName(type) << " row " << r << " col " << c << ": " << w
                          << " != ggml's " << ref;
          }
        }
      }
    }
    EXPECT_EQ(mismatches, 0u) << QuantBlockTypeName(type) << " k=" << k;
  }
}

TEST_P(QuantLayoutTest, RefusesBadInput) {
  const QuantBlockType type = GetParam();
  std::mt19937 rng(3);
  const std::vector<uint8_t> blocks = RandomBlocks(type, 2, 256, rng);
  const int block = QuantBlockElements(type);
  for (const int k : {0, -256, block + 16, block / 2}) {
    EXPECT_EQ(cuda::RepackQuantizedRows({type, 2, blocks.data()}, k).status().code(),
              absl::StatusCode::kInvalidArgument)
        << "k=" << k;
  }
  EXPECT_EQ(cuda::RepackQuantizedRows({type, 0, blocks.data()}, 256).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(cuda::RepackQuantizedRows({type, 2, nullptr}, 256).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(QuantLayoutTest, RefusesAnUnknownBlockType) {
  const std::vector<uint8_t> blocks(1024);
  EXPECT_EQ(cuda::RepackQuantizedRows({static_cast<QuantBlockType>(99), 1, blocks.data()}, 256)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

std::string TypeName(const ::testing::TestParamInfo<QuantBlockType>& info) {
  return QuantBlockTypeName(info.param);
}

INSTANTIATE_TEST_SUITE_P(Types, QuantLayoutTest, ::testing::ValuesIn(kTypes), TypeName);

// --- The backend, on a GPU ------------------------------------------------------------

// A weight of stacked parts, as the model's loader hands it over, with ggml's float32
// values of all its rows.
struct QuantWeight {
  std::vector<std::vector<uint8_t>> blocks;  // Per part.
  std::vector<QuantizedRows> parts;
  std::vector<float> ggml;  // [out, in]
  int out = 0;
  int in = 0;
};

QuantWeight MakeWeight(const std::vector<std::pair<QuantBlockType, int>>& parts, int in,
                       std::mt19937& rng) {
  QuantWeight w;
  w.in = in;
  w.blocks.reserve(parts.size());
  for (const auto& [type, rows] : parts) {
    w.blocks.push_back(RandomBlocks(type, rows, in, rng));
    const std::vector<float> values = GgmlWeights(type, w.blocks.back(), rows, in);
    w.ggml.insert(w.ggml.end(), values.begin(), values.end());
    w.parts.push_back({type, rows, w.blocks.back().data()});
    w.out += rows;
  }
  return w;
}

using QuantParam = std::tuple<DtypeParam, QuantBlockType>;

class CudaQuantLinearTest : public ::testing::TestWithParam<QuantParam> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    gpu_ = MakeGpu(CudaBackendOptions().scratch_bytes);
    ASSERT_NE(gpu_, nullptr);
    const unsigned seed = std::random_device()();
    rng_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::printf("[ SEED     ] %u\n", seed);
  }
  void TearDown() override {
    if (gpu_ == nullptr) return;
    EXPECT_TRUE(gpu_->Synchronize().ok()) << gpu_->last_error();
  }

  const DtypeParam& dtype() const { return std::get<0>(GetParam()); }
  QuantBlockType type() const { return std::get<1>(GetParam()); }
  std::string Name(const std::string& check) const {
    return check + "_" + QuantBlockTypeName(type());
  }
  std::unique_ptr<CudaBackend> MakeGpu(size_t scratch_bytes) const {
    CudaBackendOptions options;
    options.dtype = dtype().dtype;
    options.scratch_bytes = scratch_bytes;
    absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = MakeCudaBackend(0, options);
    EXPECT_TRUE(gpu.ok()) << gpu.status();
    return gpu.ok() ? std::move(*gpu) : nullptr;
  }
  float Round(float x) const {
    return dtype().dtype == CudaComputeDtype::kBf16 ? RoundToBf16(x) : RoundToFp16(x);
  }
  // The compute dtype's unit roundoff: 2^-8 for bf16, 2^-11 for fp16.
  double UnitRoundoff() const {
    return dtype().dtype == CudaComputeDtype::kBf16 ? 0x1p-8 : 0x1p-11;
  }
  // Normal values with an 8x outlier every 97, rounded to the compute dtype.
  std::vector<float> RandomActivations(size_t count) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> x(count);
    for (size_t i = 0; i < count; ++i) x[i] = Round(normal(rng_) * (i % 97 == 0 ? 8.0f : 1.0f));
    return x;
  }

  // y = x · Wᵀ (+ bias) through PackLinearQuantized and Linear on `gpu`.
  static std::vector<float> Run(Backend* gpu, const QuantWeight& w, const std::vector<float>& x,
                                int n, const std::vector<float>* bias) {
    absl::StatusOr<std::unique_ptr<LinearWeight>> packed =
        gpu->PackLinearQuantized(w.parts, w.in, bias != nullptr ? bias->data() : nullptr);
    EXPECT_TRUE(packed.ok()) << packed.status();
    if (!packed.ok()) return {};
    EXPECT_EQ((*packed)->out_features(), w.out);
    EXPECT_EQ((*packed)->in_features(), w.in);
    Buffers b(gpu);
    void* y = b.Poisoned(static_cast<size_t>(n) * w.out);
    gpu->Linear(b.Acts(x), n, **packed, y);
    return b.Read(y, static_cast<size_t>(n) * w.out);
  }

  // The float64 reference and the bound each element must meet. The GPU's error is its
  // weights' rounding to the compute dtype (the GEMM path; at most u·|w| each), the float32
  // sums (at most about in · 2^-24 of Σ|x·w|) and the output's rounding (u of the result),
  // with u the dtype's unit roundoff, so
  //   |y − ref| <= (2u + in · 2^-23) · (Σ_i |x_i·w_i| + |bias|) + in · 2^-24 · max|x|,
  // the last term for fp16's subnormal weights (absolute error 2^-25 each).
  void ExpectMatchesReference(const std::string& check, const QuantWeight& w,
                              const std::vector<float>& x, int n, const std::vector<float>* bias,
                              const std::vector<float>& got) {
    ASSERT_EQ(got.size(), static_cast<size_t>(n) * w.out) << check;
    const double u = UnitRoundoff();
    double max_x = 0;
    for (const float v : x) max_x = std::max(max_x, std::fabs(static_cast<double>(v)));
    std::vector<float> ref(got.size());
    size_t over = 0;
    double worst = 0;  // Largest |error| / bound.
    for (int t = 0; t < n; ++t) {
      for (int r = 0; r < w.out; ++r) {
        double sum = bias != nullptr ? (*bias)[r] : 0.0, magnitude = std::fabs(sum);
        for (int i = 0; i < w.in; ++i) {
          const double p = static_cast<double>(x[static_cast<size_t>(t) * w.in + i]) *
                           w.ggml[static_cast<size_t>(r) * w.in + i];
          sum += p;
          magnitude += std::fabs(p);
        }
        const size_t at = static_cast<size_t>(t) * w.out + r;
        ref[at] = static_cast<float>(sum);
        const double bound = (2 * u + w.in * 0x1p-23) * magnitude + w.in * 0x1p-24 * max_x;
        const double error = std::fabs(got[at] - sum);
        if (!(error <= bound)) {  // NaN too.
          if (over++ < 5) {
            ADD_FAILURE() << check << ": token " << t << " row " << r << ": " << got[at] << " vs "
                          << sum << " (bound " << bound << ")";
          }
        }
        worst = std::max(worst, std::isfinite(error) ? error / bound : INFINITY);
      }
    }
    // The table shows the norm-wise error; the pass/fail is per element.
    const double relative = RelativeError(got, ref);
    ReportMetric(check, dtype().name, relative, dtype().tolerance);
    EXPECT_LE(relative, dtype().tolerance) << check;
    EXPECT_EQ(over, 0u) << check << " (worst error " << worst << " of its bound)";
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::mt19937 rng_;
};

// Unit vectors read the weights back: y[t, r] = w[r, c_t] exactly (one product with 1,
// the rest with 0), so each dequantized weight must equal ggml's rounded to the compute
// dtype. The GEMV path gets 8 unit vectors per call, sweeping every column; the GEMM path
// the whole identity.
TEST_P(CudaQuantLinearTest, DequantizesExactlyOnBothPaths) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int in = 512;
  const QuantWeight w = MakeWeight({{type(), 77}}, in, rng_);
  std::vector<float> rounded(w.ggml.size());
  std::transform(w.ggml.begin(), w.ggml.end(), rounded.begin(), [&](float v) { return Round(v); });
  auto unit_rows = [&](int first, int n) {
    std::vector<float> x(static_cast<size_t>(n) * in, 0.0f);
    for (int t = 0; t < n; ++t) x[static_cast<size_t>(t) * in + first + t] = 1.0f;
    return x;
  };
  // Value mismatches (-0 equals +0: the sums may add a +0 to a -0 weight).
  auto count = [&](const std::vector<float>& y, int first, int n) {
    size_t bad = y.size() == static_cast<size_t>(n) * w.out ? 0 : 1;
    for (int t = 0; t < n && bad == 0; ++t) {
      for (int r = 0; r < w.out; ++r) {
        const float want = rounded[static_cast<size_t>(r) * in + first + t];
        bad += !(y[static_cast<size_t>(t) * w.out + r] == want);
      }
    }
    return bad;
  };
  size_t gemv_bad = 0;
  for (int first = 0; first < in; first += kGemvTokens) {
    gemv_bad += count(Run(gpu_.get(), w, unit_rows(first, kGemvTokens), kGemvTokens, nullptr),
                      first, kGemvTokens);
  }
  ReportMetric(Name("quant_dequant_gemv"), dtype().name, gemv_bad == 0 ? 0.0 : INFINITY, 0.0);
  EXPECT_EQ(gemv_bad, 0u);
  const size_t gemm_bad = count(Run(gpu_.get(), w, unit_rows(0, in), in, nullptr), 0, in);
  ReportMetric(Name("quant_dequant_gemm"), dtype().name, gemm_bad == 0 ? 0.0 : INFINITY, 0.0);
  EXPECT_EQ(gemm_bad, 0u);
}

TEST_P(CudaQuantLinearTest, MatchesFloat64OnGgmlWeights) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    std::vector<std::pair<QuantBlockType, int>> parts;
    int in;
    bool bias;
  };
  // Rows not a multiple of the GEMV's 8 warps per block; widths of 1, 3 and 4 K blocks;
  // a weight of three parts of different types (Q4_K_M stores q, k and v apart, in Q4_K
  // and Q6_K); 7 blocks of 32 for the types that have them.
  std::vector<Shape> shapes = {
      {{{type(), 77}}, 512, true},
      {{{type(), 130}}, 256, false},
      {{{type(), 13}}, 768, true},
      {{{type(), 40}, {QuantBlockType::kQ6_K, 24}, {QuantBlockType::kQ8_0, 9}}, 256, true},
  };
  if (QuantBlockElements(type()) == 32) shapes.push_back({{{type(), 45}}, 224, true});
  for (const Shape& s : shapes) {
    const QuantWeight w = MakeWeight(s.parts, s.in, rng_);
    std::vector<float> bias(w.out);
    for (float& b : bias) b = Round(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng_));
    for (const int n : {1, 3, 8, 17, 64}) {
      const std::vector<float> x = RandomActivations(static_cast<size_t>(n) * s.in);
      const std::vector<float>* b = s.bias ? &bias : nullptr;
      ExpectMatchesReference(Name("quant_linear") + "_p" + std::to_string(s.parts.size()) + "_" +
                                 std::to_string(w.out) + "x" + std::to_string(s.in) + "_n" +
                                 std::to_string(n) + (s.bias ? "_bias" : ""),
                             w, x, n, b, Run(gpu_.get(), w, x, n, b));
    }
  }
}

// The GEMV computes each token alone (same lanes, same order): a token's bits do not
// depend on how many others (up to 8) share the call. (The GEMM path is cuBLASLt's and
// makes no such promise, so the backend as a whole is not batch invariant.)
TEST_P(CudaQuantLinearTest, GemvTokenResultDoesNotDependOnTheBatch) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int in = 512;
  const QuantWeight w = MakeWeight({{type(), 61}}, in, rng_);
  std::vector<float> bias(w.out, 0.25f);
  const std::vector<float> x = RandomActivations(static_cast<size_t>(kGemvTokens) * in);
  const std::vector<float> batched = Run(gpu_.get(), w, x, kGemvTokens, &bias);
  size_t mismatches = 0;
  for (int t = 0; t < kGemvTokens; ++t) {
    const std::vector<float> one(x.begin() + static_cast<ptrdiff_t>(t) * in,
                                 x.begin() + static_cast<ptrdiff_t>(t + 1) * in);
    const std::vector<float> alone = Run(gpu_.get(), w, one, 1, &bias);
    const std::vector<float> row(batched.begin() + static_cast<ptrdiff_t>(t) * w.out,
                                 batched.begin() + static_cast<ptrdiff_t>(t + 1) * w.out);
    mismatches += Mismatches(alone, row);
  }
  ReportMetric(Name("quant_gemv_invariance"), dtype().name, mismatches == 0 ? 0.0 : INFINITY, 0.0);
  EXPECT_EQ(mismatches, 0u);
}

// A scratch of 1 MiB holds 128 rows of 4096 dequantized weights: 300 rows take three
// tiles (128, 128, 44), each written into its columns of the output with its bias.
TEST_P(CudaQuantLinearTest, SmallScratchSplitsTheWeightIntoTiles) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::unique_ptr<CudaBackend> small = MakeGpu(size_t{1} << 20);
  ASSERT_NE(small, nullptr);
  const int in = 4096;
  const QuantWeight w = MakeWeight({{type(), 200}, {QuantBlockType::kQ4_K, 100}}, in, rng_);
  std::vector<float> bias(w.out);
  for (float& b : bias) b = Round(std::uniform_real_distribution<float>(-2.0f, 2.0f)(rng_));
  const int n = 17;
  const std::vector<float> x = RandomActivations(static_cast<size_t>(n) * in);
  ExpectMatchesReference(Name("quant_linear_tiled_300x4096_n17"), w, x, n, &bias,
                         Run(small.get(), w, x, n, &bias));
  EXPECT_TRUE(small->Synchronize().ok()) << small->last_error();
  // A row too wide for the scratch is refused when packed, not when used.
  const int wide = (1 << 19) + 256;
  const std::vector<uint8_t> blocks(QuantRowBytes(type(), wide), 0);
  const QuantizedRows part{type(), 1, blocks.data()};
  EXPECT_EQ(small->PackLinearQuantized({&part, 1}, wide, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// The model replays decode steps as CUDA graphs: a captured Linear on a quantized weight
// must read the inputs present at replay (both paths).
TEST_P(CudaQuantLinearTest, ReplaysInACudaGraph) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int in = 256;
  const QuantWeight w = MakeWeight({{type(), 50}}, in, rng_);
  const std::vector<float> bias(w.out, -0.5f);
  auto packed = gpu_->PackLinearQuantized(w.parts, in, bias.data()).value();
  for (const int n : {3, 17}) {
    Buffers b(gpu_.get());
    void* x = b.Acts(RandomActivations(static_cast<size_t>(n) * in));
    void* x2 = b.Acts(RandomActivations(static_cast<size_t>(n) * in));
    void* y = b.Poisoned(static_cast<size_t>(n) * w.out);
    void* direct = b.Poisoned(static_cast<size_t>(n) * w.out);
    std::vector<int32_t> ids(n);
    for (int t = 0; t < n; ++t) ids[t] = t;
    const auto* rows = static_cast<const int32_t*>(b.Ints(ids));
    // Anything the first call sets up (the GEMM's plan) is made outside the capture.
    gpu_->Linear(x, n, *packed, y);
    ASSERT_TRUE(gpu_->Synchronize().ok()) << gpu_->last_error();
    ASSERT_TRUE(gpu_->BeginCapture().ok());
    gpu_->Linear(x, n, *packed, y);
    const absl::StatusOr<int> graph = gpu_->EndCapture();
    ASSERT_TRUE(graph.ok()) << graph.status();
    // New inputs in x (x2's rows copied over), then the replay; against a direct call on
    // x2 (the same alignment, so the same GEMM plan).
    gpu_->GatherRows(x2, in, rows, n, x);
    gpu_->Replay(*graph);
    gpu_->Linear(x2, n, *packed, direct);
    const std::vector<float> got = b.Read(y, static_cast<size_t>(n) * w.out);
    const std::vector<float> want = b.Read(direct, static_cast<size_t>(n) * w.out);
    const size_t mismatches = Mismatches(got, want);
    ReportMetric(Name("quant_graph_replay_n" + std::to_string(n)), dtype().name,
                 mismatches == 0 ? 0.0 : INFINITY, 0.0);
    EXPECT_EQ(mismatches, 0u) << "n=" << n;
    gpu_->DropGraphs();
  }
}

TEST_P(CudaQuantLinearTest, RefusesBadShapesAndStoresFewerBytesThanBf16) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int block = QuantBlockElements(type());
  const std::vector<uint8_t> blocks = RandomBlocks(type(), 4, 2 * block, rng_);
  const QuantizedRows part{type(), 4, blocks.data()};
  EXPECT_EQ(gpu_->PackLinearQuantized({}, 2 * block, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(gpu_->PackLinearQuantized({&part, 1}, block + 16, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const QuantizedRows no_rows{type(), 0, blocks.data()};
  EXPECT_EQ(gpu_->PackLinearQuantized({&no_rows, 1}, 2 * block, nullptr).status().code(),
            absl::StatusCode::kInvalidArgument);
  const QuantWeight w = MakeWeight({{type(), 256}}, 1024, rng_);
  auto packed = gpu_->PackLinearQuantized(w.parts, w.in, nullptr).value();
  const size_t bf16_bytes = static_cast<size_t>(w.out) * w.in * 2;
  EXPECT_LT(packed->size_bytes(), bf16_bytes * 10 / 16 + 4096);  // At most 10 bits a weight.
  EXPECT_GE(packed->size_bytes(), static_cast<size_t>(w.out) * w.in / 2);
}

std::string QuantParamName(const ::testing::TestParamInfo<QuantParam>& info) {
  return std::string(std::get<0>(info.param).name) + "_" +
         QuantBlockTypeName(std::get<1>(info.param));
}

INSTANTIATE_TEST_SUITE_P(DtypesAndTypes, CudaQuantLinearTest,
                         ::testing::Combine(::testing::Values(kBf16, kFp16),
                                            ::testing::ValuesIn(kTypes)),
                         QuantParamName);

}  // namespace
}  // namespace conveyor::kernels
