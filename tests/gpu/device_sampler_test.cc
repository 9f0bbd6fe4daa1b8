// The CUDA sampler against the host sampler (model/sampler.h) on the same logits: the
// rows are uploaded in the compute dtype, read back, and the host sampler gets exactly
// those values. Greedy tokens, log-probabilities and top alternatives must match; seeded
// draws use the same random stream and the same candidate order, so they match too
// except where a draw lands within rounding of a boundary between two tokens (float vs
// double partial sums), which the test allows for once in a hundred.
// Reports SKIPPED without a usable CUDA device.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/backend.h"
#include "model/cuda/cuda_device.h"
#include "model/device_sampler.h"
#include "model/model.h"
#include "model/sampler.h"
#ifdef CONVEYOR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

namespace conveyor::model {
namespace {

struct Case {
  SamplingParams params;
  std::vector<int32_t> prompt;
  std::vector<int32_t> output;
};

class DeviceSamplerTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override {
#ifndef CONVEYOR_HAVE_CUDA
    GTEST_SKIP() << "built without CUDA";
#else
    if (kernels::CudaDeviceCount() == 0) GTEST_SKIP() << "no usable CUDA device";
    auto backend = kernels::MakeCudaBackend(0);
    ASSERT_TRUE(backend.ok()) << backend.status();
    backend_ = std::move(*backend);
#endif
  }

  // Uploads rows x vocab logits laid out as `world` shards, samples them on the device
  // and on the host, and returns how many drawn tokens differ.
  int Compare(int vocab, int world, const std::vector<Case>& cases, uint64_t seed) {
    const int rows = static_cast<int>(cases.size());
    const int shard = (vocab + world - 1) / world;
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 3.0f);
    std::vector<float> layout(static_cast<size_t>(world) * rows * shard, 0.0f);
    for (float& x : layout) x = normal(rng);
    auto device = backend_->UploadCompute(layout.data(), layout.size());
    EXPECT_TRUE(device.ok()) << device.status();
    if (!device.ok()) return -1;
    kernels::BackendBuffer owner(*device, kernels::BackendDeleter{backend_.get()});
    // What the device holds, as the host sampler will see it.
    backend_->CopyActivationsToHost(layout.data(), *device, layout.size());
    EXPECT_TRUE(backend_->Synchronize().ok());

    auto sampler = MakeCudaSampler(backend_.get(), vocab, rows + 3);
    EXPECT_TRUE(sampler.ok()) << sampler.status();
    if (!sampler.ok()) return -1;
    std::vector<RowToSample> to_sample;
    to_sample.reserve(rows);
    for (int r = 0; r < rows; ++r) {
      to_sample.push_back({&cases[r].params, cases[r].prompt, cases[r].output,
                           static_cast<uint64_t>(cases[r].output.size()), true});
    }
    DeviceLogits logits{*device, rows, world, shard, vocab, rows};
    std::vector<SampleResult> got;
    const absl::Status status = (*sampler)->Sample(logits, to_sample, &got);
    EXPECT_TRUE(status.ok()) << status;
    if (!status.ok() || static_cast<int>(got.size()) != rows) return -1;

