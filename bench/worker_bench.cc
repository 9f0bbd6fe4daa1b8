// Benchmarks the CPU worker on a real checkpoint through StepRunner::Step (the path a
// worker takes for every step, minus gRPC) and rates it against this machine's ceilings,
// measured in the same run under the same environment:
//   - memory read bandwidth, which bounds decode at small batches (every token streams
//     all weights);
//   - sgemm throughput of OpenBLAS and of our batch-invariant GemmPacked, which bounds
//     prefill and large-batch decode.
// It also replays a step's GEMMs and attention alone at the same shapes, to show where
// the step's time goes.
//
// Usage: worker_bench --model DIR [--threads N] [--quick]
// (bench/run_worker_bench.sh makes the `small` test model and runs this.)

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/model_config.h"
#include "kernels/backend.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/thread_pool.h"
#include "model/cpu/cpu_device.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "worker.pb.h"
#include "worker/step_runner.h"

namespace conveyor::bench {
namespace {

namespace v1 = ::conveyor::worker::v1;
using Clock = std::chrono::steady_clock;

constexpr int kBlockSize = 16;
constexpr int kPrefillTokens = 512;
// Decode runs batches 64, 32, 8, 1 in turn on the same sequences (dropping some each
// time) so that only one batch of prompts is prefilled; a 112-token prompt puts the
// batch-64 context at ~128 tokens, and the smaller batches later at a bit more.
constexpr int kDecodePromptTokens = 112;
constexpr int kDecodeBatches[] = {64, 32, 8, 1};
constexpr int kWarmupDecodeSteps = 2;
// Well above the LLC (300 MiB on these VMs), so the bandwidth test reads DRAM.
constexpr size_t kBandwidthBytes = size_t{1} << 30;

struct Options {
  std::string model_dir;
  int threads = 0;
  bool quick = false;
  kernels::CpuWeightDtype weights = kernels::CpuWeightDtype::kF32;
  model::CpuKvChoice kv = model::CpuKvChoice::kAuto;  // --kv_dtype, as the worker's flag.
};

// How the worker stores linear weights (--weight_dtype), and the same for the GEMM
// replays and ceilings, so every ratio compares like with like.
kernels::CpuWeightDtype g_weight_type = kernels::CpuWeightDtype::kF32;
// How the worker stores the KV cache (--kv_dtype).
kernels::CpuKvDtype g_kv_type = kernels::CpuKvDtype::kF32;

// Repetition counts; --quick trades precision for a shorter run.
struct Effort {
  int bandwidth_passes;
  int gemm_reps;
  int prefill_reps;
  int decode_steps;
  bool prefill_4x512;
  // Rounds of (read bandwidth, then kFloorRoundSteps decode steps at batch 1), each
  // decode measured against the bandwidth of the moment before it.
  int floor_rounds;
};

// Decode steps at batch 1 per floor round (their median is the round's step time).
constexpr int kFloorRoundSteps = 6;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

template <typename Fn>
double BestSeconds(int reps, Fn&& fn) {
  double best = 1e30;
  for (int i = 0; i < reps; ++i) {
    const auto start = Clock::now();
    fn();
    best = std::min(best, SecondsSince(start));
  }
  return best;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

template <typename T>
T OrDie(absl::StatusOr<T> value, const char* what) {
  if (!value.ok()) {
    std::fprintf(stderr, "worker_bench: %s: %s\n", what, value.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(value).value();
}

void CheckOk(const absl::Status& status, const char* what) {
  if (!status.ok()) {
    std::fprintf(stderr, "worker_bench: %s: %s\n", what, status.ToString().c_str());
    std::exit(1);
  }
}

void Progress(const char* what) { std::fprintf(stderr, "[worker_bench] %s\n", what); }

// 64-byte aligned floats (GemmPacked loads packed panels with aligned loads).
struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};
using AlignedFloats = std::unique_ptr<float[], FreeDeleter>;

AlignedFloats AllocateFloats(size_t count) {
  const size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  auto* p = static_cast<float*>(std::aligned_alloc(64, std::max<size_t>(bytes, 64)));
  if (p == nullptr) {
    std::fprintf(stderr, "worker_bench: cannot allocate %zu bytes\n", bytes);
    std::exit(1);
  }
  return AlignedFloats(p);
}

// Fills with values in [-scale, scale) from a cheap generator: the GEMM timings only
// need finite, non-denormal inputs.
void FillRandom(float* p, size_t count, uint64_t seed, float scale) {
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    p[i] = scale * (static_cast<float>(state >> 40) * 0x1.0p-23f - 1.0f);
  }
}

// --- Ceilings -----------------------------------------------------------------------

// Best GB/s of a streaming read (a sum) over kBandwidthBytes split among the pool's
// threads in 4 MiB chunks, so a thread slowed by a neighbour does not idle the others.
// The buffer is mapped once, so Measure can be called between decode steps: on a VM
// whose bandwidth drifts (31-60 GB/s between runs here) a floor is only meaningful
// against the bandwidth of the same moment.
class ReadBandwidthProbe {
 public:
  explicit ReadBandwidthProbe(kernels::ThreadPool* pool)
      : pool_(pool), buffer_(AllocateFloats(kFloats)) {
    // First touch from the pool, so pages are mapped before timing.
    pool_->ParallelFor(kChunks, 1, [&](int64_t begin, int64_t end) {
      std::fill(buffer_.get() + begin * kChunkFloats, buffer_.get() + end * kChunkFloats, 1.0f);
    });
  }

  double Measure(int passes);

 private:
  static constexpr size_t kChunkFloats = (size_t{4} << 20) / sizeof(float);
  static constexpr size_t kFloats = kBandwidthBytes / sizeof(float);
  static constexpr int64_t kChunks = static_cast<int64_t>(kFloats / kChunkFloats);
  kernels::ThreadPool* pool_;
  AlignedFloats buffer_;
};

double ReadBandwidthProbe::Measure(int passes) {
  kernels::ThreadPool* pool = pool_;
  const float* buffer = buffer_.get();
  // Four independent accumulators keep the loop bound by loads, not by the latency of
  // one add chain. 16-byte vectors fit SSE2, the baseline, in registers (wider GCC
  // vectors would go through the stack), and two such loads a cycle outrun DRAM.
  using Vec = float __attribute__((vector_size(16)));
  std::vector<double> sums(kChunks);
  const double seconds = BestSeconds(passes, [&] {
    pool->ParallelFor(kChunks, 1, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) {
        const Vec* v = reinterpret_cast<const Vec*>(buffer + c * kChunkFloats);
        Vec a0 = {}, a1 = {}, a2 = {}, a3 = {};
        for (size_t i = 0; i < kChunkFloats * sizeof(float) / sizeof(Vec); i += 4) {
          a0 += v[i];
          a1 += v[i + 1];
          a2 += v[i + 2];
          a3 += v[i + 3];
        }
        const Vec a = (a0 + a1) + (a2 + a3);
        double s = 0.0;
        for (int j = 0; j < 4; ++j) s += a[j];
        sums[c] = s;
      }
    });
  });
  // Every element is 1, so the total checks that every byte was read.
  double total = 0.0;
  for (double s : sums) total += s;
  if (total != static_cast<double>(kFloats)) std::fprintf(stderr, "bandwidth checksum off\n");
  return kBandwidthBytes / seconds / 1e9;
}

// Microseconds of one ParallelFor with no work: the wake-up and join that every
// parallel op of a step pays. The median over batches of calls, since a busy machine
// delays wake-ups now and then.
double MeasureDispatchMicros(kernels::ThreadPool* pool) {
  constexpr int kBatches = 20;
  constexpr int kCalls = 100;
  std::vector<double> micros;
  for (int b = 0; b < kBatches; ++b) {
    const auto start = Clock::now();
    for (int i = 0; i < kCalls; ++i) {
      pool->ParallelFor(2 * pool->num_threads(), 1, [](int64_t, int64_t) {});
    }
    micros.push_back(SecondsSince(start) / kCalls * 1e6);
  }
  return Median(micros);
}

struct Gemm {
  int n = 0;                // Output features.
  int k = 0;                // Input features.
  AlignedFloats row_major;  // [n, k], for OpenBLAS.
  AlignedFloats panels;     // PackGemmWeightAs layout (g_weight_type), for GemmPacked.
  AlignedFloats scales;
  kernels::PackedGemmWeight packed;
};

// Allocates and packs `g.row_major` as g_weight_type.
void PackTyped(Gemm* g) {
  g->panels = AllocateFloats(kernels::PackedGemmPanelBytes(g_weight_type, g->n, g->k) / 4 + 1);
  g->scales = AllocateFloats(kernels::PackedGemmScaleBytes(g_weight_type, g->n) / 4 + 1);
  g->packed.panels = g->panels.get();
  g->packed.scales =
      kernels::PackedGemmScaleBytes(g_weight_type, g->n) > 0 ? g->scales.get() : nullptr;
  kernels::PackGemmWeightAs(g_weight_type, g->row_major.get(), g->n, g->k, &g->packed);
}

// Every linear layer of the model, with random weights in both layouts, so OpenBLAS and
// GemmPacked run the model's shapes over as many distinct bytes as a forward pass
// streams (one layer's weights reused would sit in the LLC and flatter decode).
class ForwardGemms {
 public:
  ForwardGemms(const ModelConfig& c, int max_rows) {
    const int q_dim = c.num_attention_heads * c.head_dim;
    const int kv_dim = c.num_kv_heads * c.head_dim;
    uint64_t seed = 1;
    for (int l = 0; l < c.num_layers; ++l) {
      layers_.push_back(Make(q_dim + 2 * kv_dim, c.hidden_size, seed++));
      layers_.push_back(Make(c.hidden_size, q_dim, seed++));
      layers_.push_back(Make(2 * c.intermediate_size, c.hidden_size, seed++));
      layers_.push_back(Make(c.hidden_size, c.intermediate_size, seed++));
    }
    lm_head_ = Make(c.vocab_size, c.hidden_size, seed++);
    int max_k = lm_head_.k, max_n = lm_head_.n;
    for (const Gemm& g : layers_) {
      max_k = std::max(max_k, g.k);
      max_n = std::max(max_n, g.n);
    }
    x_ = AllocateFloats(static_cast<size_t>(max_rows) * max_k);
    y_ = AllocateFloats(static_cast<size_t>(max_rows) * max_n);
    FillRandom(x_.get(), static_cast<size_t>(max_rows) * max_k, 0, 1.0f);
  }

