// Times the worker's forward step on a random-weight model of a production shape
// (Llama-3-8B by default) on the CUDA or the CPU backend, without gRPC or the scheduler
// (DirectRunner drives LlamaModel), and rates each phase against the ceilings measured
// in the same run:
//   - memory bandwidth: a large device-to-device copy (bytes read + written per second);
//   - matrix rate: the backend's own Linear (cuBLASLt in the compute dtype) on an
//     8192 x 8192 x 8192 product.
// For each batch size B it prefills B prompts of --prompt_tokens tokens in steps of at
// most --max_step_tokens tokens (as a scheduler's token budget would chunk them), then
// times decode steps of the B sequences at that context. A decode step must read every
// weight once and each sequence's KV cache, so its floor is those bytes over the
// bandwidth (or its FLOPs over the matrix rate, if larger); prefill's floor is its FLOPs
// over the matrix rate.
//
// A decode step here is what the worker does for it minus the RPC: the batch's metadata
// upload, the forward pass and greedy sampling - on the GPU with the device sampler
// (--device_sampling, the worker's default on CUDA), else the logits copied to the host
// as float32 and an argmax there. Prefill steps discard their logits.
//
// The CPU backend runs it too (small shapes: a smoke test in CI, bench/worker_bench is
// the CPU benchmark); there the ceilings are not measured and the ratios are blank.
//
// Usage: conveyor-step-bench --backend=cuda [--shape=llama3-8b] [--batches=1,8,64,256]
//        (--help lists every flag; tests/gpu/run.sh runs it on the GPU machine)
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"
#include "kernels/backend.h"
#include "model/cuda/cuda_device.h"
#include "model/device_sampler.h"
#include "model/direct_runner.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "nlohmann/json.hpp"
#include "testing/random_weights.h"
#ifdef CONVEYOR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#endif

ABSL_FLAG(std::string, backend, "cuda", "Backend: cuda or cpu.");
ABSL_FLAG(int, device, 0, "CUDA device.");
ABSL_FLAG(int, threads, 0, "CPU backend threads (0: one per core).");
ABSL_FLAG(std::string, cpu_weights, "f32", "CPU backend weight storage: f32, bf16 or int8.");
ABSL_FLAG(std::string, shape, "llama3-8b",
          "Model shape: llama3-8b (bf16 on CUDA), small, qwen3-moe-small, demo or tiny "
          "(model_config.h).");
ABSL_FLAG(int, layers, 0, "Override the shape's layer count (0: keep it).");
ABSL_FLAG(std::vector<std::string>, batches, std::vector<std::string>({"1", "8", "64", "256"}),
          "Batch sizes (sequences) to measure.");
ABSL_FLAG(int, prompt_tokens, 1024, "Prompt length of every sequence (= decode context).");
ABSL_FLAG(int, max_step_tokens, 8192, "Token budget of one prefill step.");
ABSL_FLAG(int, decode_steps, 16, "Timed decode steps per batch size (after 3 warm-up steps).");
ABSL_FLAG(int, block_size, 16, "KV cache block size in tokens.");
ABSL_FLAG(bool, device_sampling, true,
          "cuda: sample decode steps on the GPU (else copy logits to the host).");
ABSL_FLAG(bool, cuda_graphs, true,
          "cuda: time each decode batch a second time with CUDA graphs (decode+graph rows).");
ABSL_FLAG(bool, ceilings, true, "Measure bandwidth and matrix rate (CUDA only).");
ABSL_FLAG(double, time_limit_s, 0,
          "Skip the remaining batch sizes once this many seconds have passed (0: none).");
ABSL_FLAG(std::string, json, "", "Also write the results to this JSON file.");

namespace conveyor::bench {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const std::string& name) {
  if (name == "cpu") {
    const std::string weights = absl::GetFlag(FLAGS_cpu_weights);
    kernels::CpuWeightDtype dtype = kernels::CpuWeightDtype::kF32;
    if (weights == "bf16") {
      dtype = kernels::CpuWeightDtype::kBf16;
    } else if (weights == "int8") {
      dtype = kernels::CpuWeightDtype::kInt8;
    } else if (weights != "f32") {
      return absl::InvalidArgumentError(
          absl::StrCat("--cpu_weights=", weights, ": use f32, bf16 or int8"));
    }
    return kernels::MakeCpuBackend(absl::GetFlag(FLAGS_threads), dtype);
  }
  if (name == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::CudaBackend> backend,
                     kernels::MakeCudaBackend(absl::GetFlag(FLAGS_device)));
    return std::unique_ptr<kernels::Backend>(std::move(backend));
#else
    return absl::UnavailableError("this build has no CUDA backend (configure with CUDA)");
#endif
  }
  return absl::InvalidArgumentError(absl::StrCat("--backend=", name, " is not cpu or cuda"));
}

