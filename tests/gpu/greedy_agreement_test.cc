// End to end across backends: the same model (deterministic random weights with
// tests/model_gen's scales) decodes the same prompts greedily on a backend under test
// and on the float32 CPU backend, the reference.
//
// Two measures, both printed as "[ METRIC   ]" lines for tests/gpu/run.sh:
//  - free-running: per prompt, the tokens generated before the first divergence (after
//    one, the sequences differ and comparing further says nothing);
//  - teacher-forced: both backends read the reference's whole sequences in one pass, and
//    at each generated position we compare their argmax. This counts every position,
//    so one early near-tie does not hide the other 127.
// The target (issue E) is >= 99 % teacher-forced agreement over 128 tokens. What the test
// asserts is what a correct 16-bit implementation must do whatever the model: logits
// within bf16-class error of the reference (‖Δ‖/‖ref‖ over every position), and every
// disagreement a near tie of the reference (its margin between the two tokens small
// against its logits' spread), since a random model has more near ties than a trained one.
//
// The CPU test (threads 2 vs 1) runs everywhere and must agree exactly: it checks the
// harness itself. The CUDA test reports SKIPPED without a usable device.
#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/ggml_types.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/direct_runner.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "testing/random_weights.h"
#ifdef CONVEYOR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace conveyor {
namespace {

constexpr int kNewTokens = 128;
constexpr int kNumPrompts = 8;
constexpr int kBlockSize = 16;

ModelConfig Preset(const char* name) {
  absl::StatusOr<ModelConfig> config = ModelShapePreset(name);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

// The random weights with every matrix of a whole number of 32-column blocks stored as a
// GGUF file would store it: q_proj and the MLP in Q4_0, the rest (embeddings, k, v, o, the
// LM head) in Q8_0, so the fused qkv weight mixes two types. ReadF32 and ReadF32Slice
// give ggml's dequantization of those blocks, so a backend that dequantizes at load sees
// exactly the weights a backend computing on the blocks sees.
class QuantizedRandomSource final : public model::WeightSource {
 public:
  explicit QuantizedRandomSource(uint64_t seed) : base_(testing::MakeRandomWeightSource(seed)) {}

  bool Contains(const std::string& name) const override { return base_->Contains(name); }

  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    if (!Quantized(shape)) return base_->ReadF32(name, shape, out);
    std::vector<std::byte> blocks;
    RETURN_IF_ERROR(Blocks(name, shape, 0, shape[0], 0, shape[1], &blocks));
    return DequantizeToF32(TypeOf(name), blocks.data(), shape[0] * shape[1], out);
  }

  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& shape, int dim,
                            int64_t begin, int64_t end, float* out) const override {
    if (!Quantized(shape)) return base_->ReadF32Slice(name, shape, dim, begin, end, out);
    std::vector<float> all(shape[0] * shape[1]);
    RETURN_IF_ERROR(ReadF32(name, shape, all.data()));
    for (int64_t r = dim == 0 ? begin : 0; r < (dim == 0 ? end : shape[0]); ++r) {
      for (int64_t c = dim == 1 ? begin : 0; c < (dim == 1 ? end : shape[1]); ++c) {
        *out++ = all[r * shape[1] + c];
      }
    }
    return absl::OkStatus();
  }

  absl::Status ReadQuantizedRows(const std::string& name, const std::vector<int64_t>& shape,
                                 int64_t row_begin, int64_t row_end, int64_t col_begin,
                                 int64_t col_end, kernels::QuantBlockType* type,
                                 std::vector<std::byte>* out) const override {
    if (!Quantized(shape) || col_begin % 32 != 0 || col_end % 32 != 0) {
      return absl::UnimplementedError(name + " is not block-quantized");
    }
    *type = TypeOf(name) == GgmlType::kQ4_0 ? kernels::QuantBlockType::kQ4_0
                                            : kernels::QuantBlockType::kQ8_0;
    return Blocks(name, shape, row_begin, row_end, col_begin, col_end, out);
  }

