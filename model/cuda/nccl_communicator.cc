#include "model/cuda/nccl_communicator.h"

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

#ifdef CONVEYOR_HAVE_NCCL_HEADER
#include <nccl.h>
#endif

namespace conveyor::model {

#ifndef CONVEYOR_HAVE_NCCL_HEADER

// Built without nccl.h: a single GPU needs no NCCL; a group of ranks is refused.
namespace {
absl::Status NoNccl() {
  return absl::FailedPreconditionError(
      "this build has no NCCL (nccl.h was not found at configure time): tensor parallelism "
      "on CUDA needs a build with NCCL's header; one GPU per replica works without it");
}
}  // namespace

absl::StatusOr<std::string> CreateNcclCollectiveId() { return NoNccl(); }

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(std::string_view, int, int,
                                                          kernels::CudaBackend*,
                                                          kernels::CudaComputeDtype,
                                                          std::chrono::system_clock::time_point) {
  return NoNccl();
}

std::string DescribeNccl() { return "not built in (no nccl.h at configure time)"; }

#else  // CONVEYOR_HAVE_NCCL_HEADER

namespace {

// A collective still queued after this long is taken for a hung peer (Gloo's operation
// timeout is the same).
constexpr std::chrono::minutes kOperationTimeout{2};
// How often the watchdog asks NCCL for asynchronous errors.
constexpr std::chrono::milliseconds kWatchdogPeriod{20};

// NCCL's entry points, loaded at run time: a CUDA build then starts on machines without
// NCCL, which only a tensor-parallel group needs. The header gives the types.
struct NcclApi {
  decltype(&ncclGetVersion) GetVersion = nullptr;
  decltype(&ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig = nullptr;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&ncclCommAbort) CommAbort = nullptr;
  decltype(&ncclAllReduce) AllReduce = nullptr;
  decltype(&ncclAllGather) AllGather = nullptr;
  decltype(&ncclGetErrorString) GetErrorString = nullptr;
  decltype(&ncclGetLastError) GetLastError = nullptr;
  std::string library;  // The file that was loaded.
};

template <typename Fn>
bool LoadSymbol(void* handle, const char* name, Fn* fn) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  return *fn != nullptr;
}

absl::StatusOr<const NcclApi*> LoadNccl() {
  static const absl::StatusOr<NcclApi> api = []() -> absl::StatusOr<NcclApi> {
    // CONVEYOR_NCCL_LIBRARY names the file; otherwise the loader's search path.
    const char* configured = std::getenv("CONVEYOR_NCCL_LIBRARY");
    std::string tried;
    void* handle = nullptr;
    for (const char* name : {configured, "libnccl.so.2", "libnccl.so"}) {
      if (name == nullptr || *name == '\0') continue;
      handle = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle != nullptr) {
        tried = name;
        break;
      }
      absl::StrAppend(&tried, tried.empty() ? "" : "; ", dlerror());
    }
    if (handle == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor parallelism on CUDA needs NCCL, and it could not be loaded (", tried,
          "): install NCCL 2.18 or later (libnccl2, or the nvidia-nccl-cu13 wheel) and put its "
          "folder on LD_LIBRARY_PATH, or name the file in CONVEYOR_NCCL_LIBRARY"));
    }
    NcclApi loaded;
    loaded.library = tried;
    const bool all = LoadSymbol(handle, "ncclGetVersion", &loaded.GetVersion) &&
                     LoadSymbol(handle, "ncclGetUniqueId", &loaded.GetUniqueId) &&
                     LoadSymbol(handle, "ncclCommInitRankConfig", &loaded.CommInitRankConfig) &&
                     LoadSymbol(handle, "ncclCommGetAsyncError", &loaded.CommGetAsyncError) &&
                     LoadSymbol(handle, "ncclCommAbort", &loaded.CommAbort) &&
                     LoadSymbol(handle, "ncclAllReduce", &loaded.AllReduce) &&
                     LoadSymbol(handle, "ncclAllGather", &loaded.AllGather) &&
                     LoadSymbol(handle, "ncclGetErrorString", &loaded.GetErrorString) &&
                     LoadSymbol(handle, "ncclGetLastError", &loaded.GetLastError);
    if (!all) {
      return absl::FailedPreconditionError(absl::StrCat(
          tried, " lacks an entry point Conveyor uses (", dlerror(), "): NCCL 2.18 or later"));
    }
    return loaded;
  }();
  if (!api.ok()) return api.status();
  return &*api;
}

std::string ErrorText(const NcclApi& api, ncclComm_t comm, ncclResult_t result) {
  std::string text = api.GetErrorString(result);
  const char* last = api.GetLastError(comm);
  if (last != nullptr && *last != '\0') absl::StrAppend(&text, " (", last, ")");
  return text;
}

