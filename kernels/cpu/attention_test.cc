#include "kernels/cpu/attention.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <ostream>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/cpu_kernels.h"
#include "kernels/cpu/gemm_kernels.h"  // ToBf16, FromBf16
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace {

constexpr int kNumKvHeads = 2;

internal::AttentionTileKernel KernelOf(CpuIsa isa) {
  return internal::CpuKernelsFor(isa).attention_tile;
}

struct Param {
  CpuIsa isa;
  int group;  // Query heads per KV head.
  int head_dim;
  int block_size;
  CpuKvDtype kv = CpuKvDtype::kF32;
};

std::string ToString(const Param& p) {
  return std::string(CpuIsaName(p.isa)) + "_Group" + std::to_string(p.group) + "_Dim" +
         std::to_string(p.head_dim) + "_Block" + std::to_string(p.block_size) +
         (p.kv == CpuKvDtype::kBf16 ? "_Bf16Kv" : "");
}
std::string Name(const testing::TestParamInfo<Param>& info) { return ToString(info.param); }
void PrintTo(const Param& p, std::ostream* os) { *os << ToString(p); }

// A token of the batch: sequence index and position.
struct Token {
  int seq;
  int pos;
};

// Sequences in a paged cache whose blocks are scattered in shuffled order. Slots no
// sequence has written hold NaN, so a kernel that reads past a token's context (or
// multiplies unwritten V by a zero weight) produces NaN. With a bf16 cache the values are
// rounded to bf16 first, and the reference uses the rounded values.
class PagedFixture {
 public:
  // `lengths[s]`: positions of sequence s whose K/V are written.
  PagedFixture(const Param& p, const std::vector<int>& lengths, uint32_t seed)
      : param_(p), lengths_(lengths), rng_(seed) {
    shape_.num_kv_heads = kNumKvHeads;
    shape_.num_heads = kNumKvHeads * p.group;
    shape_.head_dim = p.head_dim;
    shape_.scale = 1.0f / std::sqrt(static_cast<float>(p.head_dim));
    slot_floats_ = static_cast<size_t>(kNumKvHeads) * p.head_dim;
    for (int len : lengths) max_blocks_ = std::max(max_blocks_, Blocks(len));
    int num_blocks = 3;  // Spare blocks nobody owns.
    for (int len : lengths) num_blocks += Blocks(len);
    std::vector<int32_t> ids(num_blocks);
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng_);
    tables_.assign(lengths.size() * max_blocks_, -1);
    size_t next = 0;
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int b = 0; b < Blocks(lengths[s]); ++b) tables_[s * max_blocks_ + b] = ids[next++];
    }
    const size_t cache_floats = static_cast<size_t>(num_blocks) * p.block_size * slot_floats_;
    k_.assign(cache_floats, NAN);
    v_.assign(cache_floats, NAN);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    layout_ = {kNumKvHeads, p.head_dim, p.block_size};
    for (size_t s = 0; s < lengths.size(); ++s) {
      for (int pos = 0; pos < lengths[s]; ++pos) {
        for (int h = 0; h < kNumKvHeads; ++h) {
          for (int c = 0; c < p.head_dim; ++c) {
            k_[layout_.K(Slot(s, pos), h, c)] = dist(rng_);
            v_[layout_.V(Slot(s, pos), h, c)] = dist(rng_);
          }
        }
      }
    }
    if (p.kv == CpuKvDtype::kBf16) {
      for (std::vector<float>* cache : {&k_, &v_}) {
        std::vector<uint16_t>& bits = cache == &k_ ? k_bf16_ : v_bf16_;
        for (float& x : *cache) {
          bits.push_back(internal::ToBf16(x));
          x = internal::FromBf16(bits.back());
        }
      }
    }
  }

  // Random queries for `tokens`, in rows of a wider (qkv-like) buffer, scaled per token
  // from flat to peaked attention so the running max changes often.
  void SetTokens(const std::vector<Token>& tokens) {
    tokens_ = tokens;
    q_stride_ = (shape_.num_heads + 2 * kNumKvHeads) * param_.head_dim;
    q_.assign(tokens.size() * q_stride_, NAN);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    std::uniform_real_distribution<float> scale(0.5f, 12.0f);
    for (size_t t = 0; t < tokens.size(); ++t) {
      const float s = scale(rng_);
      for (int i = 0; i < shape_.num_heads * param_.head_dim; ++i) {
        q_[t * q_stride_ + i] = s * dist(rng_);
      }
    }
  }

  // Output [tokens, num_heads * head_dim] of batch tokens [first, first + count), from
  // the parameter's kernel on `pool`.
  std::vector<float> Run(int first, int count, ThreadPool* pool) const {
    return Compute(first, count, [&](const internal::AttentionArgs& args) {
      internal::PagedAttentionWith(KernelOf(param_.isa), args, pool);
    });
  }

  // The whole batch through Backend::PagedAttention (CPU memory is host memory).
  std::vector<float> RunBackend(Backend* backend) const {
    return Compute(0, num_tokens(), [&](const internal::AttentionArgs& args) {
      backend->PagedAttention(args.q, args.q_row_stride, *args.batch, args.shape,
                              KvLayer{const_cast<void*>(args.k_cache),
                                      const_cast<void*>(args.v_cache), param_.block_size},
                              args.out);
    });
  }

  // The same in double precision, straight from the definition.
  std::vector<double> Reference() const {
    const int d = param_.head_dim, group = param_.group;
    std::vector<double> out(tokens_.size() * RowFloats());
    for (size_t t = 0; t < tokens_.size(); ++t) {
      const Token& tok = tokens_[t];
      for (int h = 0; h < shape_.num_heads; ++h) {
        const float* q = q_.data() + t * q_stride_ + static_cast<size_t>(h) * d;
        const int kv_head = h / group;
        std::vector<double> w(tok.pos + 1);
        for (int j = 0; j <= tok.pos; ++j) {
          double dot = 0.0;
          for (int i = 0; i < d; ++i) {
            dot += static_cast<double>(q[i]) * k_[layout_.K(Slot(tok.seq, j), kv_head, i)];
          }
          w[j] = dot * shape_.scale;
        }
        const double max_w = *std::max_element(w.begin(), w.end());
        double sum = 0.0;
        for (double& x : w) sum += (x = std::exp(x - max_w));
        for (int i = 0; i < d; ++i) {
          double acc = 0.0;
          for (int j = 0; j <= tok.pos; ++j) {
            acc += w[j] * v_[layout_.V(Slot(tok.seq, j), kv_head, i)];
          }
          out[t * RowFloats() + static_cast<size_t>(h) * d + i] = acc / sum;
        }
      }
    }
    return out;
  }

  size_t RowFloats() const { return static_cast<size_t>(shape_.num_heads) * param_.head_dim; }
  int num_tokens() const { return static_cast<int>(tokens_.size()); }

 private:
  template <typename Fn>
  std::vector<float> Compute(int first, int count, Fn&& fn) const {
    std::vector<int32_t> seq, pos;
    for (int t = first; t < first + count; ++t) {
      seq.push_back(tokens_[t].seq);
      pos.push_back(tokens_[t].pos);
    }
    AttentionBatch batch;
    batch.num_tokens = count;
    batch.token_seq = seq.data();
    batch.token_pos = pos.data();
    batch.num_seqs = static_cast<int>(lengths_.size());
    batch.block_tables = tables_.data();
    batch.max_blocks_per_seq = max_blocks_;
    batch.block_size = param_.block_size;
    internal::AttentionArgs args;
    args.q = q_.data() + static_cast<size_t>(first) * q_stride_;
    args.q_row_stride = q_stride_;
    args.batch = &batch;
    args.shape = shape_;
    const bool bf16 = param_.kv == CpuKvDtype::kBf16;
    args.k_cache = bf16 ? static_cast<const void*>(k_bf16_.data()) : k_.data();
    args.v_cache = bf16 ? static_cast<const void*>(v_bf16_.data()) : v_.data();
    args.kv_dtype = param_.kv;
    std::vector<float> out(static_cast<size_t>(count) * RowFloats(), NAN);
    args.out = out.data();
    fn(args);
    return out;
  }

  int Blocks(int len) const { return (len + param_.block_size - 1) / param_.block_size; }
  size_t Slot(size_t seq, int pos) const {
    return static_cast<size_t>(tables_[seq * max_blocks_ + pos / param_.block_size]) *
               param_.block_size +
           pos % param_.block_size;
  }

  Param param_;
  std::vector<int> lengths_;
  std::mt19937 rng_;
  AttentionShape shape_;
  internal::CpuKvLayout layout_;
  size_t slot_floats_ = 0;
  int max_blocks_ = 0;
  std::vector<int32_t> tables_;
  std::vector<float> k_, v_, q_;
  std::vector<uint16_t> k_bf16_, v_bf16_;  // The bf16 cache (bf16 kv); k_, v_ its values.
  std::vector<Token> tokens_;
  int q_stride_ = 0;
};

