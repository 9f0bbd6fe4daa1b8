// One tensor-parallel rank's model runtime, built on a Device in one call: its backend,
// its communicator to the other ranks, the model shard, the activations the largest step
// needs, the device sampler and the paged KV cache sized from a budget. The worker's Init
// only wires a Rank to its step engine; whoever holds the Rank holds the memory.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/communicator.h"
#include "model/device.h"
#include "model/device_sampler.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace conveyor::model {

struct RankOptions {
  std::string model_path;
  int rank = 0;
  int world_size = 1;
  // Rank 0's CreateCollectiveId, handed to every rank of the group; empty for one rank.
  std::string collective_id;
  int block_size = 16;  // Tokens per KV block.
  // The largest step (tokens, sequences) the activations and the sampler are sized for.
  int max_step_tokens = 8192;
  int max_num_seqs = 256;
  // KV-cache bytes; 0 takes the device's default budget. With a draft model, its cache
  // comes out of the same bytes: both hold the same number of blocks.
  uint64_t kv_cache_bytes = 0;
  // Speculative decoding: a small model of the same vocabulary, loaded beside the model
  // on the same backend and communicator (sharded alike). Empty: none.
  std::string draft_model_path;
};

class Rank {
 public:
  // Loads the rank's shard of `options.model_path` on `device`, waiting for the other ranks
  // until `deadline`. Rank 0 ends its rendezvous (Device::EndRendezvous) once the group has
  // connected, or when this fails earlier: its collective id serves one attempt. `device`
  // must outlive the Rank.
  static absl::StatusOr<std::unique_ptr<Rank>> Create(
      Device& device, const RankOptions& options, std::chrono::system_clock::time_point deadline);
  ~Rank();
  Rank(const Rank&) = delete;
  Rank& operator=(const Rank&) = delete;

  LlamaModel& model() { return *model_; }
  KvCache& cache() { return *cache_; }
  // The draft model and its KV cache (as many blocks as cache()'s); null without one.
  LlamaModel* draft_model() { return draft_model_.get(); }
  KvCache* draft_cache() { return draft_cache_.get(); }
  const ModelConfig& config() const { return model_->config(); }
  // The device sampler (null where logits are host memory already); the caller takes it.
  std::unique_ptr<DeviceSampler> TakeDeviceSampler() { return std::move(device_sampler_); }

  std::string backend_name() const { return backend_->name(); }
  // "float32" or "bfloat16": what the activations are computed in.
  std::string_view compute_dtype() const;
  // The model's and the draft model's.
  uint64_t weight_bytes() const {
    return model_->weight_bytes() + (draft_model_ ? draft_model_->weight_bytes() : 0);
  }
  double load_ms() const { return load_ms_; }

 private:
  Rank() = default;
  // Loads options.draft_model_path beside the model, after it.
  static absl::Status LoadDraft(Rank& rank, const RankOptions& options);

  // In construction order; destroyed in reverse (the cache and model before the backend).
  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<LlamaModel> draft_model_;
  std::unique_ptr<DeviceSampler> device_sampler_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<KvCache> draft_cache_;
  double load_ms_ = 0;
};

}  // namespace conveyor::model
