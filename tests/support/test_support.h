// Shared by the worker tests: where the generated test checkpoints are, their reference
// outputs, and an in-process worker (backend + model + KV cache + step engine).
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "tests/support/logits_recorder.h"
#include "worker/step_runner.h"

namespace conveyor::testing {

// The test checkpoints made by tests/make_test_data.sh (ctest runs it first).
std::string TestDataDir();
// The conveyor-worker and conveyor-scheduler binaries of this build.
std::string WorkerBinary();
std::string SchedulerBinary();
std::string TestModelDir(const std::string& variant);
std::vector<std::string> TestModelVariants();

// What tests/reference/llama_ref.py computed for a variant's prompts.
struct Reference {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<std::vector<float>>> logits;  // [prompt][position][vocab]
  std::vector<std::vector<int32_t>> greedy;             // [prompt][token]
};
Reference LoadReference(const std::string& variant);

struct LocalWorker {
  std::unique_ptr<kernels::Backend> backend;
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::KvCache> cache;
  std::unique_ptr<worker::StepRunner> engine;
  LogitsRecorder logits;  // The engine's logits tap.
  // Speculative decoding's draft model (AttachDraft), on the same backend.
  std::unique_ptr<model::LlamaModel> draft_model;
  std::unique_ptr<model::KvCache> draft_cache;

  // Aborts the test (ASSERT) on failure. `keep_quantized`: a GGUF file's block-quantized
  // weights stay in their blocks (MakeCpuBackend).
  static std::unique_ptr<LocalWorker> Create(
      const std::string& model_dir, int num_threads, int num_blocks, int block_size,
      kernels::CpuWeightDtype weights = kernels::CpuWeightDtype::kF32,
      kernels::CpuKvDtype kv = kernels::CpuKvDtype::kF32, bool keep_quantized = false);

  // Loads `draft_dir` as the engine's draft model, with a KV cache of as many blocks as
  // the model's (ASSERTs it loads).
  void AttachDraft(const std::string& draft_dir);
};

// The logits of positions [first, first + tokens.size()) of sequence 0 (blocks 0, 1, ...
// of w's cache, positions before `first` already computed), all in one forward pass:
// [tokens.size(), vocab]. Fails the test (EXPECT) when the pass fails.
std::vector<float> PrefillLogits(LocalWorker& w, const std::vector<int32_t>& tokens, int first = 0);

// `count` greedy tokens after `prompt`, each step a prefill of the whole sequence (for
// tiny models: no engine, no sampler, the argmax with ties to the lower id).
std::vector<int32_t> GreedyByPrefill(LocalWorker& w, std::vector<int32_t> prompt, int count);

// FNV-1a over 32-bit words: what the recorded-bits tests hash logits (their float32 bits)
// and tokens with.
class BitsHash {
 public:
  void Add(uint32_t word) {
    for (int i = 0; i < 4; ++i) {
      value_ = (value_ ^ ((word >> (8 * i)) & 0xff)) * 0x100000001b3ull;
    }
  }
  void Add(float f) {
    uint32_t word;
    std::memcpy(&word, &f, sizeof word);
    Add(word);
  }
  uint64_t value() const { return value_; }

 private:
  uint64_t value_ = 0xcbf29ce484222325ull;
};

// ‖a − b‖ / ‖b‖.
double RelativeError(const float* a, const float* b, size_t n);

}  // namespace conveyor::testing