// A step as a scheduler makes one: decodes of several sequences around a prefill chunk
// over a 1963-token cached prefix and a fresh 64-token prompt, out of position order.
std::vector<Token> MixedStep() {
  std::vector<Token> tokens = {{1, 699}, {2, 0}};
  for (int pos = 1963; pos < 2000; ++pos) tokens.push_back({0, pos});
  tokens.push_back({3, 129});
  for (int pos = 0; pos < 64; ++pos) tokens.push_back({4, pos});
  tokens.push_back({5, 16});
  tokens.push_back({6, 47});
  return tokens;
}
const std::vector<int> kMixedLengths = {2000, 700, 1, 130, 64, 17, 48};

class AttentionTest : public testing::TestWithParam<Param> {
 protected:
  void SetUp() override {
    if (GetParam().isa > DetectedCpuIsa()) {
      GTEST_SKIP() << "CPU cannot run " << CpuIsaName(GetParam().isa);
    }
  }
};

TEST_P(AttentionTest, MatchesDoublePrecisionReference) {
  PagedFixture f(GetParam(), kMixedLengths, 1);
  f.SetTokens(MixedStep());
  ThreadPool pool(2);
  const std::vector<float> out = f.Run(0, f.num_tokens(), &pool);
  const std::vector<double> ref = f.Reference();
  double max_err = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_TRUE(std::isfinite(out[i])) << "element " << i;
    // Outputs average V entries in [-1, 1], so errors are measured against 1.
    max_err = std::max(max_err, std::abs(out[i] - ref[i]) / std::max(1.0, std::abs(ref[i])));
  }
  EXPECT_LT(max_err, 1e-5);
}