  // 2 × multiply-adds of the layers' GEMMs at `m` rows.
  double LayerFlops(int m) const {
    double macs = 0;
    for (const Gemm& g : layers_) macs += static_cast<double>(g.n) * g.k;
    return 2.0 * macs * m;
  }

  // Best seconds of the layers' GEMMs at `m` rows plus the LM head at `lm_head_rows`
  // rows (as a forward computes it), through GemmPacked on `pool`.
  double TimeOurs(int m, int lm_head_rows, int reps, kernels::ThreadPool* pool) {
    return BestSeconds(reps, [&] {
      for (const Gemm& g : layers_) Ours(g, m, pool);
      if (lm_head_rows > 0) Ours(lm_head_, lm_head_rows, pool);
    });
  }

  // Best seconds of the layers' GEMMs at `m` rows through cblas_sgemm.
  double TimeOpenBlas(int m, int reps) {
    return BestSeconds(reps, [&] {
      for (const Gemm& g : layers_) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, g.n, g.k, 1.0f, x_.get(), g.k,
                    g.row_major.get(), g.k, 0.0f, y_.get(), g.n);
      }
    });
  }

 private:
  static Gemm Make(int n, int k, uint64_t seed) {
    Gemm g;
    g.n = n;
    g.k = k;
    g.row_major = AllocateFloats(static_cast<size_t>(n) * k);
    FillRandom(g.row_major.get(), static_cast<size_t>(n) * k, seed, 0.05f);
    PackTyped(&g);
    return g;
  }

  void Ours(const Gemm& g, int m, kernels::ThreadPool* pool) {
    kernels::GemmPackedAs(x_.get(), g.k, m, g.packed, nullptr, y_.get(), g.n, pool);
  }

  std::vector<Gemm> layers_;
  Gemm lm_head_;
  AlignedFloats x_, y_;
};

