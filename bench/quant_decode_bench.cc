// quant_decode_bench: decode ms per step of one GGUF file with its linear weights kept in
// their blocks (quant_gemm.h) against the same file dequantized into int8, bf16 (or f32)
// weights, in one process, at batch 1, 8 and 32; and the bytes-read floor of a step (the
// linear weights' bytes over the measured read bandwidth). Also the GEMM alone: the
// quantized kernel on every block type against the int8 kernel (float32 FMAs on widened
// weights) on the same shape, the measurement behind docs/cpu-weights.md's choice.
//
// Usage: quant_decode_bench --model FILE.gguf [--threads N] [--steps N]
//        [--storages "quantized int8 bf16"] [--gemm_k K --gemm_n N]
#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_split.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "model/kv_cache.h"
#include "model/model.h"

namespace conveyor {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kBlockSize = 16;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

template <typename T>
T OrDie(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) {
    std::fprintf(stderr, "%s: %s\n", what, v.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*v);
}

// Sums 64-byte lines [p, end) with four independent accumulators: a loop that waits on
// memory, never on its additions. AVX-512 where the CPU has it (full-line loads read
// about 1.6x what 16-byte ones do on the Xeon VMs here), 16-byte vectors otherwise.
__attribute__((target("avx512f"))) uint64_t SumLinesAvx512(const char* p, const char* end) {
  __m512i s0 = _mm512_setzero_si512(), s1 = s0, s2 = s0, s3 = s0;
  for (; p + 256 <= end; p += 256) {
    s0 = _mm512_add_epi64(s0, _mm512_load_si512(p));
    s1 = _mm512_add_epi64(s1, _mm512_load_si512(p + 64));
    s2 = _mm512_add_epi64(s2, _mm512_load_si512(p + 128));
    s3 = _mm512_add_epi64(s3, _mm512_load_si512(p + 192));
  }
  return _mm512_reduce_add_epi64(
      _mm512_add_epi64(_mm512_add_epi64(s0, s1), _mm512_add_epi64(s2, s3)));
}

uint64_t SumLines(const char* p, const char* end) {
  using V = uint64_t __attribute__((vector_size(16)));
  V s[4] = {};
  for (; p + 64 <= end; p += 64) {
    for (int j = 0; j < 4; ++j) s[j] += *reinterpret_cast<const V*>(p + 16 * j);
  }
  const V total = s[0] + s[1] + s[2] + s[3];
  return total[0] + total[1];
}

// Read bandwidth over a 2 GiB buffer (beyond any cache: L3s reach a few hundred MiB),
// each thread its half, best of 3, GB/s: the most this machine streams, which the bytes
// a decode step reads are held against.
double ReadBandwidth(kernels::ThreadPool* pool) {
  const size_t n = size_t{2} << 30;
  char* buf = static_cast<char*>(std::aligned_alloc(64, n));
  std::memset(buf, 1, n);
  const bool avx512 = __builtin_cpu_supports("avx512f");
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<uint64_t> sums(pool->num_threads() * 8, 0);
    const auto start = Clock::now();
    pool->ParallelFor(pool->num_threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const char* lo = buf + n / pool->num_threads() * t;
        const char* hi = lo + n / pool->num_threads();
        sums[t * 8] = avx512 ? SumLinesAvx512(lo, hi) : SumLines(lo, hi);
      }
    });
    const double s = Seconds(start);
    if (pass > 0) best = std::max(best, n / s / 1e9);
    if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 0) std::abort();
  }
  std::free(buf);
  return best;
}

