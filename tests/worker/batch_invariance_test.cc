// Batch invariance: a sequence yields the same tokens (and logits within 1e-6) whether it
// runs alone, with its prompt in one piece, on one thread, or inside mixed batches on
// two threads: staggered arrivals, prefill split into chunks at arbitrary points next to
// other sequences' decode tokens, and KV blocks scattered through the cache. For each way
// the CPU backend stores weights (f32, bf16, int8), on the instruction path this CPU
// picks (CI also runs it with CONVEYOR_CPU_ISA=portable); for Qwen3 and the
// mixture-of-experts models too.
#include <algorithm>
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "tests/support/test_support.h"

namespace conveyor::testing {
namespace {

constexpr int kBlockSize = 4;  // Small, so sequences span many scattered blocks.
constexpr int kNumBlocks = 256;
constexpr int kNewTokens = 12;

struct Request {
  std::vector<int32_t> prompt;
  worker::v1::SamplingParams sampling;
};

// What one sequence produced: its tokens and the logits behind each.
struct Trace {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;
};

std::vector<Request> MakeRequests(int vocab) {
  std::mt19937 rng(7);
  std::vector<Request> requests;
  for (int len : {5, 17, 33, 40, 9, 26}) {
    Request r;
    r.prompt.push_back(1);
    for (int i = 1; i < len; ++i) r.prompt.push_back(3 + rng() % (vocab - 3));
    requests.push_back(r);
  }
  // Sampled requests: the seeded draw must not depend on the batch either.
  requests[1].sampling.set_temperature(0.8f);
  requests[1].sampling.set_top_p(0.9f);
  requests[1].sampling.set_seed(42);
  requests[4].sampling.set_temperature(1.2f);
  requests[4].sampling.set_top_k(20);
  requests[4].sampling.set_repetition_penalty(1.3f);
  requests[4].sampling.set_seed(7);
  return requests;
}

int BlocksFor(int tokens) { return (tokens + kBlockSize - 1) / kBlockSize; }

void Record(const LogitsRecorder& recorder, const worker::v1::StepResponse& response,
            std::map<uint64_t, Trace>* traces) {
  for (const worker::v1::SampledToken& t : response.tokens()) {
    Trace& trace = (*traces)[t.seq_id()];
    trace.tokens.push_back(t.token_id());
    auto logits = recorder.Last(t.seq_id());
    trace.logits.emplace_back(logits.begin(), logits.end());
  }
}

// The model and the backend's storage: weights and KV cache.
struct Storage {
  const char* variant;
  kernels::CpuWeightDtype weights;
  kernels::CpuKvDtype kv;
  const char* name;
};

// Each request alone, prompt in one step, one thread.
Trace RunAlone(const Request& request, const Storage& storage) {
  auto w = LocalWorker::Create(TestModelDir(storage.variant), 1, kNumBlocks, kBlockSize,
                               storage.weights, storage.kv);
  std::map<uint64_t, Trace> traces;
  worker::v1::StepRequest step;
  auto* seq = step.add_new_sequences();
  seq->set_seq_id(1);
  seq->mutable_token_ids()->Add(request.prompt.begin(), request.prompt.end());
  seq->set_num_tokens(static_cast<int>(request.prompt.size()));
  *seq->mutable_sampling() = request.sampling;
  const int blocks = BlocksFor(static_cast<int>(request.prompt.size()) + kNewTokens);
  for (int b = 0; b < blocks; ++b) seq->add_block_ids(b);
  for (int i = 0; i < kNewTokens; ++i) {
    worker::v1::StepResponse response;
    EXPECT_TRUE(w->engine->Step(step, &response).ok());
    Record(w->logits, response, &traces);
    step.Clear();
    auto* running = step.add_running();
    running->set_seq_id(1);
    running->set_num_tokens(1);
  }
  return traces[1];
}

// All requests through one engine: request i arrives at step 2*i, prompts go in chunks
// of 1–7 tokens, blocks come from a shuffled free list as they are needed.
std::map<uint64_t, Trace> RunMixed(const std::vector<Request>& requests, uint32_t seed,
                                   const Storage& storage) {
  auto w = LocalWorker::Create(TestModelDir(storage.variant), 2, kNumBlocks, kBlockSize,
                               storage.weights, storage.kv);
  std::mt19937 rng(seed);
  std::vector<int32_t> free_blocks(kNumBlocks);
  for (int i = 0; i < kNumBlocks; ++i) free_blocks[i] = i;
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);

