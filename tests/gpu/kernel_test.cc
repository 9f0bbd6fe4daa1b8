// Checks every operation of the CUDA backend against the CPU backend (the numerical
// reference) on fresh random inputs. Inputs are rounded to the compute dtype on the
// host first, so both backends see the same values and the error measures only the
// GPU's arithmetic and output rounding: ||out - ref|| / ||ref||, with bf16 allowed
// 1e-2 and fp16 2e-3; copies must match exactly. Every output buffer is poisoned with
// NaN first, so an element a kernel forgot to write fails the check.
//
// Needs a GPU: every test skips itself where CudaDeviceCount() is 0, except the one
// that checks the backend fails cleanly there. Each check prints a "[ METRIC ]" line
// that tests/gpu/run.sh collects into a table.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cuda/cuda_backend.h"
#include "tests/gpu/gpu_test_util.h"

namespace conveyor::kernels {
namespace {

class CudaKernelTest : public ::testing::TestWithParam<DtypeParam> {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
    CudaBackendOptions options;
    options.dtype = GetParam().dtype;
    absl::StatusOr<std::unique_ptr<CudaBackend>> gpu = MakeCudaBackend(0, options);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    gpu_ = std::move(*gpu);
    cpu_ = MakeCpuBackend(2);
    const unsigned seed = std::random_device()();
    rng_.seed(seed);
    RecordProperty("seed", std::to_string(seed));
    std::printf("[ SEED     ] %u\n", seed);
  }
  void TearDown() override {
    if (gpu_ == nullptr || !expect_no_error_) return;
    EXPECT_TRUE(gpu_->Synchronize().ok()) << gpu_->last_error();
  }

  float Round(float x) const {
    return GetParam().dtype == CudaComputeDtype::kBf16 ? RoundToBf16(x) : RoundToFp16(x);
  }
  // Uniform in [-scale, scale], rounded to the compute dtype.
  std::vector<float> Random(size_t n, float scale) {
    std::uniform_real_distribution<float> dist(-scale, scale);
    std::vector<float> v(n);
    for (float& x : v) x = Round(dist(rng_));
    return v;
  }
  std::vector<int32_t> RandomInts(size_t n, int32_t below) {
    std::uniform_int_distribution<int32_t> dist(0, below - 1);
    std::vector<int32_t> v(n);
    for (int32_t& x : v) x = dist(rng_);
    return v;
  }
  // Checks and reports `out` against the CPU's `ref`, as a whole (L2) and row by row
  // (max error), rows of `width` elements.
  void ExpectClose(const std::string& check, const std::vector<float>& out,
                   const std::vector<float>& ref, size_t width) {
    const double error = RelativeError(out, ref);
    const double row_error = RowMaxError(out, ref, width);
    ReportMetric(check, GetParam().name, error, GetParam().tolerance, row_error,
                 GetParam().row_tolerance);
    EXPECT_LE(error, GetParam().tolerance) << check;
    EXPECT_LE(row_error, GetParam().row_tolerance) << check << " (worst row's max error)";
  }
  void ExpectExact(const std::string& check, const std::vector<float>& out,
                   const std::vector<float>& ref) {
    const size_t mismatches = Mismatches(out, ref);
    ReportMetric(check, GetParam().name, mismatches == 0 ? 0.0 : INFINITY, 0.0);
    EXPECT_EQ(mismatches, 0u) << check;
  }

  std::unique_ptr<CudaBackend> gpu_;
  std::unique_ptr<Backend> cpu_;
  std::mt19937 rng_;
  bool expect_no_error_ = true;
};

TEST_P(CudaKernelTest, UploadAndCopyBackRoundsToComputeDtype) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  std::uniform_real_distribution<float> dist(-100.0f, 100.0f);
  std::vector<float> host(100003);
  for (float& x : host) x = dist(rng_);
  std::vector<float> rounded(host.size());
  std::transform(host.begin(), host.end(), rounded.begin(), [&](float x) { return Round(x); });
  Buffers gpu(gpu_.get());
  ExpectExact("upload_copy_back", gpu.Read(gpu.Acts(host), host.size()), rounded);
}