 private:
  static bool Quantized(const std::vector<int64_t>& shape) {
    return shape.size() == 2 && shape[1] % 32 == 0;
  }
  static GgmlType TypeOf(const std::string& name) {
    return name.find("q_proj") != std::string::npos || name.find("mlp.") != std::string::npos
               ? GgmlType::kQ4_0
               : GgmlType::kQ8_0;
  }
  // IEEE binary16 bits of a positive normal half value `h` (exactly representable).
  static uint16_t HalfBits(float h) {
    int exponent = 0;
    const float mantissa = std::frexp(h, &exponent);  // h = mantissa · 2^exponent.
    return static_cast<uint16_t>(((exponent + 14) << 10) |
                                 (static_cast<int>(std::ldexp(mantissa, 11)) - 1024));
  }
  // Rows [row_begin, row_end), columns [col_begin, col_end) (whole blocks) in blocks of
  // the tensor's type, appended to `out`: d = max|w| / 7 (Q4_0) or / 127 (Q8_0), rounded
  // to a half no smaller than 2^-14, q = round(w / d).
  absl::Status Blocks(const std::string& name, const std::vector<int64_t>& shape, int64_t row_begin,
                      int64_t row_end, int64_t col_begin, int64_t col_end,
                      std::vector<std::byte>* out) const {
    std::vector<float> w(shape[0] * shape[1]);
    RETURN_IF_ERROR(base_->ReadF32(name, shape, w.data()));
    const bool q4 = TypeOf(name) == GgmlType::kQ4_0;
    for (int64_t r = row_begin; r < row_end; ++r) {
      for (int64_t c0 = col_begin; c0 < col_end; c0 += 32) {
        const float* x = w.data() + r * shape[1] + c0;
        float most = 0.0f;
        for (int i = 0; i < 32; ++i) most = std::max(most, std::fabs(x[i]));
        // The next half up (11 significant bits), so no |w / d| exceeds the code range.
        const float wanted = std::max(most / (q4 ? 7.0f : 127.0f), 0x1p-14f);
        int exponent = 0;
        std::frexp(wanted, &exponent);
        const float quantum = std::ldexp(1.0f, exponent - 11);
        const float d = std::ceil(wanted / quantum) * quantum;
        const uint16_t bits = HalfBits(d);
        std::byte block[34] = {};
        std::memcpy(block, &bits, sizeof(bits));
        for (int i = 0; i < 32; ++i) {
          const int q = static_cast<int>(std::nearbyint(x[i] / d));
          if (q4) {
            const int code = std::clamp(q, -8, 7) + 8;
            block[2 + i % 16] |= static_cast<std::byte>(i < 16 ? code : code << 4);
          } else {
            block[2 + i] = static_cast<std::byte>(static_cast<int8_t>(std::clamp(q, -127, 127)));
          }
        }
        out->insert(out->end(), block, block + (q4 ? 18 : 34));
      }
    }
    return absl::OkStatus();
  }

  std::unique_ptr<model::WeightSource> base_;
};

// A model on a backend with its KV cache and a runner.
struct Instance {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::KvCache> cache;
  std::unique_ptr<model::DirectRunner> runner;
};

Instance MakeInstance(std::unique_ptr<kernels::Backend> backend, const ModelConfig& config,
                      bool quantized = false) {
  Instance in;
  in.backend = std::move(backend);
  const std::unique_ptr<model::WeightSource> weights =
      quantized ? std::make_unique<QuantizedRandomSource>(11) : testing::MakeRandomWeightSource(11);
  auto model = model::LlamaModel::Create(config, *weights, in.backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return in;
  in.model = std::move(*model);
  const int blocks_per_seq = (64 + kNewTokens + kBlockSize) / kBlockSize + 1;
  auto cache =
      model::KvCache::Create(in.backend.get(), config.num_layers, in.model->local_num_kv_heads(),
                             config.head_dim, kBlockSize, kNumPrompts * blocks_per_seq);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return in;
  in.cache = std::move(*cache);
  in.runner = std::make_unique<model::DirectRunner>(in.model.get(), in.cache.get());
  return in;
}

std::vector<std::vector<int32_t>> Prompts(int vocab) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int32_t> token(3, vocab - 1);
  std::vector<std::vector<int32_t>> prompts;
  for (int p = 0; p < kNumPrompts; ++p) {
    std::vector<int32_t> prompt(8 + 7 * p);  // 8 .. 57 tokens.
    for (int32_t& t : prompt) t = token(rng);
    prompts.push_back(prompt);
  }
  return prompts;
}

