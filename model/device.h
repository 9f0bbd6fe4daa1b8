// A kind of compute device (the CPU, a CUDA GPU) and everything a worker needs that
// differs between them: the backend that computes, the communicator that joins the
// tensor-parallel ranks (and the collective id they meet through), the sampler that
// runs where the logits are, the default KV-cache budget and whether decode steps run as
// captured graphs. The worker picks one Device at start-up, from its --backend flag,
// and from then on never asks which one it has.
//
// Implementations: the CPU device (model/cpu/cpu_device.h: its ranks meet through the
// Rendezvous of model/rendezvous.h, which the worker serves over gRPC) and the CUDA device
// (model/cuda/cuda_device.h). Neither uses gRPC, so the GPU-only test build has the model
// runtime whole.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "checkpoint/model_config.h"
#include "kernels/backend.h"
#include "model/communicator.h"
#include "model/device_sampler.h"

namespace conveyor::model {

class Device {
 public:
  virtual ~Device() = default;

  // "cpu" or "cuda".
  virtual std::string_view name() const = 0;

  // A new backend on this device for `model` (its config.json, as the checkpoint
  // declares it: the CPU device stores weights in a dtype chosen from it). The worker
  // makes one per model it loads.
  virtual absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(
      const ModelConfig& model) = 0;

  // A fresh collective id for a tensor-parallel group whose rank 0 runs in this
  // process. Whatever the rendezvous needs (a store, a bootstrap thread) is kept until
  // EndRendezvous().
  virtual absl::StatusOr<std::string> CreateCollectiveId() = 0;
  // Rank 0's group has formed (or failed to): rendezvous state may go.
  virtual void EndRendezvous() {}

  // Joins `rank` of `world_size` to the group `collective_id` names, computing on
  // `backend` (made by MakeBackend; it must outlive the communicator). Waits for every
  // rank until `deadline`. A world of one needs no id and returns a single-rank one.
  virtual absl::StatusOr<std::unique_ptr<Communicator>> Connect(
      std::string_view collective_id, int rank, int world_size, kernels::Backend* backend,
      std::chrono::system_clock::time_point deadline) = 0;

  // A sampler for rows of `vocab_size` logits, at most `max_rows` per call, that runs on
  // `backend`; null when this device samples on the host (Sampler, model/sampler.h).
  virtual absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeSampler(kernels::Backend* backend,
                                                                     int vocab_size,
                                                                     int max_rows) = 0;

  // KV-cache bytes to allocate when the scheduler leaves the budget to the worker.
  // Called once the weights and every other allocation are in place, so that what it
  // measures as free is what the cache may take.
  virtual absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend* backend) const = 0;

  // Whether decode steps should run as captured graphs (LlamaModel::EnableDecodeGraphs).
  virtual bool decode_graphs() const { return false; }

  // Whether a forward pass keeps the host's CPU cores busy (rather than waiting on an
  // accelerator). The scheduler then plans each step after the last one's answer by
  // default: work it overlapped with a step would take those cores from it.
  virtual bool computes_on_host_cores() const { return false; }
};

}  // namespace conveyor::model
