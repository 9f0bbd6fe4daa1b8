#include "tests/support/test_support.h"

#include <cmath>
#include <cstdlib>
#include <fstream>

#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor::testing {

std::string TestDataDir() {
  const char* dir = std::getenv("CONVEYOR_TEST_DATA");
  return dir != nullptr ? dir : CONVEYOR_TEST_DATA_DEFAULT;
}

std::string WorkerBinary() {
  const char* bin = std::getenv("CONVEYOR_WORKER_BIN");
  return bin != nullptr ? bin : CONVEYOR_WORKER_BIN_DEFAULT;
}

std::string SchedulerBinary() {
  const char* bin = std::getenv("CONVEYOR_SCHEDULER_BIN");
  return bin != nullptr ? bin : CONVEYOR_SCHEDULER_BIN_DEFAULT;
}

std::string TestModelDir(const std::string& variant) { return TestDataDir() + "/" + variant; }

std::vector<std::string> TestModelVariants() {
  return {"llama3_gqa", "tied_mha_bf16_sharded", "qwen2_bias_f16",  "qwen3_dense_yarn",
          "qwen3_moe",  "qwen3_moe_norm_bf16",   "mixtral_moe_tied"};
}

Reference LoadReference(const std::string& variant) {
  Reference ref;
  std::ifstream in(TestModelDir(variant) + "/reference.json");
  EXPECT_TRUE(in.good()) << "missing reference for " << variant;
  const nlohmann::json j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  EXPECT_FALSE(j.is_discarded()) << "unreadable reference for " << variant;
  if (j.is_discarded()) return ref;
  for (const auto& p : j["prompts"]) {
    ref.prompts.push_back(p["tokens"].get<std::vector<int32_t>>());
    ref.logits.push_back(p["logits"].get<std::vector<std::vector<float>>>());
    ref.greedy.push_back(p["greedy"].get<std::vector<int32_t>>());
  }
  return ref;
}

std::unique_ptr<LocalWorker> LocalWorker::Create(const std::string& model_dir, int num_threads,
                                                 int num_blocks, int block_size,
                                                 kernels::CpuWeightDtype weights,
                                                 kernels::CpuKvDtype kv, bool keep_quantized) {
  auto w = std::make_unique<LocalWorker>();
  w->backend = kernels::MakeCpuBackend(num_threads, weights, kv, keep_quantized);
  auto model = model::LlamaModel::Load(model_dir, w->backend.get());
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return nullptr;
  w->model = std::move(*model);
  const ModelConfig& c = w->model->config();
  auto cache = model::KvCache::Create(w->backend.get(), c.num_layers, c.num_kv_heads, c.head_dim,
                                      block_size, num_blocks);
  EXPECT_TRUE(cache.ok()) << cache.status();
  if (!cache.ok()) return nullptr;
  w->cache = std::move(*cache);
  w->engine = std::make_unique<worker::StepRunner>(w->model.get(), w->cache.get(),
                                                   worker::StepRunner::Options{});
  w->engine->set_logits_tap(&w->logits);
  return w;
}

double RelativeError(const float* a, const float* b, size_t n) {
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < n; ++i) {
    diff += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    norm += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(diff) / std::max(std::sqrt(norm), 1e-30);
}

}  // namespace conveyor::testing