// The batch-invariance contract: each token's bits are those it gets computed alone.
TEST_P(AttentionTest, TokenAloneMatchesTokenInMixedBatch) {
  PagedFixture f(GetParam(), kMixedLengths, 2);
  f.SetTokens(MixedStep());
  ThreadPool pool(2);
  const std::vector<float> batched = f.Run(0, f.num_tokens(), &pool);
  const size_t row = f.RowFloats();
  for (int t = 0; t < f.num_tokens(); ++t) {
    const std::vector<float> alone = f.Run(t, 1, nullptr);
    ASSERT_EQ(0, std::memcmp(alone.data(), batched.data() + t * row, row * sizeof(float)))
        << "token " << t;
  }
  // The prefill chunk split into uneven pieces, as chunked prefill would.
  const int chunk_begin = 2, chunk_end = 2 + 37;
  for (int split : {chunk_begin + 1, chunk_begin + 14, chunk_end - 5}) {
    const std::vector<float> head = f.Run(chunk_begin, split - chunk_begin, nullptr);
    const std::vector<float> tail = f.Run(split, chunk_end - split, nullptr);
    ASSERT_EQ(0, std::memcmp(head.data(), batched.data() + chunk_begin * row,
                             head.size() * sizeof(float)))
        << "split " << split;
    ASSERT_EQ(0,
              std::memcmp(tail.data(), batched.data() + split * row, tail.size() * sizeof(float)))
        << "split " << split;
  }
}