// ms per decode step of `batch` sequences (positions 0, 1, ...), median of `steps`.
double DecodeMs(model::LlamaModel& m, const model::KvCache& cache, int batch, int steps) {
  const int blocks_per_seq = (steps + 4 + kBlockSize - 1) / kBlockSize;
  std::vector<float> logits(static_cast<size_t>(batch) * m.config().vocab_size);
  std::vector<double> times;
  model::ForwardBatch fb;
  for (int step = 0; step < steps + 3; ++step) {
    fb.Clear();
    fb.num_seqs = batch;
    fb.max_blocks_per_seq = blocks_per_seq;
    for (int s = 0; s < batch; ++s) {
      fb.token_ids.push_back((step * 31 + s * 7) % m.config().vocab_size);
      fb.token_seq.push_back(s);
      fb.token_pos.push_back(step);
      fb.slot_mapping.push_back(s * blocks_per_seq * kBlockSize + step);
      fb.logit_rows.push_back(s);
      for (int b = 0; b < blocks_per_seq; ++b) fb.block_tables.push_back(s * blocks_per_seq + b);
    }
    const auto start = Clock::now();
    const absl::Status st = m.Forward(fb, cache, logits.data());
    if (!st.ok()) {
      std::fprintf(stderr, "forward: %s\n", st.ToString().c_str());
      std::exit(1);
    }
    if (step >= 3) times.push_back(Seconds(start) * 1e3);
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// Random blocks of `type` for `rows` rows of `k`: random bytes (every code) with every fp16
// scale set to 2^-8, so the sums stay finite.
std::vector<uint8_t> RandomBlocks(kernels::QuantBlockType type, int rows, int k,
                                  std::mt19937& rng) {
  using kernels::QuantBlockType;
  std::vector<uint8_t> bytes(kernels::QuantRowBytes(type, k) * rows);
  for (uint8_t& b : bytes) b = static_cast<uint8_t>(rng());
  const uint16_t half = 0x1c00;    // 2^-8 as fp16.
  std::vector<int> offsets = {0};  // Where a block's fp16 fields are.
  if (type == QuantBlockType::kQ4_1 || type == QuantBlockType::kQ4_K ||
      type == QuantBlockType::kQ5_K) {
    offsets = {0, 2};
  } else if (type == QuantBlockType::kQ6_K) {
    offsets = {208};
  }
  const int block_bytes = kernels::QuantBlockBytes(type);
  for (size_t at = 0; at < bytes.size(); at += block_bytes) {
    for (int o : offsets) std::memcpy(bytes.data() + at + o, &half, sizeof(half));
  }
  return bytes;
}

// The quantized kernel on each block type against the int8 kernel (float32 FMAs on widened
// weights), one [n, k] weight, m rows: ms per call (median of 15) and GMAC/s.
void GemmComparison(int n, int k, kernels::ThreadPool* pool) {
  using kernels::QuantBlockType;
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  std::vector<float> w(static_cast<size_t>(n) * k);
  for (float& v : w) v = normal(rng) * 0.02f;
  kernels::PackedGemmWeight int8;
  int8.panels = std::aligned_alloc(
      64, (kernels::PackedGemmPanelBytes(kernels::CpuWeightDtype::kInt8, n, k) + 63) / 64 * 64);
  int8.scales = static_cast<float*>(std::aligned_alloc(
      64, (kernels::PackedGemmScaleBytes(kernels::CpuWeightDtype::kInt8, n) + 63) / 64 * 64));
  kernels::PackGemmWeightAs(kernels::CpuWeightDtype::kInt8, w.data(), n, k, &int8);
  const std::pair<QuantBlockType, const char*> types[] = {
      {QuantBlockType::kQ8_0, "Q8_0"}, {QuantBlockType::kQ4_0, "Q4_0"},
      {QuantBlockType::kQ4_1, "Q4_1"}, {QuantBlockType::kQ4_K, "Q4_K"},
      {QuantBlockType::kQ5_K, "Q5_K"}, {QuantBlockType::kQ6_K, "Q6_K"}};
  struct Packed {
    std::vector<uint8_t> blocks;
    void* memory = nullptr;
    std::vector<kernels::QuantizedRows> parts;
  };
  std::vector<Packed> packed(std::size(types));
  for (size_t t = 0; t < std::size(types); ++t) {
    packed[t].blocks = RandomBlocks(types[t].first, n, k, rng);
    const kernels::QuantizedRows part{types[t].first, n, packed[t].blocks.data()};
    packed[t].memory = std::aligned_alloc(64, kernels::QuantizedPackBytes({&part, 1}, k));
    packed[t].parts = kernels::PackQuantized({&part, 1}, k, packed[t].memory);
  }
  std::printf("\nGEMM alone, [%d x %d] weight, %d threads: ms per call (median of 15), GMAC/s\n", n,
              k, pool->num_threads());
  std::printf("  %5s %16s", "m", "int8 (FMA)");
  for (const auto& type : types) std::printf(" %16s", type.second);
  std::printf("\n");
  for (int m : {1, 8, 32, 64, 256}) {
    std::vector<float> x(static_cast<size_t>(m) * k), y(static_cast<size_t>(m) * n);
    for (float& v : x) v = normal(rng);
    auto time = [&](auto&& call) {
      std::vector<double> t;
      for (int r = 0; r < 18; ++r) {
        const auto start = Clock::now();
        call();
        if (r >= 3) t.push_back(Seconds(start) * 1e3);
      }
      std::sort(t.begin(), t.end());
      return t[t.size() / 2];
    };
    const double macs = static_cast<double>(m) * n * k;
    auto print = [&](double ms) { std::printf(" %8.3f (%5.0f)", ms, macs / ms / 1e6); };
    std::printf("  %5d", m);
    print(time([&] { kernels::GemmPackedAs(x.data(), k, m, int8, nullptr, y.data(), n, pool); }));
    for (const Packed& p : packed) {
      print(time(
          [&] { kernels::GemmQuantized(x.data(), k, m, k, p.parts, nullptr, y.data(), n, pool); }));
    }
    std::printf("\n");
  }
  std::free(int8.panels);
  std::free(int8.scales);
  for (Packed& p : packed) std::free(p.memory);
}

int Main(int argc, char** argv) {
  std::string path;
  int threads = 0, steps = 20, gemm_n = 4096, gemm_k = 4096;
  std::string storages = "quantized int8 bf16";
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model")
      path = v;
    else if (a == "--threads")
      threads = std::atoi(v.c_str());
    else if (a == "--steps")
      steps = std::atoi(v.c_str());
    else if (a == "--storages")
      storages = v;
    else if (a == "--gemm_n")
      gemm_n = std::atoi(v.c_str());
    else if (a == "--gemm_k")
      gemm_k = std::atoi(v.c_str());
  }
  if (path.empty()) {
    std::fprintf(stderr,
                 "usage: quant_decode_bench --model FILE.gguf [--threads N] [--steps N]"
                 " [--storages \"quantized int8 bf16\"] [--gemm_n N --gemm_k K]\n");
    return 2;
  }
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::ThreadPool pool(threads);
  const double gbs = ReadBandwidth(&pool);
  std::printf("%s, %d threads; read bandwidth %.1f GB/s; quantized kernel %s\n", path.c_str(),
              threads, gbs, kernels::QuantGemmKernelName());
  GemmComparison(gemm_n, gemm_k, &pool);
  std::printf("\n%-10s %12s %10s %10s %10s %10s %10s\n", "storage", "weights MB", "b=1 ms",
              "floor ms", "of floor", "b=8 ms", "b=32 ms");
  for (const std::string& storage :
       std::vector<std::string>(absl::StrSplit(storages, ' ', absl::SkipEmpty()))) {
    const bool quantized = storage == "quantized";
    const kernels::CpuWeightDtype dtype = storage == "bf16"   ? kernels::CpuWeightDtype::kBf16
                                          : storage == "int8" ? kernels::CpuWeightDtype::kInt8
                                                              : kernels::CpuWeightDtype::kF32;
    auto backend = kernels::MakeCpuBackend(threads, dtype, kernels::CpuKvDtype::kBf16, quantized);
    auto m = OrDie(model::LlamaModel::Load(path, backend.get()), "loading");
    const ModelConfig& c = m->config();
    const int blocks = 32 * ((steps + 4 + kBlockSize - 1) / kBlockSize);
    auto cache = OrDie(model::KvCache::Create(backend.get(), c.num_layers, c.num_kv_heads,
                                              c.head_dim, kBlockSize, blocks),
                       "kv cache");
    // What a decode step reads: every weight but the embedding table (one row per token).
    const double embedding_bytes = 4.0 * c.vocab_size * c.hidden_size;
    const double read_bytes = m->weight_bytes() - embedding_bytes;
    // Batch 1 against its floor in 3 paired rounds, each against the read bandwidth
    // measured just before it (it drifts by 10% between minutes on a shared VM): the
    // median round.
    std::vector<std::pair<double, double>> rounds;  // (floor ÷ step, step ms)
    for (int round = 0; round < 3; ++round) {
      const double round_gbs = ReadBandwidth(&pool);
      const double ms = DecodeMs(*m, *cache, 1, steps);
      rounds.emplace_back(read_bytes / (round_gbs * 1e9) * 1e3 / ms, ms);
    }
    std::sort(rounds.begin(), rounds.end());
    const auto [of_floor, one] = rounds[1];
    const double eight = DecodeMs(*m, *cache, 8, steps);
    const double thirty_two = DecodeMs(*m, *cache, 32, steps);
    std::printf("%-10s %12.1f %10.2f %10.2f %9.0f%% %10.2f %10.2f\n", storage.c_str(),
                read_bytes / 1e6, one, of_floor * one, 100.0 * of_floor, eight, thirty_two);
  }
  return 0;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) { return conveyor::Main(argc, argv); }
