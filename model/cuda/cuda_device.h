// The CUDA device (model/device.h): the CUDA backend (kernels/cuda/), NCCL between the
// ranks, sampling on the GPU, a KV budget from the memory left free after the weights,
// and optional CUDA graphs for decode steps. This folder is the only code outside
// kernels/cuda/ that sees the CUDA backend's own interface.
//
// In a build without CUDA these functions exist and fail with a message saying how to
// rebuild, so callers need no #ifdef.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/backend.h"
#include "model/device.h"
#include "model/device_sampler.h"

namespace conveyor::model {

struct CudaDeviceOptions {
  int device = 0;  // The CUDA device ordinal.
  // Without an explicit KV budget, the cache takes this share of the device memory left
  // after the weights, the activations and the sampler.
  double gpu_memory_fraction = 0.85;
  // Sample on the device (only token ids leave it) rather than copying every sampled
  // row's logits to the host.
  bool device_sampling = true;
  // Run decode steps as CUDA graphs (LlamaModel::EnableDecodeGraphs).
  bool decode_graphs = false;
};

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(const CudaDeviceOptions& options);

// The CUDA DeviceSampler (kernels/cuda/sampling_kernels.cu) for rows of `vocab_size`
// logits, at most `max_rows` per call, on `backend` (a CUDA backend, which must outlive
// it): its work is queued on the backend's stream. Takes 16 bytes × max_rows ×
// vocab_size of device memory.
absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeCudaSampler(kernels::Backend* backend,
                                                               int vocab_size, int max_rows);

}  // namespace conveyor::model