TEST_P(CudaKernelTest, EmbeddingAndGatherRowsCopyRows) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  // 256 and 200 take the 16-byte path, 100 the element path.
  for (int hidden : {256, 200, 100}) {
    const int vocab = 500, n = 37, n_rows = 9;
    const std::vector<float> table = Random(static_cast<size_t>(vocab) * hidden, 1.0f);
    const std::vector<int32_t> ids = RandomInts(n, vocab);
    const std::vector<int32_t> rows = RandomInts(n_rows, n);
    auto run = [&](Buffers& b, bool gather) {
      void* out = b.Poisoned(static_cast<size_t>(n) * hidden);
      b.backend().Embedding(b.Acts(table), hidden, static_cast<const int32_t*>(b.Ints(ids)), n,
                            out);
      if (!gather) return b.Read(out, static_cast<size_t>(n) * hidden);
      void* gathered = b.Poisoned(static_cast<size_t>(n_rows) * hidden);
      b.backend().GatherRows(out, hidden, static_cast<const int32_t*>(b.Ints(rows)), n_rows,
                             gathered);
      return b.Read(gathered, static_cast<size_t>(n_rows) * hidden);
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    const std::string suffix = "_h" + std::to_string(hidden);
    ExpectExact("embedding" + suffix, run(gpu, false), run(cpu, false));
    ExpectExact("gather_rows" + suffix, run(gpu, true), run(cpu, true));
  }
}

TEST_P(CudaKernelTest, RmsNormMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const auto& [rows, width] :
       std::vector<std::pair<int, int>>{{1, 4096}, {13, 64}, {7, 100}, {33, 768}}) {
    const int n = rows, hidden = width;  // Named copies: lambdas below capture them.
    const size_t count = static_cast<size_t>(n) * hidden;
    const std::vector<float> x = Random(count, 2.0f);
    std::vector<float> weight(hidden);
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (float& w : weight) w = dist(rng_);
    auto run = [&](Buffers& b) {
      void* out = b.Poisoned(count);
      b.backend().RmsNorm(b.Acts(x), b.F32(weight), n, hidden, 1e-5f, out);
      return b.Read(out, count);
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    ExpectClose("rms_norm_n" + std::to_string(n) + "_h" + std::to_string(hidden), run(gpu),
                run(cpu), hidden);
  }
}

TEST_P(CudaKernelTest, AddRmsNormMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const auto& [rows, width] :
       std::vector<std::pair<int, int>>{{1, 4096}, {9, 64}, {5, 100}, {21, 768}}) {
    const int n = rows, hidden = width;  // Named copies: lambdas below capture them.
    const size_t count = static_cast<size_t>(n) * hidden;
    const std::vector<float> residual = Random(count, 2.0f);
    const std::vector<float> x = Random(count, 1.0f);
    std::vector<float> weight(hidden);
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (float& w : weight) w = dist(rng_);
    auto run = [&](Buffers& b) {
      void* res = b.Acts(residual);
      void* out = b.Poisoned(count);
      b.backend().AddRmsNorm(res, b.Acts(x), b.F32(weight), n, hidden, 1e-5f, out);
      return std::make_pair(b.Read(out, count), b.Read(res, count));
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    const auto [gpu_out, gpu_res] = run(gpu);
    const auto [cpu_out, cpu_res] = run(cpu);
    const std::string suffix = "_n" + std::to_string(n) + "_h" + std::to_string(hidden);
    ExpectClose("add_rms_norm_out" + suffix, gpu_out, cpu_out, hidden);
    ExpectClose("add_rms_norm_residual" + suffix, gpu_res, cpu_res, hidden);
  }
}

TEST_P(CudaKernelTest, LinearMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int n, out, in;
  };
  // in = 130 gives rows that are only 4-byte aligned: cuBLASLt must cope or fall back.
  for (const Shape s : {Shape{1, 96, 64}, Shape{7, 1000, 512}, Shape{64, 384, 768},
                        Shape{300, 50, 130}, Shape{5, 4096, 1024}}) {
    for (bool with_bias : {false, true}) {
      const std::vector<float> x = Random(static_cast<size_t>(s.n) * s.in, 1.0f);
      const std::vector<float> w =
          Random(static_cast<size_t>(s.out) * s.in, 1.0f / std::sqrt(static_cast<float>(s.in)));
      const std::vector<float> bias = Random(s.out, 0.5f);
      auto run = [&](Buffers& b) {
        auto packed = b.backend()
                          .PackLinear(w.data(), s.out, s.in, with_bias ? bias.data() : nullptr)
                          .value();
        EXPECT_EQ(packed->out_features(), s.out);
        EXPECT_EQ(packed->in_features(), s.in);
        void* out = b.Poisoned(static_cast<size_t>(s.n) * s.out);
        b.backend().Linear(b.Acts(x), s.n, *packed, out);
        return b.Read(out, static_cast<size_t>(s.n) * s.out);
      };
      Buffers gpu(gpu_.get()), cpu(cpu_.get());
      ExpectClose("linear_" + std::to_string(s.n) + "x" + std::to_string(s.out) + "x" +
                      std::to_string(s.in) + (with_bias ? "_bias" : ""),
                  run(gpu), run(cpu), s.out);
    }
  }
}

