// NCCL: the communicator of the CUDA backend. Built only when CUDA is enabled; this
// header needs no CUDA or NCCL headers.
//
// The collective id is "nccl:" followed by the bytes of ncclGetUniqueId, made by rank
// 0's process (whose NCCL bootstrap thread then waits for the ranks to join).
//
// NCCL is loaded at run time (libnccl.so.2 on the loader's path, or the file
// CONVEYOR_NCCL_LIBRARY names): one GPU per replica never needs it, and a machine
// without it fails a tensor-parallel group's start with a message that says so. A build
// whose configure found no nccl.h refuses tensor parallelism on CUDA the same way.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/communicator.h"

namespace conveyor::model {

// A fresh collective id for one NCCL communicator.
absl::StatusOr<std::string> CreateNcclCollectiveId();

// Joins `rank` of `world_size` to the communicator `collective_id` names, on `backend`'s
// device, reducing activations of `dtype` (the backend's compute dtype). Blocks until
// every rank has joined, or fails with UNAVAILABLE at `deadline`. `backend` must outlive
// the communicator. A peer that dies or hangs later fails `backend` (ReportFailure) with
// UNAVAILABLE, which its next Synchronize returns.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    std::string_view collective_id, int rank, int world_size, kernels::CudaBackend* backend,
    kernels::CudaComputeDtype dtype, std::chrono::system_clock::time_point deadline);

// "NCCL <version> from <file>", or why it cannot be loaded (for logs and the GPU checks).
std::string DescribeNccl();

}  // namespace conveyor::model
