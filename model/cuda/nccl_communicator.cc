#include "model/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::model {
namespace {

absl::Status NcclStatus(ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  // A remote or system error is another rank (or the network) going away: the group must
  // be rebuilt, but nothing was wrong with this rank's work.
  const std::string message = absl::StrCat(what, ": ", ncclGetErrorString(result));
  if (result == ncclRemoteError || result == ncclSystemError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

absl::Status CudaStatus(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

// Collectives are queued on the backend's own stream, in order with its kernels: the
// host never waits for them, so a forward pass with 2 collectives per layer stays one
// uninterrupted queue of device work. Errors inside a collective surface as the
// backend's sticky error at its next synchronisation.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int world_size, kernels::CudaBackend* backend,
                   ncclDataType_t dtype)
      : comm_(comm),
        stream_(static_cast<cudaStream_t>(backend->stream())),
        rank_(rank),
        world_size_(world_size),
        backend_(backend),
        dtype_(dtype) {}

  ~NcclCommunicator() override {
    cudaSetDevice(backend_->device());
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(void* data, size_t count) override {
    RETURN_IF_ERROR(Prepare());
    return NcclStatus(ncclAllReduce(data, data, count, dtype_, ncclSum, comm_, stream_),
                      "ncclAllReduce");
  }

  absl::Status AllGather(void* data, size_t count) override {
    RETURN_IF_ERROR(Prepare());
    // In place: NCCL allows sendbuff == recvbuff + rank * count.
    char* part = static_cast<char*>(data) + rank_ * count * backend_->activation_bytes();
    return NcclStatus(ncclAllGather(part, data, count, dtype_, comm_, stream_), "ncclAllGather");
  }

 private:
  // Makes the backend's device current on this (gRPC) thread; a backend that already
  // failed gets no more work.
  absl::Status Prepare() {
    RETURN_IF_ERROR(backend_->last_error());
    return CudaStatus(cudaSetDevice(backend_->device()), "cudaSetDevice");
  }

  ncclComm_t comm_;
  cudaStream_t stream_;
  const int rank_;
  const int world_size_;
  kernels::CudaBackend* backend_;
  const ncclDataType_t dtype_;
};

}  // namespace

absl::StatusOr<std::string> CreateNcclCollectiveId() {
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(ncclGetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(kNcclIdPrefix) + std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(std::string_view collective_id, int rank,
                                                          int world_size,
                                                          kernels::CudaBackend* backend,
                                                          kernels::CudaComputeDtype dtype) {
  ASSIGN_OR_RETURN(const std::string_view payload,
                   CollectiveIdPayload(collective_id, kNcclIdPrefix));
  ncclUniqueId id;
  if (payload.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("an NCCL collective_id carries ",
                                                   sizeof(id.internal), " bytes, this one ",
                                                   payload.size()));
  }
  std::memcpy(id.internal, payload.data(), payload.size());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(backend->device()), "cudaSetDevice"));
  ncclComm_t comm = nullptr;
  RETURN_IF_ERROR(NcclStatus(ncclCommInitRank(&comm, world_size, id, rank), "ncclCommInitRank"));
  const ncclDataType_t nccl_dtype =
      dtype == kernels::CudaComputeDtype::kBf16 ? ncclBfloat16 : ncclFloat16;
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(comm, rank, world_size, backend, nccl_dtype));
}

}  // namespace conveyor::model