// GFLOP/s of a square sgemm (the customary peak figure) through OpenBLAS and GemmPacked.
struct SquareGemm {
  static constexpr int kSize = 1024;
  AlignedFloats a = AllocateFloats(kSize * kSize);
  Gemm b;
  AlignedFloats c = AllocateFloats(kSize * kSize);

  SquareGemm() {
    FillRandom(a.get(), kSize * kSize, 100, 1.0f);
    b.n = b.k = kSize;
    b.row_major = AllocateFloats(kSize * kSize);
    FillRandom(b.row_major.get(), kSize * kSize, 101, 0.05f);
    PackTyped(&b);
  }
  static double Gflops(double seconds) { return 2.0 * kSize * kSize * kSize / seconds / 1e9; }
  double Ours(int reps, kernels::ThreadPool* pool) {
    return Gflops(BestSeconds(reps, [&] {
      kernels::GemmPackedAs(a.get(), kSize, kSize, b.packed, nullptr, c.get(), kSize, pool);
    }));
  }
  double OpenBlas(int reps) {
    return Gflops(BestSeconds(reps, [&] {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, kSize, kSize, kSize, 1.0f, a.get(),
                  kSize, b.row_major.get(), kSize, 0.0f, c.get(), kSize);
    }));
  }
};

// --- The worker -----------------------------------------------------------------------

// FLOPs (2 × multiply-adds) of a forward over `tokens` tokens whose contexts (positions
// attended, causal) sum to `context_sum`, with `logit_rows` rows through the LM head.
double ForwardFlops(const ModelConfig& c, int64_t tokens, int64_t context_sum, int logit_rows) {
  const double q_dim = static_cast<double>(c.num_attention_heads) * c.head_dim;
  const double kv_dim = static_cast<double>(c.num_kv_heads) * c.head_dim;
  const double layer_macs = c.hidden_size * (q_dim + 2 * kv_dim) + q_dim * c.hidden_size +
                            3.0 * c.hidden_size * c.intermediate_size;
  // Per query head and attended position: a head_dim dot product (QKᵀ) and a head_dim
  // axpy (PV).
  const double attention_macs = 2.0 * q_dim * static_cast<double>(context_sum);
  return 2.0 * (c.num_layers * (layer_macs * tokens + attention_macs) +
                static_cast<double>(c.vocab_size) * c.hidden_size * logit_rows);
}

// One sequence as the benchmark (playing the scheduler) tracks it.
struct Sequence {
  uint64_t id;
  std::vector<int32_t> blocks;
  int computed = 0;  // Tokens whose K/V are in the cache.
};

// Backend + model + KV cache + engine, as a worker process assembles them, driven with
// StepRequests like a scheduler's.
class Worker {
 public:
  Worker(const std::string& model_dir, int threads, int num_blocks, kernels::CpuWeightDtype weights,
         kernels::CpuKvDtype kv)
      : backend_(kernels::MakeCpuBackend(threads, weights, kv)) {
    const auto start = Clock::now();
    model_ = OrDie(model::LlamaModel::Load(model_dir, backend_.get()), "loading the model");
    load_seconds_ = SecondsSince(start);
    const ModelConfig& c = model_->config();
    cache_ = OrDie(model::KvCache::Create(backend_.get(), c.num_layers, c.num_kv_heads, c.head_dim,
                                          kBlockSize, num_blocks),
                   "allocating the KV cache");
    for (int b = num_blocks - 1; b >= 0; --b) free_blocks_.push_back(b);
    worker::StepRunner::Options options;
    options.max_step_tokens = 1 << 14;
    engine_ = std::make_unique<worker::StepRunner>(model_.get(), cache_.get(), options);
  }