    Sampler host(vocab);
    int differing_draws = 0;
    for (int r = 0; r < rows; ++r) {
      std::vector<float> row(vocab);
      for (int v = 0; v < vocab; ++v) {
        row[v] = layout[(static_cast<size_t>(v / shard) * rows + r) * shard + v % shard];
      }
      const Case& c = cases[r];
      const SampleResult want =
          host.Sample(row, c.params, c.prompt, c.output, c.output.size(), /*want_logprob=*/true);
      SCOPED_TRACE(testing::Message()
                   << "row " << r << " of vocab " << vocab << ", temperature "
                   << c.params.temperature << ", top_k " << c.params.top_k << ", top_p "
                   << c.params.top_p << ", min_p " << c.params.min_p);
      if (c.params.is_greedy()) {
        EXPECT_EQ(got[r].token_id, want.token_id);
      } else if (got[r].token_id != want.token_id) {
        ++differing_draws;
      }
      EXPECT_GE(got[r].token_id, 0);
      EXPECT_LT(got[r].token_id, vocab);
      EXPECT_NEAR(got[r].logprob, row[got[r].token_id] - (row[want.token_id] - want.logprob), 1e-4);
      EXPECT_EQ(got[r].top_logprobs.size(), want.top_logprobs.size());
      for (size_t k = 0; k < std::min(want.top_logprobs.size(), got[r].top_logprobs.size()); ++k) {
        EXPECT_EQ(got[r].top_logprobs[k].token_id, want.top_logprobs[k].token_id);
        EXPECT_NEAR(got[r].top_logprobs[k].logprob, want.top_logprobs[k].logprob, 1e-4);
      }
    }
    return differing_draws;
  }

  std::unique_ptr<kernels::Backend> backend_;
};

std::vector<Case> MixedCases(int vocab, int count, uint64_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> token(-2, vocab + 1);  // A few out of range.
  std::vector<Case> cases;
  for (int i = 0; i < count; ++i) {
    Case c;
    SamplingParams& p = c.params;
    p.seed = rng();
    p.num_logprobs = i % 3 == 0 ? 5 : 0;
    switch (i % 8) {
      case 0:
        p.temperature = 0.0f;
        break;
      case 1:
        p.temperature = 1.0f;
        break;
      case 2:
        p.temperature = 0.7f;
        p.top_k = 40;
        break;
      case 3:
        p.temperature = 1.3f;
        p.top_p = 0.9f;
        break;
      case 4:
        p.temperature = 1.0f;
        p.min_p = 0.05f;
        break;
      case 5:
        p.temperature = 0.8f;
        p.top_k = 100;
        p.top_p = 0.8f;
        p.min_p = 0.01f;
        break;
      case 6:
        p.temperature = 0.0f;
        p.repetition_penalty = 1.3f;
        break;
      case 7:
        p.temperature = 1.0f;
        p.repetition_penalty = 0.9f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.3f;
        break;
    }
    for (int t = 0; t < 30; ++t) c.prompt.push_back(token(rng));
    for (int t = 0; t < 20 + i; ++t) {
      c.output.push_back(t % 4 == 0 && !c.output.empty() ? c.output.back() : token(rng));
    }
    cases.push_back(c);
  }
  return cases;
}

TEST_P(DeviceSamplerTest, MatchesTheHostSampler) {
  const int vocab = GetParam();
  int differing = 0, draws = 0;
  for (int world : {1, 3}) {
    const std::vector<Case> cases = MixedCases(vocab, 24, vocab + world);
    differing += Compare(vocab, world, cases, 17 + world);
    for (const Case& c : cases) draws += c.params.is_greedy() ? 0 : 1;
  }
  EXPECT_LE(differing * 100, draws) << differing << " of " << draws << " draws differ";
}

TEST_P(DeviceSamplerTest, SeededDrawsMatchTheHostDrawForDraw) {
  // 300 plain temperature-1 draws (draw indices 0..299 of one seed), each on its own row.
  const int vocab = GetParam();
  std::vector<Case> cases(300);
  for (size_t i = 0; i < cases.size(); ++i) {
    cases[i].params.temperature = 1.0f;
    cases[i].params.seed = 1234;
    cases[i].output.assign(i, 5);  // Draw index i.
  }
  const int differing = Compare(vocab, 1, cases, 99);
  EXPECT_LE(differing, 3);
}

INSTANTIATE_TEST_SUITE_P(Vocab, DeviceSamplerTest, ::testing::Values(1000, 128256),
                         [](const auto& info) { return "vocab" + std::to_string(info.param); });

}  // namespace
}  // namespace conveyor::model