TEST_P(CudaKernelTest, RopeMatchesCpuAndLeavesValuesAlone) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int heads, kv_heads, head_dim;
  };
  for (const Shape s : {Shape{4, 2, 64}, Shape{4, 2, 16}, Shape{32, 8, 128}}) {
    const int n = 11, max_positions = 4096, half = s.head_dim / 2;
    const int stride = (s.heads + 2 * s.kv_heads) * s.head_dim;
    std::vector<float> table(2 * static_cast<size_t>(max_positions) * half);
    for (int p = 0; p < max_positions; ++p) {
      for (int i = 0; i < half; ++i) {
        const double angle = p / std::pow(10000.0, 2.0 * i / s.head_dim);
        table[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
        table[(static_cast<size_t>(max_positions) + p) * half + i] =
            static_cast<float>(std::sin(angle));
      }
    }
    const std::vector<float> qkv = Random(static_cast<size_t>(n) * stride, 1.0f);
    const std::vector<int32_t> positions = RandomInts(n, max_positions);
    AttentionShape shape;
    shape.num_heads = s.heads;
    shape.num_kv_heads = s.kv_heads;
    shape.head_dim = s.head_dim;
    auto run = [&](Buffers& b) {
      char* q = static_cast<char*>(b.Acts(qkv));
      void* k = q + static_cast<size_t>(s.heads) * s.head_dim * b.backend().activation_bytes();
      b.backend().Rope(q, k, n, stride, static_cast<const int32_t*>(b.Ints(positions)),
                       b.F32(table), max_positions, shape);
      return b.Read(q, qkv.size());
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    const std::vector<float> gpu_out = run(gpu);
    const std::vector<float> cpu_out = run(cpu);
    ExpectClose("rope_h" + std::to_string(s.heads) + "_kv" + std::to_string(s.kv_heads) + "_d" +
                    std::to_string(s.head_dim),
                gpu_out, cpu_out, s.head_dim);
    // The V part of each row must be untouched.
    size_t v_changed = 0;
    for (int t = 0; t < n; ++t) {
      for (int i = (s.heads + s.kv_heads) * s.head_dim; i < stride; ++i) {
        const size_t at = static_cast<size_t>(t) * stride + i;
        v_changed += gpu_out[at] != qkv[at];
      }
    }
    EXPECT_EQ(v_changed, 0u);
  }
}

TEST_P(CudaKernelTest, WriteKvFillsExactlyTheMappedSlots) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int heads, kv_heads, head_dim;
  };
  // The second shape's slot width (20) is not a multiple of 8: the element path.
  for (const Shape s : {Shape{8, 2, 64}, Shape{2, 1, 20}}) {
    const int n = 10, num_slots = 96;
    const int stride = (s.heads + 2 * s.kv_heads) * s.head_dim;
    const size_t slot_elems = static_cast<size_t>(s.kv_heads) * s.head_dim;
    std::vector<int32_t> all_slots(num_slots);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    std::shuffle(all_slots.begin(), all_slots.end(), rng_);
    const std::vector<int32_t> slots(all_slots.begin(), all_slots.begin() + n);
    const std::vector<float> qkv = Random(static_cast<size_t>(n) * stride, 1.0f);
    AttentionShape shape;
    shape.num_heads = s.heads;
    shape.num_kv_heads = s.kv_heads;
    shape.head_dim = s.head_dim;
    constexpr int kBlockSize = 16;  // num_slots is a whole number of blocks.
    // The caches in slot order, [num_slots, kv_heads, head_dim], K then V. The CUDA
    // backend keeps them so; the CPU backend's layout (K transposed per block) is
    // translated.
    auto run = [&](Buffers& b, bool cpu_layout) {
      const size_t e = b.backend().activation_bytes();
      char* base = static_cast<char*>(b.Acts(qkv));
      KvLayer layer{b.Poisoned(num_slots * slot_elems), b.Poisoned(num_slots * slot_elems),
                    kBlockSize};
      b.backend().WriteKv(base + static_cast<size_t>(s.heads) * s.head_dim * e,
                          base + static_cast<size_t>(s.heads + s.kv_heads) * s.head_dim * e, n,
                          stride, static_cast<const int32_t*>(b.Ints(slots)), shape, layer);
      const std::vector<float> k = b.Read(layer.k, num_slots * slot_elems);
      const std::vector<float> v = b.Read(layer.v, num_slots * slot_elems);
      if (!cpu_layout) {
        std::vector<float> caches = k;
        caches.insert(caches.end(), v.begin(), v.end());
        return caches;
      }
      const internal::CpuKvLayout layout{s.kv_heads, s.head_dim, kBlockSize};
      std::vector<float> caches(2 * num_slots * slot_elems);
      for (int slot = 0; slot < num_slots; ++slot) {
        for (int h = 0; h < s.kv_heads; ++h) {
          for (int c = 0; c < s.head_dim; ++c) {
            const size_t at = (static_cast<size_t>(slot) * s.kv_heads + h) * s.head_dim + c;
            caches[at] = k[layout.K(slot, h, c)];
            caches[num_slots * slot_elems + at] = v[layout.V(slot, h, c)];
          }
        }
      }
      return caches;
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    ExpectExact("write_kv_kv" + std::to_string(s.kv_heads) + "_d" + std::to_string(s.head_dim),
                run(gpu, false), run(cpu, true));
  }
}