struct Ceilings {
  double bandwidth = 0;  // Bytes per second (read + written).
  double matrix = 0;     // FLOP per second.
};

// The matrix rate: the backend's Linear on [8192, 8192] x [8192, 8192]ᵀ, median of 5.
absl::StatusOr<double> MeasureMatrixRate(kernels::Backend* backend) {
  constexpr int kDim = 8192;
  std::vector<float> host(static_cast<size_t>(kDim) * kDim);
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : host) v = u(rng);
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::LinearWeight> w,
                   backend->PackLinear(host.data(), kDim, kDim, nullptr));
  ASSIGN_OR_RETURN(void* x, backend->UploadCompute(host.data(), host.size()));
  kernels::BackendBuffer x_owner(x, kernels::BackendDeleter{backend});
  ASSIGN_OR_RETURN(kernels::BackendBuffer out,
                   kernels::AllocateBuffer(backend, host.size() * backend->activation_bytes()));
  std::vector<double> seconds;
  for (int rep = 0; rep < 6; ++rep) {
    const Clock::time_point start = Clock::now();
    backend->Linear(x, kDim, *w, out.get());
    RETURN_IF_ERROR(backend->Synchronize());
    if (rep > 0) seconds.push_back(SecondsSince(start));
  }
  RETURN_IF_ERROR(backend->last_error());
  return 2.0 * kDim * kDim * static_cast<double>(kDim) / Median(seconds);
}

// What one forward pass must do, from the shape (this rank = the whole model).
struct StepCost {
  double bytes = 0;  // Weights read once, KV entries read once, new KV written.
  double flops = 0;
};

// `attended`: Σ over the tokens of the positions each attends to; `kv_read`: distinct
// cached KV entries the pass reads; `logit_rows`: rows through the LM head. In a
// mixture-of-experts model each token computes with the active parameters, and the pass
// reads the experts any token chose: with uniform routing, E·(1 - (1 - k/E)^tokens) of
// each sparse layer's E.
StepCost Cost(const ModelConfig& c, size_t element_bytes, int64_t tokens, double attended,
              double kv_read, int logit_rows) {
  const double q = static_cast<double>(c.num_attention_heads) * c.head_dim;
  const double kv = static_cast<double>(c.num_kv_heads) * c.head_dim;
  const double h = c.hidden_size;
  const double lm_head = static_cast<double>(c.vocab_size) * h;
  const double embedding_and_head = lm_head * (c.tie_word_embeddings ? 1 : 2) + h;
  const double active = static_cast<double>(c.NumActiveParameters()) - embedding_and_head;
  double read = active;
  if (c.HasExperts()) {
    const double e = c.num_experts, k = c.experts_per_token;
    const double used = e * (1 - std::pow(1 - k / e, static_cast<double>(tokens)));
    read +=
        (static_cast<double>(c.NumParameters()) - c.NumActiveParameters()) * (used - k) / (e - k);
  }
  StepCost cost;
  cost.flops = 2.0 * (active * tokens + lm_head * logit_rows) +
               4.0 * c.num_layers * q * attended;  // QKᵀ and PV.
  const double kv_bytes_per_token = 2.0 * kv * c.num_layers * element_bytes;
  cost.bytes = (read + lm_head) * element_bytes + kv_bytes_per_token * (kv_read + tokens);
  return cost;
}

struct Row {
  std::string phase;
  int batch = 0;
  int64_t tokens = 0;  // Per step (decode) or in all (prefill).
  double seconds = 0;  // Per step (decode) or in all (prefill).
  double floor_seconds = 0;
  std::string bound;  // "memory" or "compute".
};