absl::Status NcclStatus(const NcclApi& api, ncclResult_t result, const char* what) {
  if (result == ncclSuccess) return absl::OkStatus();
  // A remote or system error is another rank (or the network) going away: the group must
  // be rebuilt, but nothing was wrong with this rank's work.
  const std::string message = absl::StrCat(what, ": ", ErrorText(api, nullptr, result));
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
// uninterrupted queue of device work.
//
// A peer that dies leaves a collective waiting for it forever, and the backend waiting
// on its stream with it. So a watchdog thread asks NCCL for asynchronous errors every
// kWatchdogPeriod, and watches how long the latest collective has been queued; on an
// error, or a collective older than kOperationTimeout, it aborts the communicator (which
// ends the waiting kernels, so the stream drains) and fails the backend with
// UNAVAILABLE, which the next Synchronize returns: the step fails as it does when a Gloo
// peer goes away, and the scheduler rebuilds the group.
//
// The communicator is non-blocking (ncclConfig_t.blocking = 0): an NCCL call may return
// ncclInProgress, after which nothing else may be called on it until
// ncclCommGetAsyncError stops saying so. Every call on comm_ holds mu_, so the
// watchdog never aborts under a call in progress.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(const NcclApi& api, ncclComm_t comm, int rank, int world_size,
                   kernels::CudaBackend* backend, ncclDataType_t dtype, cudaEvent_t queued)
      : api_(api),
        comm_(comm),
        stream_(static_cast<cudaStream_t>(backend->stream())),
        rank_(rank),
        world_size_(world_size),
        backend_(backend),
        dtype_(dtype),
        queued_(queued),
        watchdog_([this] { Watch(); }) {}

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    wake_.notify_all();
    watchdog_.join();
    cudaSetDevice(backend_->device());
    if (comm_ != nullptr) {
      // Let queued collectives finish (a bounded wait: a peer may be gone without NCCL
      // having said so yet), then abort: nothing is left for a graceful finalize to flush,
      // and a non-blocking communicator's destroy could itself be left in progress.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
      while (cudaStreamQuery(stream_) == cudaErrorNotReady) {
        ncclResult_t state = ncclSuccess;
        api_.CommGetAsyncError(comm_, &state);
        if ((state != ncclSuccess && state != ncclInProgress) ||
            std::chrono::steady_clock::now() > until) {
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      api_.CommAbort(comm_);
    }
    cudaEventDestroy(queued_);
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_size_; }

  absl::Status AllReduceSum(void* data, size_t count) override {
    return Enqueue("ncclAllReduce", [&] {
      return api_.AllReduce(data, data, count, dtype_, ncclSum, comm_, stream_);
    });
  }

  absl::Status AllGather(void* data, size_t count) override {
    // In place: NCCL allows sendbuff == recvbuff + rank * count.
    char* part = static_cast<char*>(data) + rank_ * count * backend_->activation_bytes();
    return Enqueue("ncclAllGather",
                   [&] { return api_.AllGather(part, data, count, dtype_, comm_, stream_); });
  }

 private:
  template <typename Call>
  absl::Status Enqueue(const char* what, Call call) {
    // A backend that already failed gets no more work.
    RETURN_IF_ERROR(backend_->last_error());
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(backend_->device()), "cudaSetDevice"));
    std::lock_guard<std::mutex> lock(mu_);
    if (comm_ == nullptr) return failure_;
    ncclResult_t result = call();
    const auto start = std::chrono::steady_clock::now();
    while (result == ncclInProgress) {  // Connecting to a peer for the first time.
      if (std::chrono::steady_clock::now() - start > kOperationTimeout) {
        FailLocked(absl::UnavailableError(
            absl::StrCat(what, " on rank ", rank_, " of ", world_size_, " still connecting after ",
                         kOperationTimeout.count(), " min: a peer is gone or hung")));
        return failure_;
      }
      std::this_thread::yield();
      api_.CommGetAsyncError(comm_, &result);
    }
    if (result != ncclSuccess) {
      FailLocked(absl::UnavailableError(absl::StrCat(what, " on rank ", rank_, " of ", world_size_,
                                                     " failed: ", ErrorText(api_, comm_, result))));
      return failure_;
    }
    // Timed unless captured into a CUDA graph (a decode graph replays its collectives
    // untimed: the asynchronous errors still end a replay that waits for a dead peer).
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    RETURN_IF_ERROR(CudaStatus(cudaStreamIsCapturing(stream_, &capture), "cudaStreamIsCapturing"));
    if (capture == cudaStreamCaptureStatusNone) {
      RETURN_IF_ERROR(CudaStatus(cudaEventRecord(queued_, stream_), "cudaEventRecord"));
      last_queued_ = std::chrono::steady_clock::now();
    }
    return absl::OkStatus();
  }

  void Watch() {
    cudaSetDevice(backend_->device());
    std::unique_lock<std::mutex> lock(mu_);
    while (!stop_ && comm_ != nullptr) {
      wake_.wait_for(lock, kWatchdogPeriod);
      if (stop_ || comm_ == nullptr) break;
      ncclResult_t state = ncclSuccess;
      api_.CommGetAsyncError(comm_, &state);
      if (state != ncclSuccess && state != ncclInProgress) {
        FailLocked(absl::UnavailableError(absl::StrCat(
            "NCCL on rank ", rank_, " of ", world_size_, " reported an asynchronous error: ",
            ErrorText(api_, comm_, state), "; the communicator was aborted")));
        break;
      }
      if (last_queued_.has_value() && cudaEventQuery(queued_) == cudaErrorNotReady &&
          std::chrono::steady_clock::now() - *last_queued_ > kOperationTimeout) {
        FailLocked(absl::UnavailableError(absl::StrCat(
            "a collective on NCCL rank ", rank_, " of ", world_size_, " did not complete in ",
            kOperationTimeout.count(), " min (a peer hung); the communicator was aborted")));
        break;
      }
    }
  }

  // Aborts the communicator (ending its waiting kernels) and fails the backend. mu_ held.
  void FailLocked(absl::Status status) {
    failure_ = std::move(status);
    api_.CommAbort(comm_);
    comm_ = nullptr;
    backend_->ReportFailure(failure_);
  }

  const NcclApi& api_;
  std::mutex mu_;
  std::condition_variable wake_;
  ncclComm_t comm_;  // Null once aborted. Guarded by mu_.
  cudaStream_t stream_;
  const int rank_;
  const int world_size_;
  kernels::CudaBackend* backend_;
  const ncclDataType_t dtype_;
  cudaEvent_t queued_;  // Recorded after each collective.
  std::optional<std::chrono::steady_clock::time_point> last_queued_;  // Guarded by mu_.
  absl::Status failure_;                                              // Guarded by mu_.
  bool stop_ = false;                                                 // Guarded by mu_.
  std::thread watchdog_;  // Last: starts once the rest is set.
};

}  // namespace