TEST_P(AttentionTest, ThreadCountDoesNotChangeBits) {
  PagedFixture f(GetParam(), kMixedLengths, 3);
  f.SetTokens(MixedStep());
  const std::vector<float> one = f.Run(0, f.num_tokens(), nullptr);
  for (int threads : {1, 2, 3}) {
    ThreadPool pool(threads);
    const std::vector<float> out = f.Run(0, f.num_tokens(), &pool);
    EXPECT_EQ(0, std::memcmp(one.data(), out.data(), one.size() * sizeof(float)))
        << threads << " threads";
  }
}

std::vector<Param> Params() {
  std::vector<Param> params;
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512}) {
    for (int group : {1, 2, 4}) {
      for (int head_dim : {64, 128}) params.push_back({isa, group, head_dim, 16});
    }
    // Blocks that do not line up with the kernel's 16-position chunks.
    params.push_back({isa, 3, 64, 5});
    params.push_back({isa, 2, 64, 48});
    // A bf16 cache: chunks in place, gathered, and at a stride of 48.
    params.push_back({isa, 2, 64, 16, CpuKvDtype::kBf16});
    params.push_back({isa, 3, 64, 5, CpuKvDtype::kBf16});
    params.push_back({isa, 4, 128, 48, CpuKvDtype::kBf16});
  }
  // A head_dim the vector kernels do not take (PagedAttentionCpu falls back).
  params.push_back({CpuIsa::kPortable, 2, 40, 16});
  params.push_back({CpuIsa::kPortable, 2, 40, 16, CpuKvDtype::kBf16});
  return params;
}

INSTANTIATE_TEST_SUITE_P(Kernels, AttentionTest, testing::ValuesIn(Params()), Name);

// The two vector kernels run the same operations per lane, so the same bits (first seen
// on a Zen 5): a model's activations do not depend on which of the two a CPU has.
TEST(AttentionKernelsTest, Avx2AndAvx512GiveTheSameBits) {
  if (DetectedCpuIsa() < CpuIsa::kAvx512) GTEST_SKIP() << "CPU has no AVX-512";
  for (CpuKvDtype kv : {CpuKvDtype::kF32, CpuKvDtype::kBf16}) {
    for (int group : {1, 3, 4}) {
      for (int block : {5, 16}) {
        PagedFixture a({CpuIsa::kAvx2, group, 64, block, kv}, kMixedLengths, 6);
        PagedFixture b({CpuIsa::kAvx512, group, 64, block, kv}, kMixedLengths, 6);
        a.SetTokens(MixedStep());
        b.SetTokens(MixedStep());
        const std::vector<float> out_a = a.Run(0, a.num_tokens(), nullptr);
        const std::vector<float> out_b = b.Run(0, b.num_tokens(), nullptr);
        ASSERT_EQ(out_a.size(), out_b.size());
        EXPECT_EQ(std::memcmp(out_a.data(), out_b.data(), out_a.size() * sizeof(float)), 0)
            << "group " << group << ", block " << block << ", " << CpuKvDtypeName(kv) << " KV";
      }
    }
  }
}

