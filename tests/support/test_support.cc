#include "tests/support/test_support.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <numeric>

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

void LocalWorker::AttachDraft(const std::string& draft_dir) {
  auto loaded = model::LlamaModel::Load(draft_dir, backend.get());
  ASSERT_TRUE(loaded.ok()) << loaded.status();
  draft_model = std::move(*loaded);
  const ModelConfig& c = draft_model->config();
  auto made = model::KvCache::Create(backend.get(), c.num_layers, c.num_kv_heads, c.head_dim,
                                     cache->block_size(), cache->num_blocks());
  ASSERT_TRUE(made.ok()) << made.status();
  draft_cache = std::move(*made);
  engine->set_draft(draft_model.get(), draft_cache.get());
}

std::vector<float> PrefillLogits(LocalWorker& w, const std::vector<int32_t>& tokens, int first) {
  const int vocab = w.model->config().vocab_size;
  const int n = static_cast<int>(tokens.size());
  const int block_size = w.cache->block_size();
  model::ForwardBatch batch;
  batch.token_ids = tokens;
  batch.token_seq.assign(n, 0);
  batch.token_pos.resize(n);
  std::iota(batch.token_pos.begin(), batch.token_pos.end(), first);
  batch.slot_mapping = batch.token_pos;
  batch.num_seqs = 1;
  batch.max_blocks_per_seq = (first + n + block_size - 1) / block_size;
  batch.block_tables.resize(batch.max_blocks_per_seq);
  std::iota(batch.block_tables.begin(), batch.block_tables.end(), 0);
  batch.logit_rows.resize(n);
  std::iota(batch.logit_rows.begin(), batch.logit_rows.end(), 0);
  std::vector<float> logits(static_cast<size_t>(n) * vocab);
  const absl::Status status = w.model->Forward(batch, *w.cache, logits.data());
  EXPECT_TRUE(status.ok()) << status;
  return logits;
}

std::vector<int32_t> GreedyByPrefill(LocalWorker& w, std::vector<int32_t> prompt, int count) {
  const int vocab = w.model->config().vocab_size;
  std::vector<int32_t> out;
  for (int i = 0; i < count; ++i) {
    const std::vector<float> logits = PrefillLogits(w, prompt);
    const float* last = logits.data() + (prompt.size() - 1) * static_cast<size_t>(vocab);
    out.push_back(static_cast<int32_t>(std::max_element(last, last + vocab) - last));
    prompt.push_back(out.back());
  }
  return out;
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
