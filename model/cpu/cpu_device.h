// The CPU device (model/device.h): the CPU backend (kernels/cpu/), Gloo over TCP between
// the ranks (gloo_communicator.h; they meet through the Rendezvous the options carry, which
// the worker serves over gRPC), host sampling, and a KV budget taken from the memory the
// machine has free. Also what a process needs to know of the CPU kernels before it builds
// one: whether the instruction-set override is valid, and which kernels run.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/device.h"
#include "model/rendezvous.h"

namespace conveyor::model {

// --cpu_weight_dtype: how linear-layer weights are stored (docs/cpu-weights.md).
enum class CpuWeightChoice {
  kAuto,  // A GGUF file of block-quantized layers: its blocks as they are where the CPU
          // has AVX-512 VNNI, else int8 (each the faster there, docs/cpu-weights.md); bf16
          // for a bf16/f16 checkpoint where the kernels have AVX512-BF16; else f32.
  kF32,
  kBf16,
  kInt8,
  kGguf,  // A GGUF file's block-quantized weights as they are (KeepsQuantizedWeights); the
          // other tensors as auto would store them.
};

// Parses "auto", "f32", "bf16", "int8" or "gguf".
absl::StatusOr<CpuWeightChoice> ParseCpuWeightChoice(std::string_view name);

// The dtype `choice` means for a checkpoint declaring `torch_dtype` on this CPU.
kernels::CpuWeightDtype ResolveCpuWeightDtype(CpuWeightChoice choice, std::string_view torch_dtype);

// Whether `choice` keeps a checkpoint's GGUF block-quantized weights in their blocks: gguf,
// or auto where the quantized kernels beat int8, on a file whose layers are stored in one
// (torch_dtype "Q8_0", "Q4_K", ...; the other tensors then get ResolveCpuWeightDtype's
// dtype). Every other choice dequantizes.
bool KeepsQuantizedWeights(CpuWeightChoice choice, std::string_view torch_dtype);

// --cpu_kv_dtype: how the KV cache is stored (docs/cpu-attention.md).
enum class CpuKvChoice {
  kAuto,  // bf16 where the weights are bf16 or int8, f32 where they are f32.
  kF32,
  kBf16,
};

// Parses "auto", "f32" or "bf16".
absl::StatusOr<CpuKvChoice> ParseCpuKvChoice(std::string_view name);

// The KV dtype `choice` means next to weights stored as `weights` (or kept quantized).
kernels::CpuKvDtype ResolveCpuKvDtype(CpuKvChoice choice, kernels::CpuWeightDtype weights,
                                      bool quantized_weights = false);

struct CpuDeviceOptions {
  int num_threads = 0;  // Compute threads; 0: one per core.
  CpuWeightChoice weights = CpuWeightChoice::kF32;
  CpuKvChoice kv = CpuKvChoice::kF32;
  // Address the other ranks reach this one at for collectives (the rendezvous store and
  // Gloo's TCP pairs).
  std::string collective_host = "127.0.0.1";
  // Where tensor-parallel ranks meet (the worker's gRPC store); null: one rank only.
  std::shared_ptr<Rendezvous> rendezvous;
};

std::unique_ptr<Device> MakeCpuDevice(const CpuDeviceOptions& options);

// Empty, or why the CONVEYOR_CPU_ISA override cannot be used on this CPU (the process
// should stop: the kernels' instruction set is fixed on first use).
std::string CpuIsaEnvironmentError();
// One line on the CPU kernels this process runs: the instruction level, what the CPU
// has, and how bf16 weights multiply (for the start-up log).
std::string CpuKernelsSummary();

}  // namespace conveyor::model
