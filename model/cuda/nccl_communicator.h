// NCCL: the communicator of the CUDA backend. Built only when CUDA is enabled; this
// header needs no CUDA or NCCL headers.
//
// The collective id is "nccl:" followed by the bytes of ncclGetUniqueId, made by rank
// 0's process (whose NCCL bootstrap thread then waits for the ranks to join).
#pragma once

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
// every rank has joined. `backend` must outlive the communicator.
absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(std::string_view collective_id, int rank,
                                                          int world_size,
                                                          kernels::CudaBackend* backend,
                                                          kernels::CudaComputeDtype dtype);

}  // namespace conveyor::model