TEST_P(CudaKernelTest, SiluMulMatchesCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (int ffn : {352, 100, 14336}) {
    const int n = 9;
    const std::vector<float> gate_up = Random(static_cast<size_t>(n) * 2 * ffn, 4.0f);
    auto run = [&](Buffers& b) {
      void* out = b.Poisoned(static_cast<size_t>(n) * ffn);
      b.backend().SiluMul(b.Acts(gate_up), n, ffn, out);
      return b.Read(out, static_cast<size_t>(n) * ffn);
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    ExpectClose("silu_mul_ffn" + std::to_string(ffn), run(gpu), run(cpu), ffn);
  }
}

TEST_P(CudaKernelTest, HeadRmsNormMatchesCpuAndLeavesTheRestAlone) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  struct Shape {
    int heads, head_dim, row_stride;  // Heads normalised at the front of wider rows.
  };
  for (const Shape s : {Shape{32, 128, 48 * 128}, Shape{3, 64, 5 * 64}, Shape{2, 40, 100}}) {
    const int n = 11;
    const std::vector<float> x = Random(static_cast<size_t>(n) * s.row_stride, 3.0f);
    std::vector<float> weight(s.head_dim);
    std::uniform_real_distribution<float> dist(0.5f, 1.5f);
    for (float& w : weight) w = dist(rng_);
    auto run = [&](Buffers& b) {
      void* rows = b.Acts(x);
      b.backend().HeadRmsNorm(rows, n, s.row_stride, s.heads, s.head_dim, b.F32(weight), 1e-6f);
      return b.Read(rows, x.size());
    };
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    const std::vector<float> out = run(gpu), ref = run(cpu);
    ExpectClose("head_rms_norm_h" + std::to_string(s.heads) + "_d" + std::to_string(s.head_dim),
                out, ref, s.row_stride);
    // Per row: the normalised heads within tolerance, every element after them untouched.
    std::vector<float> tail_out, tail_in;
    for (int t = 0; t < n; ++t) {
      const size_t begin = static_cast<size_t>(t) * s.row_stride + s.heads * s.head_dim;
      const size_t end = static_cast<size_t>(t + 1) * s.row_stride;
      tail_out.insert(tail_out.end(), out.begin() + begin, out.begin() + end);
      tail_in.insert(tail_in.end(), x.begin() + begin, x.begin() + end);
    }
    ExpectExact("head_rms_norm_untouched_d" + std::to_string(s.head_dim), tail_out, tail_in);
  }
}