  const ModelConfig& config() const { return model_->config(); }
  const model::LlamaModel& model() const { return *model_; }
  const kernels::Backend& backend() const { return *backend_; }
  double load_seconds() const { return load_seconds_; }
  const std::vector<Sequence>& sequences() const { return sequences_; }

  // Adds `count` sequences with `prompt_tokens`-token prompts, each prefilled whole in
  // this one step, with blocks for `capacity` tokens.
  v1::StepResponse Prefill(int count, int prompt_tokens, int capacity, double* seconds) {
    v1::StepRequest request;
    const int blocks = (capacity + kBlockSize - 1) / kBlockSize;
    for (int i = 0; i < count; ++i) {
      Sequence seq{next_seq_id_++, {}, 0};
      v1::NewSequence* n = request.add_new_sequences();
      n->set_seq_id(seq.id);
      for (int t = 0; t < prompt_tokens; ++t) {
        // Arbitrary in-vocabulary ids; greedy sampling (the default) reads no randomness.
        n->add_token_ids(
            static_cast<int32_t>((seq.id * 7919 + t * 104729) % (config().vocab_size - 3) + 3));
      }
      n->set_num_tokens(prompt_tokens);
      for (int b = 0; b < blocks; ++b) {
        if (free_blocks_.empty()) {
          std::fprintf(stderr, "worker_bench: KV cache too small\n");
          std::exit(1);
        }
        seq.blocks.push_back(free_blocks_.back());
        n->add_block_ids(free_blocks_.back());
        free_blocks_.pop_back();
      }
      seq.computed = prompt_tokens;
      sequences_.push_back(std::move(seq));
    }
    return Run(request, seconds);
  }

  // Decodes one token for every live sequence.
  v1::StepResponse Decode(double* seconds) {
    v1::StepRequest request;
    for (Sequence& seq : sequences_) {
      v1::RunningSequence* r = request.add_running();
      r->set_seq_id(seq.id);
      r->set_num_tokens(1);
      ++seq.computed;
    }
    return Run(request, seconds);
  }

  // Forgets all but the first `keep` sequences (in a step of their own, untimed).
  void KeepFirst(int keep) {
    v1::StepRequest request;
    while (static_cast<int>(sequences_.size()) > keep) {
      request.add_dropped_seq_ids(sequences_.back().id);
      free_blocks_.insert(free_blocks_.end(), sequences_.back().blocks.begin(),
                          sequences_.back().blocks.end());
      sequences_.pop_back();
    }
    double unused;
    Run(request, &unused);
  }

  // Best seconds of PagedAttention alone over all layers, for the tokens the last step
  // computed: the last `tokens_per_seq` positions of every live sequence, reading the
  // K/V that step wrote.
  double TimeAttention(int tokens_per_seq, int reps) {
    const ModelConfig& c = config();
    std::vector<int32_t> token_seq, token_pos;
    size_t max_blocks = 0;
    for (const Sequence& s : sequences_) max_blocks = std::max(max_blocks, s.blocks.size());
    std::vector<int32_t> tables(sequences_.size() * max_blocks, 0);
    for (size_t i = 0; i < sequences_.size(); ++i) {
      std::copy(sequences_[i].blocks.begin(), sequences_[i].blocks.end(),
                tables.begin() + i * max_blocks);
      for (int p = sequences_[i].computed - tokens_per_seq; p < sequences_[i].computed; ++p) {
        token_seq.push_back(static_cast<int32_t>(i));
        token_pos.push_back(p);
      }
    }
    const int n = static_cast<int>(token_pos.size());
    const int q_dim = c.num_attention_heads * c.head_dim;
    const int qkv_width = q_dim + 2 * c.num_kv_heads * c.head_dim;
    auto upload = [&](const void* src, size_t bytes) {
      kernels::BackendBuffer buf =
          OrDie(kernels::AllocateBuffer(backend_.get(), bytes), "attention buffers");
      if (src != nullptr) backend_->CopyToBackend(buf.get(), src, bytes);
      return buf;
    };
    std::vector<float> q(static_cast<size_t>(n) * qkv_width);
    FillRandom(q.data(), q.size(), 7, 1.0f);
    kernels::BackendBuffer q_buf = upload(q.data(), q.size() * sizeof(float));
    kernels::BackendBuffer seq_buf = upload(token_seq.data(), n * sizeof(int32_t));
    kernels::BackendBuffer pos_buf = upload(token_pos.data(), n * sizeof(int32_t));
    kernels::BackendBuffer table_buf = upload(tables.data(), tables.size() * sizeof(int32_t));
    kernels::BackendBuffer out_buf =
        upload(nullptr, static_cast<size_t>(n) * q_dim * backend_->activation_bytes());

    kernels::AttentionBatch batch;
    batch.num_tokens = n;
    batch.token_seq = static_cast<const int32_t*>(seq_buf.get());
    batch.token_pos = static_cast<const int32_t*>(pos_buf.get());
    batch.num_seqs = static_cast<int>(sequences_.size());
    batch.block_tables = static_cast<const int32_t*>(table_buf.get());
    batch.max_blocks_per_seq = static_cast<int>(max_blocks);
    batch.block_size = kBlockSize;
    kernels::AttentionShape shape;
    shape.num_heads = c.num_attention_heads;
    shape.num_kv_heads = c.num_kv_heads;
    shape.head_dim = c.head_dim;
    shape.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
    return BestSeconds(reps, [&] {
      for (int l = 0; l < c.num_layers; ++l) {
        backend_->PagedAttention(q_buf.get(), qkv_width, batch, shape, cache_->layer(l),
                                 out_buf.get());
      }
      backend_->Synchronize().IgnoreError();  // The CPU backend cannot fail here.
    });
  }

