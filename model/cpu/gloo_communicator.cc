#include "model/cpu/gloo_communicator.h"

#include <algorithm>
#include <exception>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "gloo/allgather.h"
#include "gloo/allreduce.h"
#include "gloo/barrier.h"
#include "gloo/common/error.h"
#include "gloo/math.h"
#include "gloo/rendezvous/context.h"
#include "gloo/rendezvous/store.h"
#include "gloo/transport/tcp/device.h"

namespace conveyor::model {
namespace {

// A collective waits this long for its slowest peer before failing the step; long,
// because a peer may legitimately be busy with a large prefill on CPU.
constexpr std::chrono::minutes kOperationTimeout{2};

// Gloo's view of the group's store. Gloo's Store interface returns nothing, so failures
// are thrown as gloo::IoException, which ConnectGloo catches (Gloo itself throws too).
class GlooStore final : public gloo::rendezvous::Store {
 public:
  GlooStore(std::unique_ptr<RendezvousStore> store, std::string address,
            std::chrono::system_clock::time_point deadline)
      : store_(std::move(store)), address_(std::move(address)), deadline_(deadline) {}

  void set(const std::string& key, const std::vector<char>& data) override {
    Check(store_->Set(key, std::string(data.begin(), data.end())), "set", key);
  }

  std::vector<char> get(const std::string& key) override {
    const std::string value = Get(key, deadline_);
    return std::vector<char>(value.begin(), value.end());
  }

  void wait(const std::vector<std::string>& keys) override {
    for (const std::string& key : keys) Get(key, deadline_);
  }

  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override {
    const auto deadline = std::min(deadline_, std::chrono::system_clock::now() + timeout);
    for (const std::string& key : keys) Get(key, deadline);
  }

 private:
  std::string Get(const std::string& key, std::chrono::system_clock::time_point deadline) {
    absl::StatusOr<std::string> value = store_->Get(key, deadline);
    Check(value.status(), "get", key);
    return *std::move(value);
  }

  void Check(const absl::Status& status, const char* op, const std::string& key) const {
    if (!status.ok()) {
      throw gloo::IoException(absl::StrCat("rendezvous store at ", address_, ": ", op, " \"", key,
                                           "\": ", status.message()));
    }
  }

  const std::unique_ptr<RendezvousStore> store_;
  const std::string address_;
  const std::chrono::system_clock::time_point deadline_;
};

class GlooCommunicator final : public Communicator {
 public:
  explicit GlooCommunicator(std::shared_ptr<gloo::rendezvous::Context> context)
      : context_(std::move(context)) {}

  int rank() const override { return context_->rank; }
  int world_size() const override { return context_->size; }

  // The CPU backend's operations are complete when they return, so `data` is ready.
  absl::Status AllReduceSum(void* data, size_t count) override {
    gloo::AllreduceOptions options(context_);
    options.setOutput(static_cast<float*>(data), count);
    options.setReduceFunction(
        static_cast<void (*)(void*, const void*, const void*, size_t)>(&gloo::sum<float>));
    return Run("all-reduce", [&] { gloo::allreduce(options); });
  }

  absl::Status AllGather(void* data, size_t count) override {
    gloo::AllgatherOptions options(context_);
    // No input buffer: Gloo gathers in place around this rank's part of the output.
    options.setOutput(static_cast<float*>(data), count * context_->size);
    return Run("all-gather", [&] { gloo::allgather(options); });
  }

 private:
  template <typename Fn>
  absl::Status Run(const char* what, Fn fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      return absl::UnavailableError(
          absl::StrCat("Gloo ", what, " on rank ", context_->rank, " failed: ", e.what()));
    }
    return absl::OkStatus();
  }

  std::shared_ptr<gloo::rendezvous::Context> context_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<Rendezvous::ServedStore>> ServeGlooStore(Rendezvous& rendezvous,
                                                                        const std::string& host) {
  return rendezvous.Serve(host);
}

std::string GlooCollectiveId(const Rendezvous::ServedStore& store) {
  return absl::StrCat(std::string(kGlooIdPrefix), store.address());
}

absl::StatusOr<std::unique_ptr<Communicator>> ConnectGloo(
    std::string_view collective_id, int rank, int world_size, const std::string& host,
    std::chrono::system_clock::time_point deadline, Rendezvous& rendezvous) {
  ASSIGN_OR_RETURN(const std::string_view address,
                   CollectiveIdPayload(collective_id, kGlooIdPrefix));
  const std::string store_address(address);
  ASSIGN_OR_RETURN(std::unique_ptr<RendezvousStore> reached,
                   rendezvous.Reach(store_address, deadline));
  GlooStore store(std::move(reached), store_address, deadline);
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = host;
    std::shared_ptr<gloo::transport::Device> device = gloo::transport::tcp::CreateDevice(attr);
    auto context = std::make_shared<gloo::rendezvous::Context>(rank, world_size);
    context->setTimeout(std::max(std::chrono::milliseconds(1),
                                 std::chrono::duration_cast<std::chrono::milliseconds>(
                                     deadline - std::chrono::system_clock::now())));
    context->connectFullMesh(store, device);
    // A rank that connected may still be reading the store for its other peers; once
    // the barrier passes, all are done with it and rank 0 may stop serving it.
    gloo::BarrierOptions barrier(context);
    gloo::barrier(barrier);
    context->setTimeout(kOperationTimeout);
    return std::unique_ptr<Communicator>(new GlooCommunicator(std::move(context)));
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("Gloo rendezvous of rank ", rank, " of ", world_size,
                                               " through ", store_address, " failed: ", e.what()));
  }
}

}  // namespace conveyor::model