// An MoE layer's expert path: rows gathered by expert, a grouped GEMM over experts with
// 0, 1 and many rows each, and the weighted sum of each token's k rows.
TEST_P(CudaKernelTest, GroupedLinearAndWeightedRowSumMatchCpu) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const int in = 256, out_width = 96, n = 13, k = 3;
  const std::vector<int> offsets = {0, 0, 1, 7, 7, 39};  // 5 experts, 39 = n * k rows.
  const int groups = static_cast<int>(offsets.size()) - 1;
  const int rows = offsets.back();
  const std::vector<float> x = Random(static_cast<size_t>(rows) * in, 1.0f);
  std::vector<std::vector<float>> weights(groups);
  for (std::vector<float>& w : weights) w = Random(static_cast<size_t>(out_width) * in, 1.0f / 16);
  std::vector<int32_t> sources(rows);
  std::iota(sources.begin(), sources.end(), 0);
  std::shuffle(sources.begin(), sources.end(), rng_);
  std::vector<float> mix(rows);
  std::uniform_real_distribution<float> dist(0.0f, 1.0f);
  for (float& w : mix) w = dist(rng_);
  auto run = [&](Buffers& b) {
    std::vector<std::unique_ptr<LinearWeight>> packed;
    std::vector<const LinearWeight*> pointers;
    for (const auto& w : weights) {
      packed.push_back(b.backend().PackLinear(w.data(), out_width, in, nullptr).value());
      pointers.push_back(packed.back().get());
    }
    void* y = b.Poisoned(static_cast<size_t>(rows) * out_width);
    b.backend().GroupedLinear(b.Acts(x), pointers.data(), offsets.data(), groups, y);
    void* sum = b.Poisoned(static_cast<size_t>(n) * out_width);
    b.backend().WeightedRowSum(y, out_width, static_cast<const int32_t*>(b.Ints(sources)),
                               static_cast<const float*>(b.F32(mix)), n, k, sum);
    return std::make_pair(b.Read(y, static_cast<size_t>(rows) * out_width),
                          b.Read(sum, static_cast<size_t>(n) * out_width));
  };
  Buffers gpu(gpu_.get()), cpu(cpu_.get());
  const auto [gpu_rows, gpu_sum] = run(gpu);
  const auto [cpu_rows, cpu_sum] = run(cpu);
  ExpectClose("grouped_linear", gpu_rows, cpu_rows, out_width);
  ExpectClose("weighted_row_sum", gpu_sum, cpu_sum, out_width);
}

// --- Paged attention ------------------------------------------------------------------

// One sequence of an attention batch: `context` positions in the cache after this step,
// of which the last `new_tokens` are query tokens of the batch (a prefill chunk with a
// cached prefix when new_tokens > 1 and < context, a decode token when 1).
struct SeqSpec {
  int context;
  int new_tokens;
};

struct AttentionCase {
  std::string name;
  int num_heads, num_kv_heads, head_dim, block_size;
  std::vector<SeqSpec> seqs;
};

// Host inputs of one attention batch: metadata, q rows strided like the fused qkv
// buffer, and K/V caches random in every slot (so reading a wrong slot shows).
struct AttentionInputs {
  std::vector<int32_t> token_seq, token_pos, block_tables;
  int max_blocks_per_seq = 0;
  int num_slots = 0;
  int q_row_stride = 0;
  std::vector<float> q, k_cache, v_cache;
  int num_tokens() const { return static_cast<int>(token_seq.size()); }
};