 private:
  v1::StepResponse Run(v1::StepRequest& request, double* seconds) {
    request.set_step_id(next_step_id_++);
    v1::StepResponse response;
    const auto start = Clock::now();
    CheckOk(engine_->Step(request, &response), "StepRunner::Step");
    *seconds = SecondsSince(start);
    return response;
  }

  std::unique_ptr<kernels::Backend> backend_;
  std::unique_ptr<model::LlamaModel> model_;
  std::unique_ptr<model::KvCache> cache_;
  std::unique_ptr<worker::StepRunner> engine_;
  double load_seconds_ = 0;
  std::vector<int32_t> free_blocks_;
  std::vector<Sequence> sequences_;
  uint64_t next_seq_id_ = 1;
  uint64_t next_step_id_ = 1;
};

// One measured phase: a step shape and where its time went.
struct PhaseResult {
  std::string name;
  int tokens_per_step = 0;
  double mean_context = 0;  // Positions attended per token, averaged.
  double step_s = 0;        // Median (decode) or best (prefill) StepRunner::Step time.
  double flops = 0;         // Per step.
  // Breakdown (seconds per step): forward and sampling as Step reports them; GEMMs and
  // attention replayed alone at the same shapes.
  double forward_s = 0, sample_s = 0, gemm_s = 0, attention_s = 0;
  // Decode at batch 1: the floor rounds (Effort::floor_rounds).
  struct FloorRound {
    double bandwidth_gbs = 0;  // Measured just before the round's steps.
    double step_s = 0;         // Their median.
    double mean_context = 0;
  };
  std::vector<FloorRound> floor_rounds;
};

PhaseResult MeasurePrefill(Worker* w, ForwardGemms* gemms, kernels::ThreadPool* pool, int seqs,
                           const Effort& e) {
  PhaseResult r;
  r.name = "prefill " + std::to_string(seqs) + "x" + std::to_string(kPrefillTokens);
  r.tokens_per_step = seqs * kPrefillTokens;
  r.mean_context = (kPrefillTokens + 1) / 2.0;
  r.flops = ForwardFlops(w->config(), r.tokens_per_step,
                         int64_t{seqs} * kPrefillTokens * (kPrefillTokens + 1) / 2, seqs);
  r.step_s = 1e30;
  // The first step grows the model's activation buffers; it is not counted.
  for (int rep = -1; rep < e.prefill_reps; ++rep) {
    double seconds;
    const v1::StepResponse resp = w->Prefill(seqs, kPrefillTokens, kPrefillTokens, &seconds);
    if (rep >= 0 && seconds < r.step_s) {
      r.step_s = seconds;
      r.forward_s = resp.timings().forward_ms() / 1e3;
      r.sample_s = resp.timings().sample_ms() / 1e3;
    }
    if (rep == e.prefill_reps - 1) {
      r.attention_s = w->TimeAttention(kPrefillTokens, e.gemm_reps);
    }
    w->KeepFirst(0);
  }
  r.gemm_s = gemms->TimeOurs(r.tokens_per_step, seqs, e.gemm_reps, pool);
  return r;
}

// Tokens a decode sequence reaches by the end of the last decode phase.
int DecodeCapacity(const Effort& e) {
  return kDecodePromptTokens + 1 +
         static_cast<int>(std::size(kDecodeBatches)) * (kWarmupDecodeSteps + e.decode_steps) +
         e.floor_rounds * kFloorRoundSteps;
}

// Decodes at each of kDecodeBatches in turn, starting from kDecodeBatches[0] fresh
// sequences.
std::vector<PhaseResult> MeasureDecode(Worker* w, ForwardGemms* gemms, kernels::ThreadPool* pool,
                                       ReadBandwidthProbe* bandwidth, const Effort& e) {
  double unused;
  w->Prefill(kDecodeBatches[0], kDecodePromptTokens, DecodeCapacity(e), &unused);
  std::vector<PhaseResult> results;
  for (int batch : kDecodeBatches) {
    w->KeepFirst(batch);
    PhaseResult r;
    r.name = "decode b=" + std::to_string(batch);
    r.tokens_per_step = batch;
    for (int i = 0; i < kWarmupDecodeSteps; ++i) w->Decode(&unused);
    std::vector<double> step_s, forward_s, sample_s;
    int64_t context_sum = 0;
    for (int i = 0; i < e.decode_steps; ++i) {
      double seconds;
      const v1::StepResponse resp = w->Decode(&seconds);
      step_s.push_back(seconds);
      forward_s.push_back(resp.timings().forward_ms() / 1e3);
      sample_s.push_back(resp.timings().sample_ms() / 1e3);
      for (const Sequence& s : w->sequences()) context_sum += s.computed;
    }
    r.step_s = Median(step_s);
    r.forward_s = Median(forward_s);
    r.sample_s = Median(sample_s);
    r.mean_context = static_cast<double>(context_sum) / (e.decode_steps * batch);
    r.flops = ForwardFlops(w->config(), batch, context_sum / e.decode_steps, batch);
    r.attention_s = w->TimeAttention(1, e.gemm_reps);
    r.gemm_s = gemms->TimeOurs(batch, batch, e.gemm_reps, pool);
    if (batch == 1) {
      for (int round = 0; round < e.floor_rounds; ++round) {
        PhaseResult::FloorRound f;
        f.bandwidth_gbs = bandwidth->Measure(2);
        std::vector<double> steps;
        int64_t context = 0;
        for (int i = 0; i < kFloorRoundSteps; ++i) {
          double seconds;
          w->Decode(&seconds);
          steps.push_back(seconds);
          context += w->sequences()[0].computed;
        }
        f.step_s = Median(steps);
        f.mean_context = static_cast<double>(context) / kFloorRoundSteps;
        r.floor_rounds.push_back(f);
      }
    }
    results.push_back(r);
  }
  w->KeepFirst(0);
  return results;
}

