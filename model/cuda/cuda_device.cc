#include "model/cuda/cuda_device.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_backend.h"
#include "model/cuda/nccl_communicator.h"

namespace conveyor::model {
namespace {

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(const CudaDeviceOptions& options) : options_(options) {}

  std::string_view name() const override { return "cuda"; }

  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const ModelConfig&) override {
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::CudaBackend> backend,
                     kernels::MakeCudaBackend(options_.device));
    return std::unique_ptr<kernels::Backend>(std::move(backend));
  }

  // NCCL's bootstrap thread, started by ncclGetUniqueId, waits for the ranks itself.
  absl::StatusOr<std::string> CreateCollectiveId() override { return CreateNcclCollectiveId(); }

  absl::StatusOr<std::unique_ptr<Communicator>> Connect(
      std::string_view collective_id, int rank, int world_size, kernels::Backend* backend,
      std::chrono::system_clock::time_point deadline) override {
    if (world_size <= 1) return MakeSingleRankCommunicator();
    ASSIGN_OR_RETURN(kernels::CudaBackend * cuda, AsCuda(backend));
    return ConnectNccl(collective_id, rank, world_size, cuda, cuda->dtype(), deadline);
  }

  absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeSampler(kernels::Backend* backend,
                                                             int vocab_size,
                                                             int max_rows) override {
    if (!options_.device_sampling) return std::unique_ptr<DeviceSampler>();
    return MakeCudaSampler(backend, vocab_size, max_rows);
  }

  absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend* backend) const override {
    ASSIGN_OR_RETURN(kernels::CudaBackend * cuda, AsCuda(backend));
    ASSIGN_OR_RETURN(size_t free_bytes, kernels::FreeDeviceMemoryBytes(cuda->device()));
    return static_cast<uint64_t>(free_bytes * options_.gpu_memory_fraction);
  }

  bool decode_graphs() const override { return options_.decode_graphs; }

 private:
  // Every backend this device sees is one MakeBackend made.
  static absl::StatusOr<kernels::CudaBackend*> AsCuda(kernels::Backend* backend) {
    auto* cuda = dynamic_cast<kernels::CudaBackend*>(backend);
    if (cuda == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("the CUDA device was given a ", backend->name(), " backend"));
    }
    return cuda;
  }

  const CudaDeviceOptions options_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(const CudaDeviceOptions& options) {
  if (options.gpu_memory_fraction <= 0 || options.gpu_memory_fraction > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("gpu_memory_fraction must be in (0, 1], got ", options.gpu_memory_fraction));
  }
  return std::unique_ptr<Device>(new CudaDevice(options));
}

}  // namespace conveyor::model