// Greedy continuations of every prompt, decoded as one batch.
std::vector<std::vector<int32_t>> GreedyDecode(model::DirectRunner* runner,
                                               const std::vector<std::vector<int32_t>>& prompts,
                                               int vocab) {
  runner->Clear();
  std::vector<int> seqs;
  seqs.reserve(prompts.size());
  for (const auto& p : prompts) seqs.push_back(runner->Add(p));
  std::vector<std::vector<int32_t>> outputs(prompts.size());
  std::vector<float> logits;
  for (int step = 0; step < kNewTokens; ++step) {
    auto rows = runner->Step(seqs, 0, false, &logits);
    EXPECT_TRUE(rows.ok()) << rows.status();
    if (!rows.ok() || *rows != static_cast<int>(seqs.size())) return {};
    for (size_t i = 0; i < seqs.size(); ++i) {
      const int next = model::Argmax(std::span<const float>(logits).subspan(i * vocab, vocab));
      outputs[i].push_back(next);
      runner->Append(seqs[i], next);
    }
  }
  return outputs;
}

// Logits at every position of each full sequence, one pass each: [tokens, vocab] per seq.
std::vector<std::vector<float>> TeacherForcedLogits(
    model::DirectRunner* runner, const std::vector<std::vector<int32_t>>& sequences) {
  runner->Clear();
  std::vector<std::vector<float>> out;
  for (const auto& seq : sequences) {
    const int id = runner->Add(seq);
    const int ids[] = {id};
    std::vector<float> logits;
    auto rows = runner->Step(ids, 0, true, &logits);
    EXPECT_TRUE(rows.ok()) << rows.status();
    out.push_back(std::move(logits));
  }
  return out;
}

struct Agreement {
  int positions = 0;
  int agreeing = 0;
  double logit_rel_error = 0;     // ‖test − ref‖ / ‖ref‖ over every compared position.
  double worst_disagreement = 0;  // Largest reference margin / logit spread at a miss.
  std::vector<int> first_divergence;  // Per prompt; kNewTokens if none.
};

Agreement Compare(Instance& ref, Instance& test, const ModelConfig& config) {
  const int vocab = config.vocab_size;
  const auto prompts = Prompts(vocab);
  const auto ref_out = GreedyDecode(ref.runner.get(), prompts, vocab);
  const auto test_out = GreedyDecode(test.runner.get(), prompts, vocab);
  Agreement a;
  if (ref_out.size() != prompts.size() || test_out.size() != prompts.size()) return a;
  std::vector<std::vector<int32_t>> full;
  for (size_t p = 0; p < prompts.size(); ++p) {
    int same = 0;
    while (same < kNewTokens && ref_out[p][same] == test_out[p][same]) ++same;
    a.first_divergence.push_back(same);
    full.push_back(prompts[p]);
    // The last generated token predicts nothing we compare: leave it out.
    full.back().insert(full.back().end(), ref_out[p].begin(), ref_out[p].end() - 1);
  }
  const auto ref_logits = TeacherForcedLogits(ref.runner.get(), full);
  const auto test_logits = TeacherForcedLogits(test.runner.get(), full);
  double diff2 = 0, ref2 = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const int prompt_len = static_cast<int>(prompts[p].size());
    for (int j = 0; j < kNewTokens; ++j) {
      // Row prompt_len - 1 + j predicts generated token j.
      const size_t row = static_cast<size_t>(prompt_len - 1 + j) * vocab;
      std::span<const float> r(ref_logits[p].data() + row, vocab);
      std::span<const float> t(test_logits[p].data() + row, vocab);
      for (int v = 0; v < vocab; ++v) {
        diff2 += (double(t[v]) - r[v]) * (double(t[v]) - r[v]);
        ref2 += double(r[v]) * r[v];
      }
      const int ref_choice = model::Argmax(r);
      const int test_choice = model::Argmax(t);
      ++a.positions;
      if (ref_choice == test_choice) {
        ++a.agreeing;
        continue;
      }
      const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
      const double margin = (r[ref_choice] - r[test_choice]) / std::max(*hi - *lo, 1e-30f);
      a.worst_disagreement = std::max(a.worst_disagreement, margin);
      std::printf(
          "position %d of prompt %zu: reference %d (%.4f), test %d (%.4f in the "
          "reference), margin %.3g of the logit range\n",
          j, p, ref_choice, r[ref_choice], test_choice, r[test_choice], margin);
    }
  }
  a.logit_rel_error = std::sqrt(diff2 / std::max(ref2, 1e-30));
  return a;
}