std::string FormatRow(const Row& r) {
  const double tok_s = r.tokens / r.seconds;
  std::string ratio =
      r.floor_seconds > 0 ? absl::StrFormat("%.2f", r.seconds / r.floor_seconds) : std::string("-");
  std::string floor_ms =
      r.floor_seconds > 0 ? absl::StrFormat("%.3f", r.floor_seconds * 1e3) : std::string("-");
  return absl::StrFormat("%-8s %6d %8d %11.3f %12.0f %10s %8s  %s", r.phase, r.batch, r.tokens,
                         r.seconds * 1e3, tok_s, floor_ms, ratio, r.bound);
}

// A NaN or an infinity in a step's logits is a broken forward pass, however fast: the
// logits on the host, or `device`'s copied there into `host`.
absl::Status CheckFinite(kernels::Backend& backend, const model::DeviceLogits* device,
                         std::vector<float>& host, const char* phase, int batch) {
  if (device != nullptr) {
    host.resize(static_cast<size_t>(device->world) * device->layout_rows * device->shard);
    backend.CopyActivationsToHost(host.data(), device->data, host.size());
    RETURN_IF_ERROR(backend.Synchronize());
  }
  const auto bad =
      std::find_if(host.begin(), host.end(), [](float x) { return !std::isfinite(x); });
  if (bad != host.end()) {
    return absl::InternalError(absl::StrCat(phase, " at batch ", batch, ": logit ",
                                            bad - host.begin(), " of ", host.size(), " is ", *bad,
                                            " (the forward pass is broken)"));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const std::string backend_name = absl::GetFlag(FLAGS_backend);
  ASSIGN_OR_RETURN(ModelConfig config, ModelShapePreset(absl::GetFlag(FLAGS_shape)));
  if (absl::GetFlag(FLAGS_layers) > 0) config.num_layers = absl::GetFlag(FLAGS_layers);
  std::vector<int> batches;
  for (const std::string& b : absl::GetFlag(FLAGS_batches)) {
    int value = 0;
    if (!absl::SimpleAtoi(b, &value) || value < 1) {
      return absl::InvalidArgumentError(absl::StrCat("--batches: '", b, "' is not a positive int"));
    }
    batches.push_back(value);
  }
  const int prompt = absl::GetFlag(FLAGS_prompt_tokens);
  const int decode_steps = absl::GetFlag(FLAGS_decode_steps);
  const int block_size = absl::GetFlag(FLAGS_block_size);
  const int max_step_tokens = absl::GetFlag(FLAGS_max_step_tokens);
  if (prompt < 1 || decode_steps < 1 || block_size < 1 || max_step_tokens < 1) {
    return absl::InvalidArgumentError(
        "--prompt_tokens, --decode_steps, --block_size and --max_step_tokens must be >= 1");
  }
  const bool with_graphs = backend_name == "cuda" && absl::GetFlag(FLAGS_cuda_graphs);
  // Decode measured once, or twice (without and with graphs), 3 warm-up steps each.
  const int context_limit = prompt + (with_graphs ? 2 : 1) * (decode_steps + 3) + 1;
  if (context_limit > config.max_context_tokens) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--prompt_tokens + steps exceeds the shape's context of ", config.max_context_tokens));
  }
  const Clock::time_point run_start = Clock::now();

  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, MakeBackend(backend_name));
  Ceilings ceilings;
  if (backend_name == "cuda" && absl::GetFlag(FLAGS_ceilings)) {
#ifdef CONVEYOR_HAVE_CUDA
    ASSIGN_OR_RETURN(ceilings.bandwidth, kernels::MeasureCopyBandwidth(absl::GetFlag(FLAGS_device),
                                                                       size_t{2} << 30, 10));
#endif
    ASSIGN_OR_RETURN(ceilings.matrix, MeasureMatrixRate(backend.get()));
  }
  std::printf("backend %s (%zu-byte activations)\n", backend->name().c_str(),
              backend->activation_bytes());
  if (ceilings.matrix > 0) {
    std::printf("ceilings: copy bandwidth %.0f GB/s (read + write), matrix rate %.1f TFLOP/s\n",
                ceilings.bandwidth / 1e9, ceilings.matrix / 1e12);
  } else {
    std::printf("ceilings: not measured (CUDA only)\n");
  }

  Clock::time_point load_start = Clock::now();
  const std::unique_ptr<model::WeightSource> weights = testing::MakeRandomWeightSource(2026);
  ASSIGN_OR_RETURN(std::unique_ptr<model::LlamaModel> model,
                   model::LlamaModel::Create(config, *weights, backend.get()));
  std::printf(
      "model: %d layers, hidden %d, vocab %d, %.2f G parameters, %.2f GiB on the "
      "backend, built in %.1f s\n",
      config.num_layers, config.hidden_size, config.vocab_size, config.NumParameters() / 1e9,
      model->weight_bytes() / double(1 << 30), SecondsSince(load_start));

  const int max_batch = *std::max_element(batches.begin(), batches.end());
  std::unique_ptr<model::DeviceSampler> sampler;  // Before the cache: it takes memory.
  if (backend_name == "cuda" && absl::GetFlag(FLAGS_device_sampling)) {
    ASSIGN_OR_RETURN(sampler, model::MakeCudaSampler(backend.get(), config.vocab_size, max_batch));
  }
  std::printf("decode sampling: %s\n", sampler ? "on the device" : "logits to the host");
  const int blocks_per_seq = (context_limit + block_size - 1) / block_size;
  ASSIGN_OR_RETURN(
      std::unique_ptr<model::KvCache> cache,
      model::KvCache::Create(backend.get(), config.num_layers, model->local_num_kv_heads(),
                             config.head_dim, block_size, max_batch * blocks_per_seq));
  std::printf("KV cache: %d blocks of %d tokens, %.2f GiB\n", cache->num_blocks(), block_size,
              cache->size_bytes() / double(1 << 30));
  model::DirectRunner runner(model.get(), cache.get());
  const size_t element_bytes = backend->activation_bytes();
  std::mt19937 rng(7);
  std::uniform_int_distribution<int32_t> token(3, config.vocab_size - 1);

  std::vector<Row> rows;
  std::printf("\n%-8s %6s %8s %11s %12s %10s %8s  %s\n", "phase", "batch", "tokens", "ms", "tok/s",
              "floor_ms", "/floor", "bound");
  for (int batch : batches) {
    const double limit = absl::GetFlag(FLAGS_time_limit_s);
    if (limit > 0 && SecondsSince(run_start) > limit) {
      std::printf("(time limit of %.0f s reached: batch %d and larger skipped)\n", limit, batch);
      break;
    }
    runner.Clear();
    std::vector<int> seqs;
    for (int s = 0; s < batch; ++s) {
      std::vector<int32_t> tokens(prompt);
      for (int32_t& t : tokens) t = token(rng);
      seqs.push_back(runner.Add(std::move(tokens)));
    }
    // Prefill: every prompt, in steps of at most max_step_tokens tokens.
    Clock::time_point start = Clock::now();
    RETURN_IF_ERROR(runner.ComputeAll(seqs, max_step_tokens));
    RETURN_IF_ERROR(backend->last_error());
    Row prefill{"prefill", batch, static_cast<int64_t>(batch) * prompt, SecondsSince(start), 0, ""};
    {
      // Causal attention: a prompt's tokens see 1..prompt positions.
      const double attended = batch * (prompt * (prompt + 1.0) / 2.0);
      const StepCost cost = Cost(config, element_bytes, prefill.tokens, attended, 0, batch);
      if (ceilings.matrix > 0) {
        prefill.floor_seconds =
            std::max(cost.flops / ceilings.matrix, cost.bytes / std::max(ceilings.bandwidth, 1.0));
        prefill.bound =
            cost.flops / ceilings.matrix >= cost.bytes / ceilings.bandwidth ? "compute" : "memory";
      }
    }
    rows.push_back(prefill);
    std::printf("%s\n", FormatRow(prefill).c_str());

    // Decode: one token per sequence per step, greedy.
    std::vector<int32_t> next(batch);
    for (int32_t& t : next) t = token(rng);
    std::vector<float> logits;
    model::SamplingParams greedy;
    greedy.temperature = 0.0f;
    model::RowToSample greedy_row;
    greedy_row.params = &greedy;
    const std::vector<model::RowToSample> to_sample(batch, greedy_row);
    std::vector<model::SampleResult> sampled;
    model::DeviceLogits device_logits;
    std::vector<float> checked;
    auto measure_decode = [&](const char* phase) -> absl::Status {
      std::vector<double> seconds;
      double context_sum = 0;
      for (int step = 0; step < 3 + decode_steps; ++step) {
        for (size_t row = 0; row < seqs.size(); ++row) runner.Append(seqs[row], next[row]);
        start = Clock::now();
        int logit_rows = 0;
        if (sampler != nullptr) {
          ASSIGN_OR_RETURN(device_logits, runner.StepOnDevice(seqs, 0, false));
          logit_rows = device_logits.rows;
          if (logit_rows == batch) {
            RETURN_IF_ERROR(sampler->Sample(device_logits, to_sample, &sampled));
          }
        } else {
          ASSIGN_OR_RETURN(logit_rows, runner.Step(seqs, 0, false, &logits));
        }
        const double t = SecondsSince(start);
        RETURN_IF_ERROR(backend->last_error());
        if (logit_rows != batch) return absl::InternalError("decode step lost a sequence's row");
        if (step == 2 + decode_steps) {  // The last step, untimed: every logit finite.
          RETURN_IF_ERROR(CheckFinite(*backend, sampler != nullptr ? &device_logits : nullptr,
                                      sampler != nullptr ? checked : logits, phase, batch));
        }
        for (int row = 0; row < batch; ++row) {
          next[row] =
              sampler != nullptr
                  ? sampled[row].token_id
                  : model::Argmax(std::span<const float>(
                        logits.data() + size_t(row) * config.vocab_size, config.vocab_size));
        }
        if (step >= 3) {
          seconds.push_back(t);
          for (int s : seqs) context_sum += runner.num_computed(s);
        }
      }
      Row decode{phase, batch, batch, Median(seconds), 0, ""};
      // Each new token attends to its whole context, which the pass reads once.
      const double context = context_sum / decode_steps;
      const StepCost cost = Cost(config, element_bytes, batch, context, context - batch, batch);
      if (ceilings.matrix > 0 && ceilings.bandwidth > 0) {
        const double memory = cost.bytes / ceilings.bandwidth;
        const double compute = cost.flops / ceilings.matrix;
        decode.floor_seconds = std::max(memory, compute);
        decode.bound = memory >= compute ? "memory" : "compute";
      }
      rows.push_back(decode);
      std::printf("%s\n", FormatRow(decode).c_str());
      std::fflush(stdout);
      return absl::OkStatus();
    };
    RETURN_IF_ERROR(measure_decode("decode"));
    if (with_graphs) {
      // The same sequences, a little further on, with CUDA graphs (the first step
      // captures, inside the warm-up).
      RETURN_IF_ERROR(model->EnableDecodeGraphs(max_batch));
      const absl::Status graphed = measure_decode("decode+graph");
      model->DisableDecodeGraphs();
      RETURN_IF_ERROR(graphed);
    }
  }
  std::printf(
      "\n(prefill: all B prompts, ms in all; decode: one step of B tokens, median of "
      "%d; floor = max(bytes / bandwidth, FLOPs / matrix rate); run %.0f s)\n",
      decode_steps, SecondsSince(run_start));

  if (const std::string path = absl::GetFlag(FLAGS_json); !path.empty()) {
    nlohmann::json report = {{"backend", backend->name()},
                             {"shape", absl::GetFlag(FLAGS_shape)},
                             {"layers", config.num_layers},
                             {"prompt_tokens", prompt},
                             {"bandwidth_bytes_per_s", ceilings.bandwidth},
                             {"matrix_flops_per_s", ceilings.matrix},
                             {"rows", nlohmann::json::array()}};
    for (const Row& r : rows) {
      report["rows"].push_back({{"phase", r.phase},
                                {"batch", r.batch},
                                {"tokens", r.tokens},
                                {"seconds", r.seconds},
                                {"floor_seconds", r.floor_seconds},
                                {"bound", r.bound}});
    }
    std::ofstream out(path);
    out << report.dump(2) << "\n";
    if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace conveyor::bench

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "Times forward steps of a random-weight model against the device's ceilings.\n"
      "  conveyor-step-bench --backend=cuda [--shape=llama3-8b] [--batches=1,8,64,256]");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = conveyor::bench::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "conveyor-step-bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
