#include "model/cpu/cpu_device.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_gemm.h"
#include "model/cpu/gloo_communicator.h"
#include "spdlog/spdlog.h"

namespace conveyor::model {
namespace {

// Without an explicit budget the CPU worker takes this share of available memory, up
// to a cap (a CPU worker rarely profits from more).
constexpr double kDefaultKvShareOfAvailableMemory = 0.3;
constexpr uint64_t kDefaultKvCapBytes = 4ull << 30;

// MemAvailable from /proc/meminfo in bytes, or 0 if unknown.
uint64_t AvailableMemoryBytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (meminfo >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

const char* ChoiceName(CpuWeightChoice choice) {
  switch (choice) {
    case CpuWeightChoice::kAuto:
      return "auto";
    case CpuWeightChoice::kBf16:
      return "bf16";
    case CpuWeightChoice::kInt8:
      return "int8";
    case CpuWeightChoice::kGguf:
      return "gguf";
    case CpuWeightChoice::kF32:
    default:
      return "f32";
  }
}

const char* KvChoiceName(CpuKvChoice choice) {
  switch (choice) {
    case CpuKvChoice::kAuto:
      return "auto";
    case CpuKvChoice::kBf16:
      return "bf16";
    case CpuKvChoice::kF32:
    default:
      return "f32";
  }
}

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : options_(options) {}

  std::string_view name() const override { return "cpu"; }
  bool computes_on_host_cores() const override { return true; }

  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const ModelConfig& model) override {
    const kernels::CpuWeightDtype dtype =
        ResolveCpuWeightDtype(options_.weights, model.torch_dtype);
    const bool quantized = KeepsQuantizedWeights(options_.weights, model.torch_dtype);
    const kernels::CpuKvDtype kv = ResolveCpuKvDtype(options_.kv, dtype, quantized);
    std::unique_ptr<kernels::Backend> backend =
        kernels::MakeCpuBackend(options_.num_threads, dtype, kv, quantized);
    spdlog::info("CPU backend {} for a {} checkpoint (--cpu_weight_dtype={}, --cpu_kv_dtype={})",
                 backend->name(), model.torch_dtype.empty() ? "float32" : model.torch_dtype,
                 ChoiceName(options_.weights), KvChoiceName(options_.kv));
    return backend;
  }

  absl::StatusOr<std::string> CreateCollectiveId() override {
    RETURN_IF_ERROR(NeedRendezvous());
    store_.reset();
    ASSIGN_OR_RETURN(store_, ServeGlooStore(*options_.rendezvous, options_.collective_host));
    return GlooCollectiveId(*store_);
  }

  void EndRendezvous() override { store_.reset(); }

  absl::StatusOr<std::unique_ptr<Communicator>> Connect(
      std::string_view collective_id, int rank, int world_size, kernels::Backend*,
      std::chrono::system_clock::time_point deadline) override {
    if (world_size <= 1) return MakeSingleRankCommunicator();
    RETURN_IF_ERROR(NeedRendezvous());
    return ConnectGloo(collective_id, rank, world_size, options_.collective_host, deadline,
                       *options_.rendezvous);
  }

  absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeSampler(kernels::Backend*, int, int) override {
    return std::unique_ptr<DeviceSampler>();  // Logits are host memory already.
  }

  absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend*) const override {
    return std::min(kDefaultKvCapBytes, static_cast<uint64_t>(AvailableMemoryBytes() *
                                                              kDefaultKvShareOfAvailableMemory));
  }

 private:
  absl::Status NeedRendezvous() const {
    if (options_.rendezvous != nullptr) return absl::OkStatus();
    return absl::FailedPreconditionError(
        "this CPU device was made without a rendezvous: it serves one rank only");
  }

  const CpuDeviceOptions options_;
  // Rank 0 between CreateCollectiveId and the end of its Init's rendezvous.
  std::unique_ptr<Rendezvous::ServedStore> store_;
};

}  // namespace

absl::StatusOr<CpuWeightChoice> ParseCpuWeightChoice(std::string_view name) {
  if (name == "auto") return CpuWeightChoice::kAuto;
  if (name == "f32") return CpuWeightChoice::kF32;
  if (name == "bf16") return CpuWeightChoice::kBf16;
  if (name == "int8") return CpuWeightChoice::kInt8;
  if (name == "gguf") return CpuWeightChoice::kGguf;
  return absl::InvalidArgumentError(absl::StrCat(
      "--cpu_weight_dtype must be auto, f32, bf16, int8 or gguf, got \"", std::string(name), "\""));
}