class CudaAttentionTest : public CudaKernelTest {
 protected:
  AttentionInputs MakeInputs(const AttentionCase& c) {
    AttentionInputs in;
    std::vector<int> blocks_needed;
    int total_blocks = 0;
    for (const SeqSpec& s : c.seqs) {
      blocks_needed.push_back((s.context + c.block_size - 1) / c.block_size);
      total_blocks += blocks_needed.back();
      in.max_blocks_per_seq = std::max(in.max_blocks_per_seq, blocks_needed.back());
    }
    in.max_blocks_per_seq += 1;  // A padding column, as the worker's tables have.
    // Scattered blocks: a random permutation of more blocks than needed.
    const int pool = total_blocks + 7;
    std::vector<int32_t> ids(pool);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    in.block_tables.assign(c.seqs.size() * in.max_blocks_per_seq, 0);
    int next = 0;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      for (int j = 0; j < blocks_needed[s]; ++j) {
        in.block_tables[s * in.max_blocks_per_seq + j] = ids[next++];
      }
    }
    in.num_slots = pool * c.block_size;
    // Query tokens in a shuffled order: nothing may assume a sequence's tokens are
    // contiguous or sorted.
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      for (int p = c.seqs[s].context - c.seqs[s].new_tokens; p < c.seqs[s].context; ++p) {
        in.token_seq.push_back(static_cast<int32_t>(s));
        in.token_pos.push_back(p);
      }
    }
    std::vector<int> order(in.token_seq.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng_);
    std::vector<int32_t> seq(order.size()), pos(order.size());
    for (size_t i = 0; i < order.size(); ++i) {
      seq[i] = in.token_seq[order[i]];
      pos[i] = in.token_pos[order[i]];
    }
    in.token_seq = std::move(seq);
    in.token_pos = std::move(pos);
    in.q_row_stride = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim;
    in.q = Random(static_cast<size_t>(in.num_tokens()) * in.q_row_stride, 1.0f);
    const size_t cache_elems = static_cast<size_t>(in.num_slots) * c.num_kv_heads * c.head_dim;
    // K scaled so scores span a few units: softmax neither flat nor one-hot.
    in.k_cache = Random(cache_elems, 2.0f);
    in.v_cache = Random(cache_elems, 1.0f);
    return in;
  }

  // Runs PagedAttention on `b` over the tokens `tokens` of `in` (all when empty).
  static std::vector<float> Run(Buffers& b, const AttentionCase& c, const AttentionInputs& in,
                                const std::vector<int>& tokens = {}) {
    std::vector<int32_t> seq, pos;
    std::vector<float> q;
    for (int t = 0; t < in.num_tokens(); ++t) {
      if (!tokens.empty() && std::find(tokens.begin(), tokens.end(), t) == tokens.end()) continue;
      seq.push_back(in.token_seq[t]);
      pos.push_back(in.token_pos[t]);
      q.insert(q.end(), in.q.begin() + static_cast<size_t>(t) * in.q_row_stride,
               in.q.begin() + static_cast<size_t>(t + 1) * in.q_row_stride);
    }
    const int n = static_cast<int>(seq.size());
    AttentionBatch batch;
    batch.num_tokens = n;
    batch.token_seq = static_cast<const int32_t*>(b.Ints(seq));
    batch.token_pos = static_cast<const int32_t*>(b.Ints(pos));
    batch.slot_mapping = nullptr;  // Attention does not read it.
    batch.num_seqs = static_cast<int>(c.seqs.size());
    batch.block_tables = static_cast<const int32_t*>(b.Ints(in.block_tables));
    batch.max_blocks_per_seq = in.max_blocks_per_seq;
    batch.block_size = c.block_size;
    AttentionShape shape;
    shape.num_heads = c.num_heads;
    shape.num_kv_heads = c.num_kv_heads;
    shape.head_dim = c.head_dim;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    // The caches filled as the worker fills them, through the backend's own WriteKv (each
    // backend has its own layout): every slot, from the host arrays in slot order.
    const size_t slot_elems = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
    const KvLayer layer{b.Poisoned(in.k_cache.size()), b.Poisoned(in.v_cache.size()), c.block_size};
    std::vector<int32_t> all_slots(in.num_slots);
    std::iota(all_slots.begin(), all_slots.end(), 0);
    b.backend().WriteKv(b.Acts(in.k_cache), b.Acts(in.v_cache), in.num_slots,
                        static_cast<int>(slot_elems),
                        static_cast<const int32_t*>(b.Ints(all_slots)), shape, layer);
    const size_t out_elems = static_cast<size_t>(n) * c.num_heads * c.head_dim;
    void* out = b.Poisoned(out_elems);
    b.backend().PagedAttention(b.Acts(q), in.q_row_stride, batch, shape, layer, out);
    return b.Read(out, out_elems);
  }

  static std::vector<AttentionCase> Cases() {
    return {
        // Decode only, GQA group 4, contexts across 1, 2 and 3 partitions.
        {"decode_gqa4_d128", 8, 2, 128, 16, {{1, 1}, {17, 1}, {100, 1}, {513, 1}, {1500, 1}}},
        // The worker's mixed step: a prefill chunk over a cached prefix (60 cached, 40
        // new), a fresh prefill, and decode tokens of other sequences. Group 3.
        {"mixed_prefill_decode_g3_d64", 12, 4, 64, 16, {{100, 40}, {700, 1}, {33, 1}, {5, 5}}},
        // Long context (10 partitions) and a chunk whose contexts (1023..1026) cross the
        // edge from 2 to 3 partitions, the last one holding 1 position; group 8.
        {"long_split_g8_d128", 16, 2, 128, 32, {{5000, 1}, {1026, 4}}},
        // The tiny test model's shape (head_dim 16).
        {"tiny_d16", 4, 2, 16, 16, {{40, 8}, {9, 1}}},
        // Multi-head (group 1), head_dim 256, small blocks.
        {"mha_d256_bs8", 4, 4, 256, 8, {{600, 2}, {3, 1}}},
        // Group 6 (2 heads per block), head_dim 96 (lanes past 96 idle).
        {"g6_d96", 12, 2, 96, 16, {{520, 1}, {64, 16}}},
    };
  }
};