void Report(const std::string& name, const Agreement& a) {
  std::string divergence;
  for (int d : a.first_divergence) divergence += " " + std::to_string(d);
  std::printf("first divergence per prompt (of %d tokens):%s\n", kNewTokens, divergence.c_str());
  std::printf(
      "[ METRIC   ] %s teacher_forced_agreement=%.4f positions=%d logit_rel_err=%.3g "
      "worst_miss_margin=%.3g\n",
      name.c_str(), a.positions ? double(a.agreeing) / a.positions : 0.0, a.positions,
      a.logit_rel_error, a.worst_disagreement);
}

TEST(GreedyAgreementTest, CpuThreadCountsAgreeExactly) {
  const ModelConfig config = Preset("tiny");
  Instance ref = MakeInstance(kernels::MakeCpuBackend(2), config);
  Instance test = MakeInstance(kernels::MakeCpuBackend(1), config);
  ASSERT_TRUE(ref.runner && test.runner);
  const Agreement a = Compare(ref, test, config);
  Report("cpu_threads", a);
  ASSERT_EQ(a.positions, kNumPrompts * kNewTokens);
  EXPECT_EQ(a.agreeing, a.positions);
  EXPECT_EQ(a.logit_rel_error, 0.0);  // The CPU backend is batch and thread invariant.
  for (int d : a.first_divergence) EXPECT_EQ(d, kNewTokens);
}

// The harness of the quantized test below: the blocks the source hands out dequantize to
// the floats it reads, for every kind of slice the loader asks for.
TEST(GreedyAgreementTest, QuantizedSourceBlocksAreItsFloats) {
  const QuantizedRandomSource source(11);
  const ModelConfig config = Preset("small");
  const std::vector<int64_t> shape = {config.intermediate_size, config.hidden_size};
  for (const std::string name :
       {"model.layers.0.mlp.gate_proj.weight", "model.layers.0.self_attn.k_proj.weight"}) {
    std::vector<float> all(shape[0] * shape[1]);
    ASSERT_TRUE(source.ReadF32(name, shape, all.data()).ok());
    kernels::QuantBlockType type{};
    std::vector<std::byte> blocks;
    // Rows 5..9, columns 256..511.
    ASSERT_TRUE(source.ReadQuantizedRows(name, shape, 5, 9, 256, 512, &type, &blocks).ok());
    const GgmlType ggml =
        type == kernels::QuantBlockType::kQ4_0 ? GgmlType::kQ4_0 : GgmlType::kQ8_0;
    EXPECT_EQ(ggml, name.find("mlp") != std::string::npos ? GgmlType::kQ4_0 : GgmlType::kQ8_0);
    std::vector<float> values(4 * 256);
    ASSERT_TRUE(DequantizeToF32(ggml, blocks.data(), values.size(), values.data()).ok());
    std::vector<float> slice(shape[0] * 256);  // Every row, columns 256..511.
    ASSERT_TRUE(source.ReadF32Slice(name, shape, 1, 256, 512, slice.data()).ok());
    double diff = 0, norm = 0;
    for (int r = 0; r < 4; ++r) {
      for (int c = 0; c < 256; ++c) {
        const float want = all[(5 + r) * shape[1] + 256 + c];
        EXPECT_EQ(values[r * 256 + c], want);
        EXPECT_EQ(slice[(5 + r) * 256 + c], want);
      }
    }
    // And the quantization is close to the random floats it came from (about 1/14 of a
    // block's largest value for Q4_0).
    std::vector<float> original(all.size());
    ASSERT_TRUE(testing::MakeRandomWeightSource(11)->ReadF32(name, shape, original.data()).ok());
    for (size_t i = 0; i < all.size(); ++i) {
      diff += (all[i] - original[i]) * (all[i] - original[i]);
      norm += original[i] * original[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), ggml == GgmlType::kQ4_0 ? 0.15 : 0.01) << name;
  }
}

TEST(GreedyAgreementTest, CudaBf16AgreesWithCpuFp32) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  auto cuda = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Instance test = MakeInstance(std::move(*cuda), config);
  Instance ref = MakeInstance(kernels::MakeCpuBackend(0), config);
  ASSERT_TRUE(ref.runner && test.runner);
  const Agreement a = Compare(ref, test, config);
  auto* backend = static_cast<kernels::CudaBackend*>(test.backend.get());
  ASSERT_TRUE(backend->last_error().ok()) << backend->last_error();
  Report("cuda_bf16_vs_cpu_fp32", a);
  ASSERT_EQ(a.positions, kNumPrompts * kNewTokens);
  // bf16 activations and weights: ‖Δ‖/‖ref‖ lands between 1e-3 and 1e-2.
  EXPECT_LT(a.logit_rel_error, 2e-2);
  // A miss is only acceptable where the reference itself nearly tied.
  EXPECT_LT(a.worst_disagreement, 0.02);
  std::printf("teacher-forced agreement %.2f %% (target >= 99 %%)\n",
              100.0 * a.agreeing / a.positions);