// Bytes a decode step at batch 1 must read: every packed weight matrix (padding
// included, as the kernel reads it), the norm weights, and the sequence's K/V.
double DecodeWeightBytes(const ModelConfig& c) {
  const int q_dim = c.num_attention_heads * c.head_dim;
  const int kv_dim = c.num_kv_heads * c.head_dim;
  auto packed = [](int n, int k) {
    return static_cast<double>(kernels::PackedGemmPanelBytes(g_weight_type, n, k) +
                               kernels::PackedGemmScaleBytes(g_weight_type, n));
  };
  double bytes = packed(c.vocab_size, c.hidden_size);
  bytes +=
      c.num_layers *
      (packed(q_dim + 2 * kv_dim, c.hidden_size) + packed(c.hidden_size, q_dim) +
       packed(2 * c.intermediate_size, c.hidden_size) + packed(c.hidden_size, c.intermediate_size));
  bytes += (2.0 * c.num_layers + 1) * c.hidden_size * sizeof(float);
  return bytes;
}

double KvBytes(const ModelConfig& c, double context) {
  const double element_bytes = g_kv_type == kernels::CpuKvDtype::kBf16 ? 2 : 4;
  return 2.0 * c.num_layers * context * c.num_kv_heads * c.head_dim * element_bytes;
}

// The 1-minute load average: other processes on the machine make every number noisy.
double LoadAverage() {
  double load[1] = {0};
  return getloadavg(load, 1) == 1 ? load[0] : -1;
}

const char* EnvOr(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : fallback;
}

bool ParseArgs(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    if (arg == "--quick") {
      o->quick = true;
    } else if (arg == "--model") {
      const char* v = value();
      if (v == nullptr) return false;
      o->model_dir = v;
    } else if (arg == "--weight_dtype") {
      const char* v = value();
      const std::string name = v == nullptr ? "" : v;
      if (name == "f32") {
        o->weights = kernels::CpuWeightDtype::kF32;
      } else if (name == "bf16") {
        o->weights = kernels::CpuWeightDtype::kBf16;
      } else if (name == "int8") {
        o->weights = kernels::CpuWeightDtype::kInt8;
      } else {
        return false;
      }
    } else if (arg == "--kv_dtype") {
      const char* v = value();
      absl::StatusOr<model::CpuKvChoice> kv = model::ParseCpuKvChoice(v == nullptr ? "" : v);
      if (!kv.ok()) return false;
      o->kv = *kv;
    } else if (arg == "--threads") {
      const char* v = value();
      if (v == nullptr || std::atoi(v) < 1) return false;
      o->threads = std::atoi(v);
    } else {
      return false;
    }
  }
  return !o->model_dir.empty();
}