TEST_P(CudaAttentionTest, MatchesCpuOnMixedBatches) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const AttentionCase& c : Cases()) {
    const AttentionInputs in = MakeInputs(c);
    Buffers gpu(gpu_.get()), cpu(cpu_.get());
    ExpectClose("attention_" + c.name, Run(gpu, c, in), Run(cpu, c, in), c.head_dim);
  }
}

TEST_P(CudaAttentionTest, TokenResultDoesNotDependOnTheBatch) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  for (const AttentionCase& c : Cases()) {
    const AttentionInputs in = MakeInputs(c);
    Buffers gpu(gpu_.get());
    const std::vector<float> batched = Run(gpu, c, in);
    const size_t row = static_cast<size_t>(c.num_heads) * c.head_dim;
    size_t mismatches = 0;
    for (int t = 0; t < in.num_tokens(); ++t) {
      const std::vector<float> alone = Run(gpu, c, in, {t});
      const std::vector<float> in_batch(batched.begin() + t * row, batched.begin() + (t + 1) * row);
      mismatches += Mismatches(alone, in_batch);
    }
    ReportMetric("attention_invariance_" + c.name, GetParam().name,
                 mismatches == 0 ? 0.0 : INFINITY, 0.0);
    EXPECT_EQ(mismatches, 0u) << c.name;
  }
}

TEST_P(CudaAttentionTest, ScratchSizedLaunchesGiveTheSameBits) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  // 40 decode tokens with contexts up to 3000: their partials (~50 KB each) need
  // several launches with a 1 MiB scratch and one with the default.
  AttentionCase c{"many_long_decodes", 16, 2, 128, 32, {}};
  std::uniform_int_distribution<int> context(1, 3000);
  for (int s = 0; s < 40; ++s) c.seqs.push_back({context(rng_), 1});
  const AttentionInputs in = MakeInputs(c);
  CudaBackendOptions small;
  small.dtype = GetParam().dtype;
  small.scratch_bytes = size_t{1} << 20;
  std::unique_ptr<CudaBackend> small_gpu = MakeCudaBackend(0, small).value();
  std::vector<float> chunked;
  {
    Buffers b(small_gpu.get());
    chunked = Run(b, c, in);
  }
  EXPECT_TRUE(small_gpu->last_error().ok()) << small_gpu->last_error();
  Buffers gpu(gpu_.get()), cpu(cpu_.get());
  const std::vector<float> whole = Run(gpu, c, in);
  ExpectExact("attention_chunked_launches", chunked, whole);
  ExpectClose("attention_" + c.name, whole, Run(cpu, c, in), c.head_dim);
}

// --- Errors and edge cases ------------------------------------------------------------

TEST_P(CudaKernelTest, UnsupportedAttentionShapeIsRecorded) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  expect_no_error_ = false;
  Buffers gpu(gpu_.get());
  const std::vector<int32_t> zeros(4, 0);
  AttentionBatch batch;
  batch.num_tokens = 1;
  batch.token_seq = static_cast<const int32_t*>(gpu.Ints(zeros));
  batch.token_pos = batch.token_seq;
  batch.num_seqs = 1;
  batch.block_tables = batch.token_seq;
  batch.max_blocks_per_seq = 1;
  batch.block_size = 16;
  AttentionShape shape;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.head_dim = 264;  // Over kMaxAttentionHeadDim.
  void* buffer = gpu.Poisoned(16 * 264 * 2);
  gpu_->PagedAttention(buffer, 2 * 264, batch, shape, KvLayer{buffer, buffer, batch.block_size},
                       buffer);
  EXPECT_EQ(gpu_->Synchronize().code(), absl::StatusCode::kInvalidArgument) << gpu_->last_error();
}