#endif
}

// A model whose linear weights are GGUF blocks (Q4_0 and Q8_0): the CUDA backend computes
// on the blocks (PackLinearQuantized: the fused GEMV for decode steps of up to 8 tokens,
// dequantized tiles and the GEMM for prefill), the reference dequantizes them at load, so
// both compute with the same weight values and should agree as closely as bf16 does.
TEST(GreedyAgreementTest, CudaOnGgufBlocksAgreesWithCpuFp32) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  auto cuda = kernels::MakeCudaBackend(0);
  ASSERT_TRUE(cuda.ok()) << cuda.status();
  Instance test = MakeInstance(std::move(*cuda), config, /*quantized=*/true);
  Instance ref = MakeInstance(kernels::MakeCpuBackend(0), config, /*quantized=*/true);
  ASSERT_TRUE(ref.runner && test.runner);
  // The blocks stayed blocks: 5 bits a weight for Q4_0 and 9 for Q8_0 on the GPU, against
  // bf16's 16 had they been dequantized (the embedding table is bf16 either way): about
  // 41 % of the bf16 model's bytes for this mix, so well under 60 %.
  const double hidden = config.hidden_size, q_dim = config.num_attention_heads * config.head_dim,
               kv_dim = config.num_kv_heads * config.head_dim;
  const double bf16_bytes = 2.0 * (config.num_layers * (hidden * (2 * q_dim + 2 * kv_dim) +
                                                        3.0 * hidden * config.intermediate_size) +
                                   2.0 * config.vocab_size * hidden);
  EXPECT_LT(static_cast<double>(test.model->weight_bytes()), 0.6 * bf16_bytes);
  const Agreement a = Compare(ref, test, config);
  auto* backend = static_cast<kernels::CudaBackend*>(test.backend.get());
  ASSERT_TRUE(backend->last_error().ok()) << backend->last_error();
  Report("cuda_gguf_q4_0_q8_0_vs_cpu_fp32", a);
  ASSERT_EQ(a.positions, kNumPrompts * kNewTokens);
  EXPECT_LT(a.logit_rel_error, 2e-2);
  EXPECT_LT(a.worst_disagreement, 0.02);
#endif
}

#ifdef CONVEYOR_HAVE_CUDA
// Two CUDA instances of `config`, one launching kernel by kernel and one replaying decode
// steps of up to kNumPrompts sequences as graphs (runners null on failure).
struct GraphPair {
  Instance plain, graphed;
};
GraphPair MakeGraphPair(const ModelConfig& config) {
  GraphPair pair;
  auto plain_backend = kernels::MakeCudaBackend(0);
  auto graph_backend = kernels::MakeCudaBackend(0);
  EXPECT_TRUE(plain_backend.ok() && graph_backend.ok());
  if (!plain_backend.ok() || !graph_backend.ok()) return pair;
  pair.plain = MakeInstance(std::move(*plain_backend), config);
  pair.graphed = MakeInstance(std::move(*graph_backend), config);
  if (pair.graphed.model != nullptr) {
    const absl::Status enabled = pair.graphed.model->EnableDecodeGraphs(kNumPrompts);
    EXPECT_TRUE(enabled.ok()) << enabled;
    if (!enabled.ok()) pair.graphed.runner.reset();
  }
  return pair;
}

// The first error either instance's backend recorded (OK if none).
absl::Status BackendErrors(std::initializer_list<const Instance*> instances) {
  for (const Instance* in : instances) {
    absl::Status error = in->backend->last_error();
    if (!error.ok()) return error;
  }
  return absl::OkStatus();
}

#endif