absl::StatusOr<CpuKvChoice> ParseCpuKvChoice(std::string_view name) {
  if (name == "auto") return CpuKvChoice::kAuto;
  if (name == "f32") return CpuKvChoice::kF32;
  if (name == "bf16") return CpuKvChoice::kBf16;
  return absl::InvalidArgumentError(
      absl::StrCat("--cpu_kv_dtype must be auto, f32 or bf16, got \"", std::string(name), "\""));
}

namespace {

// Whether a checkpoint's layer matrices are in ggml blocks (a GGUF file's, or the blocks a
// GPTQ/AWQ checkpoint maps to: ModelConfig::torch_dtype). The CPU kernels compute on them
// under --cpu_weight_dtype=gguf where PackLinearQuantized takes the type, else they are
// dequantized (ReadF32Slice) and stored as int8.
bool BlockQuantized(std::string_view torch_dtype) {
  for (std::string_view type : {"Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"}) {
    if (torch_dtype == type) return true;
  }
  return false;
}

}  // namespace

bool KeepsQuantizedWeights(CpuWeightChoice choice, std::string_view torch_dtype) {
  // auto keeps the blocks where their kernels beat int8 (AVX2, AVX-512 VNNI; docs/cpu-weights.md):
  // then the weights are the file's exactly, and fewer bytes.
  const bool keep = choice == CpuWeightChoice::kGguf ||
                    (choice == CpuWeightChoice::kAuto && kernels::QuantGemmBeatsInt8());
  return keep && BlockQuantized(torch_dtype);
}

kernels::CpuKvDtype ResolveCpuKvDtype(CpuKvChoice choice, kernels::CpuWeightDtype weights,
                                      bool quantized_weights) {
  switch (choice) {
    case CpuKvChoice::kBf16:
      return kernels::CpuKvDtype::kBf16;
    case CpuKvChoice::kF32:
      return kernels::CpuKvDtype::kF32;
    case CpuKvChoice::kAuto:
    default:
      // Narrow weights (bf16, int8, GGUF blocks) were chosen for speed and already cost more
      // accuracy than bf16 K and V add (docs/cpu-attention.md); f32 weights keep f32 K and V.
      return weights == kernels::CpuWeightDtype::kF32 && !quantized_weights
                 ? kernels::CpuKvDtype::kF32
                 : kernels::CpuKvDtype::kBf16;
  }
}

kernels::CpuWeightDtype ResolveCpuWeightDtype(CpuWeightChoice choice,
                                              std::string_view torch_dtype) {
  switch (choice) {
    case CpuWeightChoice::kF32:
      return kernels::CpuWeightDtype::kF32;
    case CpuWeightChoice::kBf16:
      return kernels::CpuWeightDtype::kBf16;
    case CpuWeightChoice::kInt8:
      return kernels::CpuWeightDtype::kInt8;
    case CpuWeightChoice::kAuto:
    case CpuWeightChoice::kGguf:
      break;
  }
  // A block-quantized file holds at most 8.5 bits a weight: int8 with per-channel scales
  // reads a byte each and, on a CPU without AVX2, runs faster than the portable block
  // kernel (docs/cpu-weights.md, bench/results/2026-12-06-quant). Where the blocks are kept
  // (KeepsQuantizedWeights) this applies only to the tensors left out of them
  // (embeddings, routers).
  if (choice == CpuWeightChoice::kAuto && BlockQuantized(torch_dtype)) {
    return kernels::CpuWeightDtype::kInt8;
  }
  // A 16-bit checkpoint is already rounded: as bf16 weights a bf16 one loses nothing (an
  // f16 one rounds 3 more mantissa bits away), and every decode step reads half the bytes.
  // Where the kernels compute in bf16 (AVX512-BF16, not lowered by CONVEYOR_CPU_ISA) it is
  // also twice the arithmetic rate; elsewhere the same bits cost an FMA per product
  // (docs/cpu-weights.md).
  const bool half_checkpoint = torch_dtype == "bfloat16" || torch_dtype == "float16";
  const bool bf16_cpu = kernels::ActiveCpuIsa() >= kernels::CpuIsa::kAvx512Bf16;
  return half_checkpoint && bf16_cpu ? kernels::CpuWeightDtype::kBf16
                                     : kernels::CpuWeightDtype::kF32;
}

std::unique_ptr<Device> MakeCpuDevice(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

std::string CpuIsaEnvironmentError() { return kernels::CpuIsaEnvironmentError(); }

std::string CpuKernelsSummary() {
  const kernels::CpuIsa active = kernels::ActiveCpuIsa();
  return absl::StrCat(kernels::CpuIsaName(active), " (this CPU has: ", kernels::CpuFeatureSummary(),
                      active < kernels::DetectedCpuIsa() ? "; lowered by CONVEYOR_CPU_ISA" : "",
                      "); bf16 weights multiply with ", kernels::Bf16ArithmeticChoice());
}

}  // namespace conveyor::model
