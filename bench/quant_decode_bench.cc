// quant_decode_bench: decode ms per step of one GGUF file with its linear weights kept in
// their blocks (quant_gemm.h) against the same file dequantized into int8, bf16 (or f32)
// weights, in one process, at batch 1 and 8; and the bytes-read floor of a step (the
// linear weights' bytes over the measured read bandwidth). Also the GEMM alone: the
// quantized kernel on Q8_0 blocks against the int8 kernel (float32 FMAs on widened
// weights) on the same shape, the measurement behind docs/cpu-weights.md's choice.
//
// Usage: quant_decode_bench --model FILE.gguf [--threads N] [--steps N]
//        [--storages "quantized int8 bf16"] [--gemm_k K --gemm_n N]
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

// Read bandwidth over a 1 GiB buffer (beyond any cache), best of 3, GB/s.
double ReadBandwidth(kernels::ThreadPool* pool) {
  const size_t n = (size_t{1} << 30) / sizeof(uint64_t);
  std::vector<uint64_t> buf(n, 1);
  double best = 0;
  for (int pass = 0; pass < 4; ++pass) {
    std::vector<uint64_t> sums(pool->num_threads() * 8, 0);
    const auto start = Clock::now();
    pool->ParallelFor(pool->num_threads(), 1, [&](int64_t b, int64_t e) {
      for (int64_t t = b; t < e; ++t) {
        const size_t lo = n / pool->num_threads() * t, hi = n / pool->num_threads() * (t + 1);
        uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
        for (size_t i = lo; i < hi; i += 4) {
          s0 += buf[i];
          s1 += buf[i + 1];
          s2 += buf[i + 2];
          s3 += buf[i + 3];
        }
        sums[t * 8] = s0 + s1 + s2 + s3;
      }
    });
    const double s = Seconds(start);
    if (pass > 0) best = std::max(best, n * sizeof(uint64_t) / s / 1e9);
    if (std::accumulate(sums.begin(), sums.end(), uint64_t{0}) == 0) std::abort();
  }
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

// The quantized kernel on Q8_0 blocks against the int8 kernel, one [n, k] weight, m rows:
// ms per call, median of 15.
void GemmComparison(int n, int k, kernels::ThreadPool* pool) {
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
  // Q8_0 blocks: fp16 d = 1/127 of the block's largest, then the int8 values.
  std::vector<uint8_t> q8(kernels::QuantRowBytes(kernels::QuantBlockType::kQ8_0, k) * n);
  for (size_t b = 0; b < w.size() / 32; ++b) {
    uint8_t* blk = q8.data() + b * 34;
    const uint16_t d = 0x1c00;  // 2^-8 as fp16.
    std::memcpy(blk, &d, 2);
    for (int i = 0; i < 32; ++i) {
      blk[2 + i] =
          static_cast<uint8_t>(std::clamp(static_cast<int>(w[b * 32 + i] * 256), -127, 127));
    }
  }
  const kernels::QuantizedRows part{kernels::QuantBlockType::kQ8_0, n, q8.data()};
  void* packed_memory = std::aligned_alloc(64, kernels::QuantizedPackBytes({&part, 1}, k));
  const std::vector<kernels::QuantizedRows> packed =
      kernels::PackQuantized({&part, 1}, k, packed_memory);
  std::printf("\nGEMM alone, [%d x %d] weight, %d threads: ms per call (median of 15)\n", n, k,
              pool->num_threads());
  std::printf("  %5s %22s %22s %8s\n", "m", "int8 (widen + FMA)", "Q8_0 (int8 dot, VNNI)", "ratio");
  for (int m : {1, 8, 64, 256}) {
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
    const double a =
        time([&] { kernels::GemmPackedAs(x.data(), k, m, int8, nullptr, y.data(), n, pool); });
    const double b = time(
        [&] { kernels::GemmQuantized(x.data(), k, m, k, packed, nullptr, y.data(), n, pool); });
    std::printf("  %5d %22.3f %22.3f %8.2f\n", m, a, b, a / b);
  }
  std::free(int8.panels);
  std::free(int8.scales);
  std::free(packed_memory);
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
  std::printf("\n%-10s %12s %10s %10s %10s %10s\n", "storage", "weights MB", "b=1 ms", "floor ms",
              "of floor", "b=8 ms");
  for (const std::string& storage :
       std::vector<std::string>(absl::StrSplit(storages, ' ', absl::SkipEmpty()))) {
    const bool quantized = storage == "quantized";
    const kernels::CpuWeightDtype dtype = storage == "bf16"   ? kernels::CpuWeightDtype::kBf16
                                          : storage == "int8" ? kernels::CpuWeightDtype::kInt8
                                                              : kernels::CpuWeightDtype::kF32;
    auto backend = kernels::MakeCpuBackend(threads, dtype, kernels::CpuKvDtype::kBf16, quantized);
    auto m = OrDie(model::LlamaModel::Load(path, backend.get()), "loading");
    const ModelConfig& c = m->config();
    const int blocks = 8 * ((steps + 4 + kBlockSize - 1) / kBlockSize);
    auto cache = OrDie(model::KvCache::Create(backend.get(), c.num_layers, c.num_kv_heads,
                                              c.head_dim, kBlockSize, blocks),
                       "kv cache");
    // What a decode step reads: every weight but the embedding table (one row per token).
    const double embedding_bytes = 4.0 * c.vocab_size * c.hidden_size;
    const double read_bytes = m->weight_bytes() - embedding_bytes;
    const double one = DecodeMs(*m, *cache, 1, steps);
    const double eight = DecodeMs(*m, *cache, 8, steps);
    const double floor_ms = read_bytes / (gbs * 1e9) * 1e3;
    std::printf("%-10s %12.1f %10.2f %10.2f %9.0f%% %10.2f\n", storage.c_str(), read_bytes / 1e6,
                one, floor_ms, 100.0 * floor_ms / one, eight);
  }
  return 0;
}

}  // namespace
}  // namespace conveyor

int main(int argc, char** argv) { return conveyor::Main(argc, argv); }