// Decode steps replayed as CUDA graphs compute what the same steps launched one kernel
// at a time do: 8 sequences pad to 8 (the same GEMM shapes), and attention's fixed
// partitions make the padded block-table width irrelevant, so the tokens are identical.
TEST(GreedyAgreementTest, CudaGraphsDecodeAsWithout) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  auto [plain, graphed] = MakeGraphPair(config);
  ASSERT_TRUE(plain.runner && graphed.runner);
  const auto prompts = Prompts(config.vocab_size);
  const auto want = GreedyDecode(plain.runner.get(), prompts, config.vocab_size);
  const auto got = GreedyDecode(graphed.runner.get(), prompts, config.vocab_size);
  ASSERT_TRUE(BackendErrors({&plain, &graphed}).ok()) << BackendErrors({&plain, &graphed});
  ASSERT_EQ(got.size(), want.size());
  for (size_t p = 0; p < want.size(); ++p) EXPECT_EQ(got[p], want[p]) << "prompt " << p;
#endif
}

// A decode batch that is not a power of two pads to the next one in a graph (3 → 4,
// 5 → 8): the padding rows embed the zero row, attend over an all-zero block table and
// skip the KV write. Graphed and plain decoding of the same sequences, fed the same
// tokens at every step (the plain run's argmax), must give the same logits but for the
// GEMMs' rounding (8 rows against 5 may take another cuBLAS algorithm): a padding row
// that wrote into a real sequence's KV, or metadata left from another shape, shows as
// an error far larger, and every argmax that differs must be a near tie.
TEST(GreedyAgreementTest, CudaGraphsPadBatchesThatAreNotPowersOfTwo) {
#ifndef CONVEYOR_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
  const ModelConfig config = Preset("small");
  const int vocab = config.vocab_size;
  for (const int batch : {3, 5}) {
    auto [plain, graphed] = MakeGraphPair(config);
    ASSERT_TRUE(plain.runner && graphed.runner);
    std::vector<std::vector<int32_t>> prompts = Prompts(vocab);
    prompts.resize(batch);
    std::vector<int> plain_seqs, graph_seqs;
    for (const auto& p : prompts) {
      plain_seqs.push_back(plain.runner->Add(p));
      graph_seqs.push_back(graphed.runner->Add(p));
    }
    double diff2 = 0, ref2 = 0, worst_margin = 0;
    int misses = 0;
    std::vector<float> want, got;
    for (int step = 0; step < kNewTokens / 2; ++step) {
      auto want_rows = plain.runner->Step(plain_seqs, 0, false, &want);
      auto got_rows = graphed.runner->Step(graph_seqs, 0, false, &got);
      ASSERT_TRUE(want_rows.ok() && got_rows.ok()) << want_rows.status() << got_rows.status();
      ASSERT_EQ(*want_rows, batch);
      ASSERT_EQ(*got_rows, batch);
      for (int i = 0; i < batch; ++i) {
        std::span<const float> r(want.data() + static_cast<size_t>(i) * vocab, vocab);
        std::span<const float> t(got.data() + static_cast<size_t>(i) * vocab, vocab);
        for (int v = 0; v < vocab; ++v) {
          ASSERT_TRUE(std::isfinite(t[v])) << "batch " << batch << " step " << step;
          diff2 += (double(t[v]) - r[v]) * (double(t[v]) - r[v]);
          ref2 += double(r[v]) * r[v];
        }
        const int next = model::Argmax(r);
        const int graph_choice = model::Argmax(t);
        if (graph_choice != next) {
          ++misses;
          const auto [lo, hi] = std::minmax_element(r.begin(), r.end());
          worst_margin = std::max<double>(
              worst_margin, (r[next] - r[graph_choice]) / std::max(*hi - *lo, 1e-30f));
        }
        plain.runner->Append(plain_seqs[i], next);
        graphed.runner->Append(graph_seqs[i], next);
      }
    }
    ASSERT_TRUE(BackendErrors({&plain, &graphed}).ok()) << BackendErrors({&plain, &graphed});
    const double rel = std::sqrt(diff2 / std::max(ref2, 1e-30));
    std::printf(
        "[ METRIC   ] graph_padding_batch%d logit_rel_err=%.3g argmax_misses=%d "
        "worst_margin=%.3g graphs=%d\n",
        batch, rel, misses, worst_margin, graphed.model->num_decode_graphs());
    // The prefill steps run without graphs; every decode step of `batch` sequences ran as
    // the padded graph (one per block-table width reached).
    EXPECT_GT(graphed.model->num_decode_graphs(), 0) << "batch " << batch;
    EXPECT_LT(rel, 1e-2) << "batch " << batch;
    EXPECT_LT(worst_margin, 0.02) << "batch " << batch;
  }
#endif
}

}  // namespace
}  // namespace conveyor
