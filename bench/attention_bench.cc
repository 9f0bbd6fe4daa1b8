// attention_bench: the CPU paged-attention kernel alone, one thread, per instruction level,
// on decode and prefill shapes of the `small` and Llama-3-8B models, with the K/V bytes a
// call reads and the rate it reads them at (decode attention reads every position's K and
// V once per KV head: it should run at memory speed, not at shuffle speed).
//
// Usage: attention_bench [--seconds S (default 0.3 per case)] [--only NAME_PART]
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

namespace conveyor::kernels {
namespace {

struct Case {
  const char* name;
  int num_heads, num_kv_heads, head_dim;
  int seqs, tokens_per_seq, context;  // Each sequence's last token sits at context - 1.
};

constexpr int kBlockSize = 16;

double Run(const Case& c, CpuKvDtype kv, internal::AttentionTileKernel kernel, double seconds,
           double* bytes) {
  const int blocks_per_seq = (c.context + kBlockSize - 1) / kBlockSize;
  const size_t slot_floats = static_cast<size_t>(c.num_kv_heads) * c.head_dim;
  const size_t slots = static_cast<size_t>(c.seqs) * blocks_per_seq * kBlockSize;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  // The cache in the CPU backend's own memory (2 MiB pages where the kernel allows), as
  // the worker allocates it: 4 KiB pages would add a TLB miss per block.
  const size_t cache_elems = slots * slot_floats;
  const size_t elem_bytes = kv == CpuKvDtype::kBf16 ? 2 : 4;
  static std::unique_ptr<Backend> backend = MakeCpuBackend(1);
  auto allocate = [&](size_t count) {
    absl::StatusOr<void*> p = backend->Allocate(count * elem_bytes);
    if (!p.ok()) std::abort();
    return std::unique_ptr<void, std::function<void(void*)>>(*p, [](void* f) { backend->Free(f); });
  };
  auto k_buf = allocate(cache_elems), v_buf = allocate(cache_elems);
  for (void* cache : {k_buf.get(), v_buf.get()}) {
    for (size_t i = 0; i < cache_elems; ++i) {
      const float x = normal(rng);
      if (kv == CpuKvDtype::kBf16) {
        static_cast<uint16_t*>(cache)[i] = internal::ToBf16(x);
      } else {
        static_cast<float*>(cache)[i] = x;
      }
    }
  }
  // Blocks shuffled over the pool, as a running server's are.
  std::vector<int32_t> table(static_cast<size_t>(c.seqs) * blocks_per_seq);
  for (size_t i = 0; i < table.size(); ++i) table[i] = static_cast<int32_t>(i);
  std::shuffle(table.begin(), table.end(), rng);
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
  batch.block_tables = table.data();
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

  double best = 1e30;
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  do {
    const auto start = std::chrono::steady_clock::now();
    internal::PagedAttentionWith(kernel, args, nullptr);
    best = std::min(
        best, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  } while (std::chrono::steady_clock::now() < until);
  return best;
}

int Main(int argc, char** argv) {
  double seconds = 0.3;
  const char* only = "";  // Runs only the cases whose name contains this.
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--seconds") == 0) seconds = std::atof(argv[i + 1]);
    if (std::strcmp(argv[i], "--only") == 0) only = argv[i + 1];
  }
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
  };
  std::printf("PagedAttention, one thread, best over %.1f s; K/V MB read per call\n", seconds);
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
        const double s = Run(c, kv, l.kernel, seconds, &bytes);
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