  struct Live {
    int computed = 0;  // Tokens the worker has computed.
    int known = 0;     // Prompt + sampled tokens.
    int blocks = 0;
    int generated = 0;
  };
  std::map<uint64_t, Live> live;
  std::map<uint64_t, Trace> traces;
  std::vector<uint64_t> finished;  // Dropped at the start of the next step.
  size_t next_request = 0;
  for (int step_no = 0; next_request < requests.size() || !live.empty(); ++step_no) {
    worker::v1::StepRequest step;
    for (uint64_t id : finished) step.add_dropped_seq_ids(id);
    finished.clear();
    auto take_blocks = [&](int count, auto* out) {
      for (int i = 0; i < count; ++i) {
        out->Add(free_blocks.back());
        free_blocks.pop_back();
      }
    };
    for (auto& [id, s] : live) {
      const int remaining = s.known - s.computed;
      const int chunk = remaining == 1 ? 1 : std::min<int>(remaining, 1 + rng() % 7);
      auto* running = step.add_running();
      running->set_seq_id(id);
      running->set_num_tokens(chunk);
      const int need = BlocksFor(s.computed + chunk) - s.blocks;
      take_blocks(need, running->mutable_new_block_ids());
      s.blocks += need;
      s.computed += chunk;
    }
    if (next_request < requests.size() && step_no == 2 * static_cast<int>(next_request)) {
      const Request& r = requests[next_request];
      const int prompt = static_cast<int>(r.prompt.size());
      const int chunk = std::min<int>(prompt, 1 + rng() % 7);
      auto* seq = step.add_new_sequences();
      seq->set_seq_id(next_request);
      seq->mutable_token_ids()->Add(r.prompt.begin(), r.prompt.end());
      seq->set_num_tokens(chunk);
      *seq->mutable_sampling() = r.sampling;
      Live s{chunk, prompt, BlocksFor(chunk), 0};
      take_blocks(s.blocks, seq->mutable_block_ids());
      live[next_request++] = s;
    }
    worker::v1::StepResponse response;
    EXPECT_TRUE(w->engine->Step(step, &response).ok());
    Record(w->logits, response, &traces);
    for (const auto& t : response.tokens()) {
      Live& s = live[t.seq_id()];
      ++s.known;
      if (++s.generated == kNewTokens) finished.push_back(t.seq_id());
    }
    for (uint64_t id : finished) live.erase(id);
  }
  return traces;
}

class BatchInvarianceTest : public ::testing::TestWithParam<Storage> {};

TEST_P(BatchInvarianceTest, SameTokensAndLogitsAloneOrInMixedChunkedBatches) {
  const auto w = LocalWorker::Create(TestModelDir(GetParam().variant), 1, 1, kBlockSize,
                                     GetParam().weights, GetParam().kv);
  ASSERT_NE(w, nullptr);
  const std::vector<Request> requests = MakeRequests(w->model->config().vocab_size);
  std::vector<Trace> alone;
  alone.reserve(requests.size());
  for (const Request& r : requests) alone.push_back(RunAlone(r, GetParam()));
  for (uint32_t seed : {1u, 2u, 3u}) {
    const std::map<uint64_t, Trace> mixed = RunMixed(requests, seed, GetParam());
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE(::testing::Message() << "request " << i << ", schedule seed " << seed);
      const Trace& m = mixed.at(i);
      ASSERT_EQ(m.tokens, alone[i].tokens);
      ASSERT_EQ(m.logits.size(), alone[i].logits.size());
      for (size_t t = 0; t < m.logits.size(); ++t) {
        float max_diff = 0.0f;
        for (size_t v = 0; v < m.logits[t].size(); ++v) {
          max_diff = std::max(max_diff, std::abs(m.logits[t][v] - alone[i].logits[t][v]));
        }
        EXPECT_LE(max_diff, 1e-6f) << "token " << t;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Storage, BatchInvarianceTest,
    ::testing::Values(
        Storage{"llama3_gqa", kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32, "f32"},
        Storage{"llama3_gqa", kernels::CpuWeightDtype::kBf16, kernels::CpuKvDtype::kF32, "bf16"},
        Storage{"llama3_gqa", kernels::CpuWeightDtype::kInt8, kernels::CpuKvDtype::kF32, "int8"},
        Storage{"llama3_gqa", kernels::CpuWeightDtype::kBf16, kernels::CpuKvDtype::kBf16,
                "bf16_kv_bf16"},
        Storage{"llama3_gqa", kernels::CpuWeightDtype::kInt8, kernels::CpuKvDtype::kBf16,
                "int8_kv_bf16"},
        // Qwen3's q/k norms; the mixture-of-experts layers (routing, grouped GEMM and
        // combine) of both MoE families, in each weight storage.
        Storage{"qwen3_dense_yarn", kernels::CpuWeightDtype::kBf16, kernels::CpuKvDtype::kBf16,
                "qwen3_bf16_kv_bf16"},
        Storage{"qwen3_moe", kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32,
                "qwen3_moe_f32"},
        Storage{"qwen3_moe", kernels::CpuWeightDtype::kBf16, kernels::CpuKvDtype::kBf16,
                "qwen3_moe_bf16_kv_bf16"},
        Storage{"qwen3_moe", kernels::CpuWeightDtype::kInt8, kernels::CpuKvDtype::kF32,
                "qwen3_moe_int8"},
        Storage{"mixtral_moe_tied", kernels::CpuWeightDtype::kF32, kernels::CpuKvDtype::kF32,
                "mixtral_f32"}),
    [](const auto& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace conveyor::testing
