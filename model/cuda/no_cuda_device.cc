// The CUDA device's entry points in a build without CUDA: they fail with a message that
// says how to get a build with it.
#include "model/cuda/cuda_device.h"

namespace conveyor::model {
namespace {

absl::Status NoCuda() {
  return absl::UnimplementedError(
      "this build has no CUDA backend; rebuild with -DCONVEYOR_CUDA=ON on a machine with the "
      "CUDA toolkit");
}

}  // namespace

absl::StatusOr<std::unique_ptr<Device>> MakeCudaDevice(const CudaDeviceOptions&) {
  return NoCuda();
}

absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeCudaSampler(kernels::Backend*, int, int) {
  return NoCuda();
}

}  // namespace conveyor::model