int Main(int argc, char** argv) {
  Options opt;
  if (!ParseArgs(argc, argv, &opt)) {
    std::fprintf(stderr,
                 "usage: worker_bench --model DIR [--threads N] [--weight_dtype T] [--kv_dtype T]\n"
                 "                    [--quick]\n"
                 "  --model DIR  checkpoint (e.g. the `small` test model)\n"
                 "  --threads N  worker, GEMM and OpenBLAS threads (default: all cores)\n"
                 "  --weight_dtype f32|bf16|int8  how the worker stores weights (f32)\n"
                 "  --kv_dtype auto|f32|bf16  how it stores the KV cache (auto: bf16 with bf16\n"
                 "               or int8 weights, else f32, as the worker's --cpu_kv_dtype=auto)\n"
                 "  --quick      fewer repetitions (noisier)\n");
    return 2;
  }
  if (opt.threads == 0) opt.threads = std::max(1u, std::thread::hardware_concurrency());
  g_weight_type = opt.weights;
  g_kv_type = model::ResolveCpuKvDtype(opt.kv, opt.weights);
  const Effort e = opt.quick ? Effort{3, 2, 2, 8, false, 3} : Effort{5, 3, 3, 32, true, 7};

  const double load_before = LoadAverage();
  const auto run_start = Clock::now();
  Progress("loading the model");
  const int decode_blocks = kDecodeBatches[0] * ((DecodeCapacity(e) + kBlockSize - 1) / kBlockSize);
  Worker w(opt.model_dir, opt.threads, std::max(decode_blocks, 4 * kPrefillTokens / kBlockSize),
           opt.weights, g_kv_type);
  const ModelConfig& c = w.config();
  kernels::ThreadPool pool(opt.threads);

  // OpenBLAS's idle threads spin for a while after each call and would steal cores from
  // the worker, so OpenBLAS runs last.
  Progress("memory bandwidth");
  ReadBandwidthProbe bandwidth(&pool);
  const double bandwidth_gbs = bandwidth.Measure(e.bandwidth_passes);
  const double dispatch_us = MeasureDispatchMicros(&pool);
  Progress("GemmPacked ceilings");
  const int max_rows = (e.prefill_4x512 ? 4 : 1) * kPrefillTokens;
  ForwardGemms gemms(c, max_rows);
  SquareGemm square;
  const double ours_square = square.Ours(e.gemm_reps, &pool);
  // M=8: the end-to-end benchmark's decode step (8 streams), between the compute-bound
  // and the bandwidth-bound shapes.
  const int ceiling_rows[] = {kPrefillTokens, kDecodeBatches[0], 8, 1};
  std::map<int, double> ours_gflops, blas_gflops;
  for (int m : ceiling_rows) {
    ours_gflops[m] = gemms.LayerFlops(m) / gemms.TimeOurs(m, 0, e.gemm_reps, &pool) / 1e9;
  }

  Progress("prefill");
  std::vector<PhaseResult> phases;
  phases.push_back(MeasurePrefill(&w, &gemms, &pool, 1, e));
  if (e.prefill_4x512) phases.push_back(MeasurePrefill(&w, &gemms, &pool, 4, e));
  Progress("decode");
  for (const PhaseResult& r : MeasureDecode(&w, &gemms, &pool, &bandwidth, e)) {
    phases.push_back(r);
  }

  Progress("OpenBLAS ceilings");
  openblas_set_num_threads(opt.threads);
  const double blas_square = square.OpenBlas(e.gemm_reps + 1);  // +1: thread start-up.
  for (int m : ceiling_rows) {
    blas_gflops[m] = gemms.LayerFlops(m) / gemms.TimeOpenBlas(m, e.gemm_reps) / 1e9;
  }

  // --- Report ---
  const double run_seconds = SecondsSince(run_start);
  const double load_after = LoadAverage();
  const double params = static_cast<double>(c.NumParameters());
  std::printf(
      "\nConveyor worker benchmark%s: %s, %d layers, hidden %d, ffn %d, vocab %d, "
      "%.1fM params\n",
      opt.quick ? " (--quick)" : "", opt.model_dir.c_str(), c.num_layers, c.hidden_size,
      c.intermediate_size, c.vocab_size, params / 1e6);
  std::printf("backend %s; model loaded in %.1f s; weight_bytes() %.1f MB\n",
              w.backend().name().c_str(), w.load_seconds(), w.model().weight_bytes() / 1e6);
  std::printf("bf16 GEMM arithmetic: %s\n", kernels::Bf16ArithmeticChoice().c_str());
  std::printf("%s, kernel %s (OPENBLAS_CORETYPE=%s, OPENBLAS_L2_SIZE=%s), %d threads\n",
              openblas_get_config(), openblas_get_corename(), EnvOr("OPENBLAS_CORETYPE", "<unset>"),
              EnvOr("OPENBLAS_L2_SIZE", "<unset>"), openblas_get_num_threads());
  std::printf(
      "ran %.0f s; load average %.2f before, %.2f after, on %u cores (a load above "
      "the thread count means other work skewed the numbers)\n",
      run_seconds, load_before, load_after, std::thread::hardware_concurrency());

  std::printf("\nCeilings (best of %d; %d threads)\n", e.gemm_reps, opt.threads);
  std::printf("  memory read bandwidth, %zu MiB sum       %8.1f GB/s (best of %d passes)\n",
              kBandwidthBytes >> 20, bandwidth_gbs, e.bandwidth_passes);
  std::printf("  ThreadPool::ParallelFor, empty job         %8.1f us/call\n", dispatch_us);
  std::printf("  %-40s %10s %12s\n", "sgemm GFLOP/s", "OpenBLAS",
              (std::string("GemmPacked ") + kernels::CpuWeightDtypeName(g_weight_type)).c_str());
  std::printf("  %-40s %10.1f %12.1f\n", "1024^3", blas_square, ours_square);
  for (int m : ceiling_rows) {
    const std::string label =
        std::to_string(4 * c.num_layers) + " layer GEMMs (a forward), M=" + std::to_string(m);
    std::printf("  %-40s %10.1f %12.1f\n", label.c_str(), blas_gflops[m], ours_gflops[m]);
  }
  const double weight_bytes = DecodeWeightBytes(c);
  // Over a long k: bf16 pads k to pairs, so a k of 1 would count 4 bytes per weight.
  constexpr int kLongK = 4096;
  const double bytes_per_weight = static_cast<double>(kernels::PackedGemmPanelBytes(
                                      g_weight_type, kernels::kGemmPanelWidth, kLongK)) /
                                  (static_cast<double>(kernels::kGemmPanelWidth) * kLongK);
  std::printf(
      "  (at M=1 that is %.1f GB/s of weights for OpenBLAS, %.1f GB/s for GemmPacked;\n"
      "   at M=8, %.1f and %.1f GB/s)\n",
      blas_gflops[1] / 2.0 * sizeof(float), ours_gflops[1] / 2.0 * bytes_per_weight,
      blas_gflops[8] / 16.0 * sizeof(float), ours_gflops[8] / 16.0 * bytes_per_weight);

  std::printf("\nWorker, StepRunner::Step (prefill: best of %d; decode: median of %d steps)\n",
              e.prefill_reps, e.decode_steps);
  std::printf("  %-14s %6s %6s %10s %10s %9s\n", "phase", "tokens", "ctx", "ms/step", "tok/s",
              "GFLOP/s");
  for (const PhaseResult& r : phases) {
    std::printf("  %-14s %6d %6.0f %10.2f %10.1f %9.1f\n", r.name.c_str(), r.tokens_per_step,
                r.mean_context, r.step_s * 1e3, r.tokens_per_step / r.step_s,
                r.flops / r.step_s / 1e9);
  }

  std::printf(
      "\nAgainst the ceilings (peak = 1024^3 sgemm: primary OpenBLAS %.1f GFLOP/s, "
      "kernel %s, under this process's environment; GemmPacked %.1f in brackets)\n",
      blas_square, openblas_get_corename(), ours_square);
  if (blas_square < ours_square) {
    std::printf(
        "  NOTE: OpenBLAS is slower than GemmPacked here, so the bracketed ratios are "
        "the stricter ones.\n");
    const std::string core = openblas_get_corename();
    if (std::string(kernels::GemmKernelName()) == "avx512" && core != "SkylakeX" &&
        core != "Cooperlake" && core != "SapphireRapids") {
      std::printf(
          "  NOTE: OpenBLAS's %s kernel leaves AVX-512 unused; for this CPU's sgemm "
          "peak run with OPENBLAS_CORETYPE=SkylakeX\n  (run_worker_bench.sh "
          "--openblas-coretype SkylakeX).\n",
          core.c_str());
    }
  }
  for (const PhaseResult& r : phases) {
    if (r.name == "decode b=1") {
      const double bytes = weight_bytes + KvBytes(c, r.mean_context);
      const double floor_s = bytes / (bandwidth_gbs * 1e9);
      std::printf(
          "  %-14s reads %.1f MB/token (weights %.1f + KV %.1f) / %.1f GB/s = floor "
          "%.2f ms/token\n",
          r.name.c_str(), bytes / 1e6, weight_bytes / 1e6, KvBytes(c, r.mean_context) / 1e6,
          bandwidth_gbs, floor_s * 1e3);
      std::printf(
          "  %-14s achieved %.2f ms/token (%.1f GB/s) = %.2f of floor speed "
          "(target >= 0.8)\n",
          "", r.step_s * 1e3, bytes / r.step_s / 1e9, floor_s / r.step_s);
      if (!r.floor_rounds.empty()) {
        // The same, round by round against the bandwidth just before each: robust to
        // a machine whose bandwidth drifts between the ceilings and the decode.
        std::vector<double> ratios;
        std::string each;
        for (const PhaseResult::FloorRound& f : r.floor_rounds) {
          const double round_bytes = weight_bytes + KvBytes(c, f.mean_context);
          ratios.push_back(round_bytes / (f.bandwidth_gbs * 1e9) / f.step_s);
          char text[64];
          std::snprintf(text, sizeof(text), " %.2f (%.1f GB/s, %.2f ms)", ratios.back(),
                        f.bandwidth_gbs, f.step_s * 1e3);
          each += text;
        }
        std::printf("  %-14s paired rounds: median %.2f of floor speed; each:%s\n", "",
                    Median(ratios), each.c_str());
      }
    } else if (r.name.starts_with("prefill") || r.name == "decode b=64") {
      const double gflops = r.flops / r.step_s / 1e9;
      std::printf(
          "  %-14s %.1f GFLOP/s = %.2f of OpenBLAS peak [%.2f of GemmPacked's] "
          "(target >= 0.7)\n",
          r.name.c_str(), gflops, gflops / blas_square, gflops / ours_square);
    }
  }

  std::printf(
      "\nWhere a step's time goes (ms/step; GEMMs = GemmPacked alone on the model's "
      "shapes, attention = PagedAttention alone on the step's K/V)\n");
  std::printf("  %-14s %8s %8s %10s %10s %9s %8s\n", "phase", "step", "GEMMs", "attention",
              "other fwd", "sampling", "engine");
  for (const PhaseResult& r : phases) {
    std::printf("  %-14s %8.2f %8.2f %10.2f %10.2f %9.2f %8.2f\n", r.name.c_str(), r.step_s * 1e3,
                r.gemm_s * 1e3, r.attention_s * 1e3, (r.forward_s - r.gemm_s - r.attention_s) * 1e3,
                r.sample_s * 1e3, (r.step_s - r.forward_s - r.sample_s) * 1e3);
  }
  // Per layer: 4 GEMMs, attention, 2 norms, RoPE, SiLU; then the final norm and LM head.
  // Small batches run the row-wise ops inline, so this is an upper bound.
  const int parallel_ops = 9 * c.num_layers + 2;
  std::printf(
      "  (other fwd = forward - GEMMs - attention: norms, RoPE, SiLU, KV writes, and "
      "the step's <= %d ParallelFor\n   wake-ups x %.1f us = %.2f ms; below 0 "
      "means noise, as the replays are best-of)\n",
      parallel_ops, dispatch_us, parallel_ops * dispatch_us / 1e3);
  return 0;
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) { return conveyor::bench::Main(argc, argv); }