// WriteKv puts each token's K and V where CpuKvLayout says (which is where the kernels
// read them) and nowhere else, for block sizes that are and are not multiples of 16; a
// bf16 cache holds each value rounded to nearest even. T: the cache's element.
template <typename T>
void ExpectWriteKvFollowsTheLayout(CpuKvDtype kv) {
  constexpr int kKvHeads = 3, kHeadDim = 32, kHeads = 6, kBlocks = 7;
  const int stride = (kHeads + 2 * kKvHeads) * kHeadDim;
  // All-ones bits: NaN as float32 and as bf16, which no written value is.
  T unwritten;
  std::memset(&unwritten, 0xff, sizeof(T));
  const auto stored = [kv](float x) {
    T bits;
    if (kv == CpuKvDtype::kBf16) {
      const uint16_t b = internal::ToBf16(x);
      std::memcpy(&bits, &b, sizeof(T));
    } else {
      std::memcpy(&bits, &x, sizeof(T));
    }
    return bits;
  };
  for (int block_size : {16, 5, 48}) {
    const int num_slots = kBlocks * block_size;
    const size_t cache_elems = static_cast<size_t>(num_slots) * kKvHeads * kHeadDim;
    std::vector<int32_t> slots(num_slots);
    std::iota(slots.begin(), slots.end(), 0);
    std::mt19937 rng(block_size);
    std::shuffle(slots.begin(), slots.end(), rng);
    slots.resize(num_slots / 2);
    const int n = static_cast<int>(slots.size());
    std::vector<float> qkv(static_cast<size_t>(n) * stride);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    for (float& x : qkv) x = dist(rng);
    std::vector<T> k_cache(cache_elems, unwritten), v_cache(cache_elems, unwritten);
    AttentionShape shape;
    shape.num_heads = kHeads;
    shape.num_kv_heads = kKvHeads;
    shape.head_dim = kHeadDim;
    std::unique_ptr<Backend> backend = MakeCpuBackend(2, CpuWeightDtype::kF32, kv);
    ASSERT_EQ(backend->kv_element_bytes(), sizeof(T));
    const float* k = qkv.data() + kHeads * kHeadDim;
    backend->WriteKv(k, k + kKvHeads * kHeadDim, n, stride, slots.data(), shape,
                     {k_cache.data(), v_cache.data(), block_size});
    const internal::CpuKvLayout layout{kKvHeads, kHeadDim, block_size};
    // Bit patterns, so that NaN (the unwritten marker) equals itself.
    const auto same = [](T a, T b) {
      if constexpr (std::is_same_v<T, float>) {
        return std::bit_cast<uint32_t>(a) == std::bit_cast<uint32_t>(b);
      } else {
        return a == b;
      }
    };
    for (int t = 0; t < n; ++t) {
      for (int h = 0; h < kKvHeads; ++h) {
        for (int c = 0; c < kHeadDim; ++c) {
          const size_t at = static_cast<size_t>(t) * stride + (kHeads + h) * kHeadDim + c;
          ASSERT_TRUE(same(k_cache[layout.K(slots[t], h, c)], stored(qkv[at])))
              << "block_size " << block_size;
          ASSERT_TRUE(
              same(v_cache[layout.V(slots[t], h, c)], stored(qkv[at + kKvHeads * kHeadDim])))
              << "block_size " << block_size;
        }
      }
    }
    const auto written = [&](const std::vector<T>& cache) {
      return std::count_if(cache.begin(), cache.end(), [&](T x) { return !same(x, unwritten); });
    };
    EXPECT_EQ(written(k_cache), n * kKvHeads * kHeadDim) << "block_size " << block_size;
    EXPECT_EQ(written(v_cache), n * kKvHeads * kHeadDim) << "block_size " << block_size;
  }
}

TEST(CpuBackendAttentionTest, WriteKvFollowsTheLayout) {
  ExpectWriteKvFollowsTheLayout<float>(CpuKvDtype::kF32);
  ExpectWriteKvFollowsTheLayout<uint16_t>(CpuKvDtype::kBf16);
}

// The backend picks ActiveCpuIsa()'s kernel, for any thread count.
TEST(CpuBackendAttentionTest, MatchesItsKernelForAnyThreadCount) {
  for (CpuKvDtype kv : {CpuKvDtype::kF32, CpuKvDtype::kBf16}) {
    const Param param{ActiveCpuIsa(), 3, 64, 16, kv};
    PagedFixture f(param, kMixedLengths, 4);
    f.SetTokens(MixedStep());
    const std::vector<float> expected = f.Run(0, f.num_tokens(), nullptr);
    for (int threads : {1, 2, 3}) {
      std::unique_ptr<Backend> backend = MakeCpuBackend(threads, CpuWeightDtype::kF32, kv);
      const std::vector<float> out = f.RunBackend(backend.get());
      EXPECT_EQ(0, std::memcmp(expected.data(), out.data(), out.size() * sizeof(float)))
          << threads << " threads, " << CpuKvDtypeName(kv) << " KV";
    }
  }
}

}  // namespace
}  // namespace conveyor::kernels
