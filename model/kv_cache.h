// The paged KV cache memory of one worker rank: per layer, K and V slabs of
// num_blocks × block_size slots. Block ownership is the scheduler's business; the
// worker only reads and writes the slots that a step's block tables name.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace conveyor::model {

class KvCache {
 public:
  // Bytes one block takes across all layers (K and V) for the given shape.
  static size_t BytesPerBlock(int num_layers, int num_kv_heads, int head_dim, int block_size,
                              size_t element_bytes);

  // Allocates `num_blocks` blocks on `backend`, which must outlive the cache.
  static absl::StatusOr<std::unique_ptr<KvCache>> Create(kernels::Backend* backend, int num_layers,
                                                         int num_kv_heads, int head_dim,
                                                         int block_size, int num_blocks);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  kernels::KvLayer layer(int i) const { return layers_[i]; }
  int num_blocks() const { return num_blocks_; }
  int block_size() const { return block_size_; }
  size_t size_bytes() const { return size_bytes_; }

 private:
  KvCache(kernels::Backend* backend, int block_size, int num_blocks)
      : backend_(backend), block_size_(block_size), num_blocks_(num_blocks) {}

  kernels::Backend* backend_;
  int block_size_;
  int num_blocks_;
  size_t size_bytes_ = 0;
  std::vector<kernels::KvLayer> layers_;
};

}  // namespace conveyor::model
