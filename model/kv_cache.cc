#include "model/kv_cache.h"

#include "absl/strings/str_cat.h"

namespace conveyor::model {

size_t KvCache::BytesPerBlock(int num_layers, int num_kv_heads, int head_dim, int block_size,
                              size_t element_bytes) {
  return 2ull * num_layers * num_kv_heads * head_dim * block_size * element_bytes;
}

absl::StatusOr<std::unique_ptr<KvCache>> KvCache::Create(kernels::Backend* backend, int num_layers,
                                                         int num_kv_heads, int head_dim,
                                                         int block_size, int num_blocks) {
  if (num_blocks <= 0) {
    return absl::ResourceExhaustedError(
        "the KV-cache budget does not hold a single block; raise kv_cache_bytes");
  }
  std::unique_ptr<KvCache> cache(new KvCache(backend, block_size, num_blocks));
  const size_t slab_bytes = static_cast<size_t>(num_blocks) * block_size * num_kv_heads * head_dim *
                            backend->kv_element_bytes();
  for (int i = 0; i < num_layers; ++i) {
    kernels::KvLayer layer;
    layer.block_size = block_size;
    auto k = backend->Allocate(slab_bytes);
    if (!k.ok()) return k.status();
    layer.k = *k;
    auto v = backend->Allocate(slab_bytes);
    if (!v.ok()) {
      backend->Free(layer.k);
      return v.status();
    }
    layer.v = *v;
    cache->layers_.push_back(layer);
    cache->size_bytes_ += 2 * slab_bytes;
  }
  return cache;
}

KvCache::~KvCache() {
  for (const kernels::KvLayer& layer : layers_) {
    backend_->Free(layer.k);
    backend_->Free(layer.v);
  }
}

}  // namespace conveyor::model