TEST_P(CudaKernelTest, EmptyBatchesLaunchNothing) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  Buffers gpu(gpu_.get());
  void* buffer = gpu.Poisoned(1024);
  const std::vector<float> weight(64, 1.0f);
  void* w = gpu.F32(weight);
  const auto* ints = static_cast<const int32_t*>(gpu.Ints({0, 0, 0, 0}));
  AttentionShape shape;
  shape.num_heads = 2;
  shape.num_kv_heads = 1;
  shape.head_dim = 32;
  AttentionBatch batch;
  batch.num_tokens = 0;
  auto linear = gpu_->PackLinear(weight.data(), 8, 8, nullptr).value();
  gpu_->Embedding(buffer, 64, ints, 0, buffer);
  gpu_->RmsNorm(buffer, w, 0, 64, 1e-5f, buffer);
  gpu_->AddRmsNorm(buffer, buffer, w, 0, 64, 1e-5f, buffer);
  gpu_->Linear(buffer, 0, *linear, buffer);
  gpu_->Rope(buffer, buffer, 0, 128, ints, w, 1, shape);
  gpu_->WriteKv(buffer, buffer, 0, 128, ints, shape, KvLayer{buffer, buffer, 16});
  gpu_->PagedAttention(buffer, 128, batch, shape, KvLayer{buffer, buffer, 16}, buffer);
  gpu_->SiluMul(buffer, 0, 64, buffer);
  gpu_->GatherRows(buffer, 64, ints, 0, buffer);
  gpu_->CopyActivationsToHost(nullptr, buffer, 0);
  EXPECT_TRUE(gpu_->Synchronize().ok()) << gpu_->last_error();
}

TEST_P(CudaKernelTest, FreeMemoryShrinksWhenAllocating) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  const size_t before = FreeDeviceMemoryBytes(0).value();
  constexpr size_t kBytes = size_t{1} << 30;
  BackendBuffer buffer = AllocateBuffer(gpu_.get(), kBytes).value();
  const size_t after = FreeDeviceMemoryBytes(0).value();
  EXPECT_GT(before, after);
  EXPECT_GE(before - after, kBytes / 2);
  // Asking for more than the device has is an error value, not a crash.
  EXPECT_EQ(gpu_->Allocate(before * 4).status().code(), absl::StatusCode::kResourceExhausted);
}

// A failure reported from another thread (a communicator whose peer died) is what the
// next Synchronize returns, and stays; the first report wins.
TEST_P(CudaKernelTest, ReportedFailureIsReturnedFromThen) {
  if (CudaDeviceCount() == 0) GTEST_SKIP() << "no CUDA device";
  expect_no_error_ = false;
  ASSERT_TRUE(gpu_->Synchronize().ok());
  std::thread reporter([&] { gpu_->ReportFailure(absl::UnavailableError("peer 1 is gone")); });
  reporter.join();
  gpu_->ReportFailure(absl::InternalError("a later report"));
  const absl::Status synced = gpu_->Synchronize();
  EXPECT_EQ(synced.code(), absl::StatusCode::kUnavailable) << synced;
  EXPECT_EQ(synced.message(), "peer 1 is gone");
  EXPECT_EQ(gpu_->last_error(), synced);
  EXPECT_EQ(gpu_->Synchronize(), synced);
}

TEST(CudaBackendWithoutDevice, FailsCleanly) {
  if (CudaDeviceCount() > 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_EQ(MakeCudaBackend(0).status().code(), absl::StatusCode::kUnavailable);
  EXPECT_FALSE(FreeDeviceMemoryBytes().ok());
}

std::string DtypeName(const ::testing::TestParamInfo<DtypeParam>& info) { return info.param.name; }

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKernelTest, ::testing::Values(kBf16, kFp16), DtypeName);
INSTANTIATE_TEST_SUITE_P(Dtypes, CudaAttentionTest, ::testing::Values(kBf16, kFp16), DtypeName);

}  // namespace
}  // namespace conveyor::kernels