absl::StatusOr<std::string> CreateNcclCollectiveId() {
  ASSIGN_OR_RETURN(const NcclApi* api, LoadNccl());
  ncclUniqueId id;
  RETURN_IF_ERROR(NcclStatus(*api, api->GetUniqueId(&id), "ncclGetUniqueId"));
  return std::string(kNcclIdPrefix) + std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectNccl(
    std::string_view collective_id, int rank, int world_size, kernels::CudaBackend* backend,
    kernels::CudaComputeDtype dtype, std::chrono::system_clock::time_point deadline) {
  ASSIGN_OR_RETURN(const std::string_view payload,
                   CollectiveIdPayload(collective_id, kNcclIdPrefix));
  ncclUniqueId id;
  if (payload.size() != sizeof(id.internal)) {
    return absl::InvalidArgumentError(absl::StrCat("an NCCL collective_id carries ",
                                                   sizeof(id.internal), " bytes, this one ",
                                                   payload.size()));
  }
  std::memcpy(id.internal, payload.data(), payload.size());
  ASSIGN_OR_RETURN(const NcclApi* api, LoadNccl());
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(backend->device()), "cudaSetDevice"));

  // Non-blocking, so that a rank that never joins cannot hold this one past `deadline`.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t state = api->CommInitRankConfig(&comm, world_size, id, rank, &config);
  const auto failed = [&](const std::string& why) {
    if (comm != nullptr) api->CommAbort(comm);
    return absl::UnavailableError(
        absl::StrCat("NCCL rendezvous of rank ", rank, " of ", world_size, " failed: ", why));
  };
  while (state == ncclInProgress) {
    if (std::chrono::system_clock::now() > deadline) {
      return failed("not every rank joined by the deadline");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    api->CommGetAsyncError(comm, &state);
  }
  if (state != ncclSuccess) return failed(ErrorText(*api, comm, state));

  cudaEvent_t queued = nullptr;
  const cudaError_t event = cudaEventCreateWithFlags(&queued, cudaEventDisableTiming);
  if (event != cudaSuccess) return failed(cudaGetErrorString(event));
  const ncclDataType_t nccl_dtype =
      dtype == kernels::CudaComputeDtype::kBf16 ? ncclBfloat16 : ncclFloat16;
  return std::unique_ptr<Communicator>(
      new NcclCommunicator(*api, comm, rank, world_size, backend, nccl_dtype, queued));
}

std::string DescribeNccl() {
  absl::StatusOr<const NcclApi*> api = LoadNccl();
  if (!api.ok()) return std::string(api.status().message());
  int version = 0;
  (*api)->GetVersion(&version);
  return absl::StrCat("NCCL ", version / 10000, ".", version / 100 % 100, ".", version % 100,
                      " from ", (*api)->library);
}

#endif  // CONVEYOR_HAVE_NCCL_HEADER

}  // namespace conveyor::model
