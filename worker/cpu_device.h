// The CPU device (model/device.h): the CPU backend (kernels/cpu/), Gloo over TCP between
// the ranks, host sampling, and a KV budget taken from the memory the machine has free.
// It lives with the worker, not in model/, because its ranks meet through a small
// key-value store that rank 0 serves over gRPC (worker/gloo_communicator.h).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/device.h"
#include "rpc/grpc_tls.h"

namespace conveyor::worker {

// --cpu_weight_dtype: how linear-layer weights are stored (docs/cpu-weights.md).
enum class CpuWeightChoice {
  kAuto,  // bf16 for a bf16/f16 checkpoint where the kernels have AVX512-BF16, else f32.
  kF32,
  kBf16,
  kInt8,
};

// Parses "auto", "f32", "bf16" or "int8".
absl::StatusOr<CpuWeightChoice> ParseCpuWeightChoice(std::string_view name);

// The dtype `choice` means for a checkpoint declaring `torch_dtype` on this CPU.
kernels::CpuWeightDtype ResolveCpuWeightDtype(CpuWeightChoice choice, std::string_view torch_dtype);

// --cpu_kv_dtype: how the KV cache is stored (docs/cpu-attention.md).
enum class CpuKvChoice {
  kAuto,  // bf16 where the weights are bf16 or int8, f32 where they are f32.
  kF32,
  kBf16,
};

// Parses "auto", "f32" or "bf16".
absl::StatusOr<CpuKvChoice> ParseCpuKvChoice(std::string_view name);

// The KV dtype `choice` means next to weights stored as `weights`.
kernels::CpuKvDtype ResolveCpuKvDtype(CpuKvChoice choice, kernels::CpuWeightDtype weights);

struct CpuDeviceOptions {
  int num_threads = 0;  // Compute threads; 0: one per core.
  CpuWeightChoice weights = CpuWeightChoice::kF32;
  CpuKvChoice kv = CpuKvChoice::kF32;
  // Address the other ranks reach this one at for collectives (the rendezvous store and
  // Gloo's TCP pairs).
  std::string collective_host = "127.0.0.1";
  // The worker's mTLS files, which also secure the rendezvous store; empty: plaintext.
  TlsFiles tls;
};

std::unique_ptr<model::Device> MakeCpuDevice(const CpuDeviceOptions& options);

}  // namespace conveyor::worker
