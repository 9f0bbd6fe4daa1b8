#include "worker/cpu_device.h"

#include <algorithm>
#include <fstream>

#include "common/status_macros.h"
#include "worker/gloo_communicator.h"

namespace conveyor::worker {
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

class CpuDevice final : public model::Device {
 public:
  explicit CpuDevice(const CpuDeviceOptions& options) : options_(options) {}

  std::string_view name() const override { return "cpu"; }

  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend() override {
    return kernels::MakeCpuBackend(options_.num_threads);
  }

  absl::StatusOr<std::string> CreateCollectiveId() override {
    rendezvous_.reset();
    ASSIGN_OR_RETURN(rendezvous_,
                     GlooRendezvousServer::Start(options_.collective_host, options_.tls));
    return rendezvous_->collective_id();
  }

  void EndRendezvous() override { rendezvous_.reset(); }

  absl::StatusOr<std::unique_ptr<model::Communicator>> Connect(
      std::string_view collective_id, int rank, int world_size, kernels::Backend*,
      std::chrono::system_clock::time_point deadline) override {
    if (world_size <= 1) return model::MakeSingleRankCommunicator();
    return ConnectGloo(collective_id, rank, world_size, options_.collective_host, deadline,
                       options_.tls);
  }

  absl::StatusOr<std::unique_ptr<model::DeviceSampler>> MakeSampler(kernels::Backend*, int,
                                                                    int) override {
    return std::unique_ptr<model::DeviceSampler>();  // Logits are host memory already.
  }

  absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend*) const override {
    return std::min(kDefaultKvCapBytes, static_cast<uint64_t>(AvailableMemoryBytes() *
                                                              kDefaultKvShareOfAvailableMemory));
  }

 private:
  const CpuDeviceOptions options_;
  // Rank 0 between CreateCollectiveId and the end of its Init's rendezvous.
  std::unique_ptr<GlooRendezvousServer> rendezvous_;
};

}  // namespace

std::unique_ptr<model::Device> MakeCpuDevice(const CpuDeviceOptions& options) {
  return std::make_unique<CpuDevice>(options);
}

}  // namespace conveyor::worker
