// attention_bench: the CPU paged-attention kernel alone (one thread unless --threads), per
// instruction level, on decode and prefill shapes of the `small` and Llama-3-8B models, with the
// K/V bytes a call reads and the rate it reads them at (decode attention reads every position's K
// and V once per KV head: it should run at memory speed, not at shuffle speed).
//
// By default one call's K/V stay in the caches between repetitions, which measures the
// kernel's arithmetic. `--cold` gives each repetition its own copy of the K/V, enough
// copies to span 256 MiB, so every call reads them from memory as a decode step does
// (the step's weights have pushed last layer's K/V out of the caches).
//
// Usage: attention_bench [--seconds S (default 0.3 per case)] [--only NAME_PART] [--cold]
//                        [--threads N (default 1; more split the call as the worker does)]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cpu/attention.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm_kernels.h"  // ToBf16
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace {

struct Case {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  int seqs, tokens_per_seq, context;  // Each sequence's last token sits at context - 1.
};

constexpr int kBlockSize = 16;

// The reference the kernels are measured against: a tile's K and V lines read and
// nothing else (a word of each line summed), in the kernels' order of blocks. In --cold
// mode it is what memory gives this access pattern on this machine.
volatile uint64_t g_sink;
void ReadTile(const internal::AttentionArgs& args, const internal::AttentionTile& tile) {
  const AttentionBatch& batch = *args.batch;
  const int last_pos = batch.token_pos[tile.first_token] + tile.num_tokens - 1;
  const int32_t* table =
      batch.block_tables +
      static_cast<size_t>(batch.token_seq[tile.first_token]) * batch.max_blocks_per_seq;
  const size_t elem_bytes = args.kv_dtype == CpuKvDtype::kBf16 ? 2 : 4;
  const size_t head_bytes =
      static_cast<size_t>(args.shape.head_dim) * batch.block_size * elem_bytes;
  const auto* k_cache = static_cast<const char*>(args.k_cache);
  const auto* v_cache = static_cast<const char*>(args.v_cache);
  uint64_t sum = 0;
  for (int b = 0; b * batch.block_size <= last_pos; ++b) {
    const size_t base =
        (static_cast<size_t>(table[b]) * args.shape.num_kv_heads + tile.kv_head) * head_bytes;
    for (size_t o = 0; o < head_bytes; o += 64) {
      uint64_t k, v;
      std::memcpy(&k, k_cache + base + o, sizeof(k));
      std::memcpy(&v, v_cache + base + o, sizeof(v));
      sum += k + v;
    }
  }
  g_sink = sum;
}

struct Options {
  double seconds = 0.3;
  bool cold = false;
  ThreadPool* pool = nullptr;  // nullptr: the caller's thread alone.
};

// Seconds per call: the best over the time given, or with --cold the median (a call's
// memory traffic varies with what the other copies left behind).
double Run(const Case& c, CpuKvDtype kv, internal::AttentionTileKernel kernel,
           const Options& options, double* bytes) {
  const int blocks_per_seq = (c.context + kBlockSize - 1) / kBlockSize;
  const size_t slot_floats = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t slots = static_cast<size_t>(c.seqs) * blocks_per_seq * kBlockSize;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // The cache in the CPU backend's own memory (2 MiB pages where the kernel allows), as
  // the worker allocates it: 4 KiB pages would add a TLB miss per block.
  const size_t cache_elems = slots * slot_floats;
  const size_t elem_bytes = kv == CpuKvDtype::kBf16 ? 2 : 4;
  constexpr size_t kColdBytes = size_t{256} << 20;
  const size_t copies =
      options.cold ? std::max<size_t>(1, kColdBytes / (2 * cache_elems * elem_bytes)) : 1;
  static std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  auto allocate = [&](size_t count) {
    absl::StatusOr<void*> p = backend->Allocate(count * elem_bytes);
    if (!p.ok()) std::abort();
    return std::unique_ptr<void, std::function<void(void*)>>(*p, [](void* f) { backend->Free(f); });
  };
  auto k_buf = allocate(copies * cache_elems), v_buf = allocate(copies * cache_elems);
  for (void* cache : {k_buf.get(), v_buf.get()}) {
    for (size_t i = 0; i < cache_elems; ++i) {
      const float x = normal(rng);
      if (kv == CpuKvDtype::kBf16) {
        static_cast<uint16_t*>(cache)[i] = internal::ToBf16(x);
      } else {
        static_cast<float*>(cache)[i] = x;
      }
    }
    char* base = static_cast<char*>(cache);
    for (size_t copy = 1; copy < copies; ++copy) {
      std::memcpy(base + copy * cache_elems * elem_bytes, base, cache_elems * elem_bytes);
    }
  }
  // Blocks shuffled over the pool, as a running server's are.
  // Copy i is the same blocks, i * (blocks of one copy) further on.
  const size_t table_size = static_cast<size_t>(c.seqs) * blocks_per_seq;
  std::vector<int32_t> tables(copies * table_size);
  for (size_t i = 0; i < table_size; ++i) tables[i] = static_cast<int32_t>(i);
  std::shuffle(tables.begin(), tables.begin() + table_size, rng);
  for (size_t copy = 1; copy < copies; ++copy) {
    for (size_t i = 0; i < table_size; ++i) {
      tables[copy * table_size + i] = tables[i] + static_cast<int32_t>(copy * table_size);
    }
  }
  const int n = c.seqs * c.tokens_per_seq;
  std::vector<int32_t> token_seq, token_pos;
  for (int s = 0; s < c.seqs; ++s) {
    for (int t = 0; t < c.tokens_per_seq; ++t) {
      token_seq.push_back(s);
      token_pos.push_back(c.context - c.tokens_per_seq + t);
    }
  }
  const int q_dim = c.num_heads * c.head_dim;
  std::vector<float> q(static_cast<size_t>(n) * q_dim), out(q.size());
  for (float& x : q) x = normal(rng);

  AttentionBatch batch;
  batch.num_tokens = n;
  batch.token_seq = token_seq.data();
  batch.token_pos = token_pos.data();
  batch.num_seqs = c.seqs;
  batch.block_tables = tables.data();
  batch.max_blocks_per_seq = blocks_per_seq;
  batch.block_size = kBlockSize;
  internal::AttentionArgs args;
  args.q = q.data();
  args.q_row_stride = q_dim;
  args.batch = &batch;
  args.shape = {c.num_heads, c.num_kv_heads, c.head_dim,
                1.0f / std::sqrt(static_cast<float>(c.head_dim))};
  args.k_cache = k_buf.get();
  args.v_cache = v_buf.get();
  args.kv_dtype = kv;
  args.out = out.data();
  *bytes = 2.0 * c.seqs * c.context * slot_floats * elem_bytes;

  std::vector<double> times;
  const auto until =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(options.seconds);
  size_t copy = 0;
  do {
    batch.block_tables = tables.data() + copy * table_size;
    copy = (copy + 1) % copies;
    const auto start = std::chrono::steady_clock::now();
    internal::PagedAttentionWith(kernel, args, options.pool);
    times.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } while (std::chrono::steady_clock::now() < until);
  if (!options.cold) return *std::min_element(times.begin(), times.end());
  std::nth_element(times.begin(), times.begin() + times.size() / 2, times.end());
  return times[times.size() / 2];
}

int Main(int argc, char** argv) {
  Options options;
  int threads = 1;
  const char* only = "";  // Runs only the cases whose name contains this.
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--cold") == 0) options.cold = true;
    if (i + 1 == argc) break;
    if (std::strcmp(argv[i], "--seconds") == 0) options.seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
    if (std::strcmp(argv[i], "--threads") == 0) threads = std::max(1, std::atoi(argv[i + 1]));
  }
  std::unique_ptr<ThreadPool> pool;
  if (threads > 1) pool = std::make_unique<ThreadPool>(threads);
  options.pool = pool.get();
  const Case cases[] = {
      {"small decode b=1 ctx 232", 12, 4, 64, 1, 1, 232},
      {"small decode b=8 ctx 198", 12, 4, 64, 8, 1, 198},
      {"small decode b=64 ctx 130", 12, 4, 64, 64, 1, 130},
      {"small prefill 1x512", 12, 4, 64, 1, 512, 512},
      {"8b decode b=8 ctx 1024", 32, 8, 128, 8, 1, 1024},
  };
  struct Level {
    const char* name;
    CpuIsa isa;
    internal::AttentionTileKernel kernel;
  };
  const Level levels[] = {
      {"avx512", CpuIsa::kAvx512, internal::AttentionTileAvx512},
      {"avx2", CpuIsa::kAvx2, internal::AttentionTileAvx2},
      {"portable", CpuIsa::kPortable, internal::AttentionTilePortable},
      {"read alone", CpuIsa::kPortable, ReadTile},
  };
  std::printf("PagedAttention, %d thread%s, %s over %.1f s; K/V MB read per call\n", threads,
              threads == 1 ? "" : "s",
              options.cold ? "median, K/V from memory (--cold)," : "best, K/V in cache,",
              options.seconds);
  std::printf("  %-28s %4s %8s", "case", "KV", "K/V MB");
  for (const Level& l : levels) std::printf(" %10s ms %6s", l.name, "GB/s");
  std::printf("\n");
  for (const Case& c : cases) {
    if (std::strstr(c.name, only) == nullptr) continue;
    for (CpuKvDtype kv : {CpuKvDtype::kF32, CpuKvDtype::kBf16}) {
      double bytes = 0;
      std::printf("  %-28s %4s", c.name, CpuKvDtypeName(kv));
      bool first = true;
      for (const Level& l : levels) {
        if (DetectedCpuIsa() < l.isa) {
          std::printf(" %10s    %6s", "-", "-");
          continue;
        }
        const double s = Run(c, kv, l.kernel, options, &bytes);
        if (first) std::printf(" %8.2f", bytes / 1e6), first = false;
        std::printf(" %10.3f    %6.1f", s * 1e3, bytes / s / 1e9);
      }
      std::printf("\n");
    }
  }
  return 0;
}

}  // namespace
}  // namespace conveyor::kernels

int main(int argc, char** argv) { return conveyor::kernels::Main(argc, argv); }
