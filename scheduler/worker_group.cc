#include "scheduler/worker_group.h"

#include <condition_variable>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "grpcpp/grpcpp.h"
#include "rpc/grpc_status.h"
#include "rpc/scheduler_id_metadata.h"

namespace conveyor::scheduler {
namespace {

namespace v1 = worker::v1;

// Counts outstanding calls down to zero.
class Latch {
 public:
  explicit Latch(int count) : count_(count) {}
  void CountDown() {
    std::lock_guard<std::mutex> lock(mu_);
    if (--count_ == 0) cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return count_ == 0; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  int count_;
};

// Worth retrying while initialising: a worker still starting (or restarting), or one
// still bound to a scheduler that went away (its binding lease runs out).
bool IsTransient(grpc::StatusCode code) {
  return code == grpc::StatusCode::UNAVAILABLE || code == grpc::StatusCode::DEADLINE_EXCEEDED ||
         code == grpc::StatusCode::PERMISSION_DENIED;
}

}  // namespace

// Runs `call` with a fresh context until it succeeds, fails with a non-transient
// status, `retry` is false, the deadline passes or initialisation is cancelled.
// wait_for_ready makes a call wait for a worker that is still starting.
template <typename Call>
grpc::Status WorkerGroup::CallUntil(std::chrono::system_clock::time_point deadline, bool retry,
                                    Call call) {
  for (;;) {
    grpc::ClientContext context;
    context.set_deadline(deadline);
    context.set_wait_for_ready(true);
    context.AddMetadata(kSchedulerIdMetadataKey, options_.scheduler_id);
    {
      std::lock_guard<std::mutex> lock(init_mu_);
      if (init_cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
      init_calls_.insert(&context);
    }
    grpc::Status status = call(&context);
    {
      std::lock_guard<std::mutex> lock(init_mu_);
      init_calls_.erase(&context);
      if (init_cancelled_) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    }
    if (!retry || !IsTransient(status.error_code()) ||
        std::chrono::system_clock::now() >= deadline) {
      return status;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void WorkerGroup::CancelInitialize() {
  std::lock_guard<std::mutex> lock(init_mu_);
  init_cancelled_ = true;
  for (grpc::ClientContext* context : init_calls_) context->TryCancel();
}

WorkerGroup::WorkerGroup(Options options) : options_(std::move(options)) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  // Reconnect to a restarted worker within a second, not gRPC's default of up to 2
  // minutes of backoff: a worker that is back should serve again at once.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  if (!options_.tls_server_name.empty()) {
    args.SetSslTargetNameOverride(options_.tls_server_name);
  }
  const std::shared_ptr<grpc::ChannelCredentials> credentials =
      options_.credentials != nullptr ? options_.credentials : grpc::InsecureChannelCredentials();
  for (const std::string& address : options_.addresses) {
    stubs_.push_back(v1::Worker::NewStub(grpc::CreateCustomChannel(address, credentials, args)));
    step_streams_.push_back(std::make_unique<WorkerStepStream>(
        stubs_.back().get(), options_.scheduler_id, options_.step_timeout));
  }
  watchdog_ = std::thread([this] { WatchStepTimeouts(); });
}

WorkerGroup::~WorkerGroup() {
  {
    std::lock_guard<std::mutex> lock(watchdog_mu_);
    stopping_ = true;
  }
  watchdog_cv_.notify_all();
  watchdog_.join();
}

absl::StatusOr<WorkerGroup::Info> WorkerGroup::Initialize(
    std::chrono::system_clock::time_point deadline) {
  const int world = world_size();
  // Rank 0 creates the id through which the ranks of a tensor-parallel group connect.
  v1::CreateCollectiveIdResponse collective;
  if (world > 1) {
    const grpc::Status status =
        CallUntil(deadline, /*retry=*/true, [&](grpc::ClientContext* context) {
          return stubs_[0]->CreateCollectiveId(context, v1::CreateCollectiveIdRequest(),
                                               &collective);
        });
    if (!status.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                          absl::StrCat("worker rank 0 (", options_.addresses[0],
                                       "): CreateCollectiveId failed: ", status.error_message()));
    }
  }
  std::vector<v1::InitResponse> responses(world);
  std::vector<grpc::Status> statuses(world);
  std::vector<std::thread> threads;
  threads.reserve(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      v1::InitRequest request;
      request.set_model_path(options_.model_path);
      request.set_draft_model_path(options_.draft_model_path);
      request.set_tp_rank(rank);
      request.set_tp_world_size(world);
      request.set_collective_id(collective.collective_id());
      request.set_block_size(options_.block_size);
      request.set_kv_cache_bytes(options_.kv_cache_bytes);
      request.set_max_step_tokens(options_.max_step_tokens);
      request.set_max_num_seqs(options_.max_num_seqs);
      if (options_.token_bytes != nullptr) {
        const TokenByteTable& table = *options_.token_bytes;
        request.mutable_token_bytes()->Assign(table.bytes.begin(), table.bytes.end());
        for (size_t id = 0; id < table.special.size(); ++id) {
          if (table.special[id]) request.add_special_token_ids(static_cast<int32_t>(id));
        }
      }
      // The ranks of a group connect inside Init, so one rank retrying alone cannot
      // succeed once the others gave up (and rank 0 then wants a new id): no retries.
      statuses[rank] = CallUntil(deadline, /*retry=*/world == 1, [&](grpc::ClientContext* c) {
        return stubs_[rank]->Init(c, request, &responses[rank]);
      });
    });
  }
  for (std::thread& t : threads) t.join();
  Info info;
  info.orders_steps = true;
  for (int rank = 0; rank < world; ++rank) {
    if (!statuses[rank].ok()) {
      return absl::Status(static_cast<absl::StatusCode>(statuses[rank].error_code()),
                          absl::StrCat("worker rank ", rank, " (", options_.addresses[rank],
                                       "): Init failed: ", statuses[rank].error_message()));
    }
    const v1::InitResponse& r = responses[rank];
    if (!options_.draft_model_path.empty() && !r.has_draft_model()) {
      return absl::FailedPreconditionError(
          absl::StrCat("worker rank ", rank, " (", options_.addresses[rank],
                       ") did not load the draft model: it predates draft models"));
    }
    info.orders_steps = info.orders_steps && r.orders_steps();
    info.computes_on_host_cores = info.computes_on_host_cores || r.computes_on_host_cores();
    info.num_kv_blocks =
        rank == 0 ? r.num_kv_blocks() : std::min(info.num_kv_blocks, r.num_kv_blocks());
  }
  info.model = responses[0].model();
  info.block_size = responses[0].block_size();
  info.backend = responses[0].backend();
  return info;
}

absl::StatusOr<v1::StepResponse> WorkerGroup::ReceiveStep(uint64_t step_id) {
  absl::StatusOr<v1::StepResponse> rank0;
  absl::Status first_error;
  for (int rank = 0; rank < world_size(); ++rank) {
    absl::StatusOr<v1::StepResponse> answer = step_streams_[rank]->Receive(step_id);
    if (!answer.ok() && first_error.ok()) {
      first_error =
          absl::Status(answer.status().code(),
                       absl::StrCat("worker rank ", rank, " (", options_.addresses[rank],
                                    "): step ", step_id, " failed: ", answer.status().message()));
    }
    if (rank == 0) rank0 = std::move(answer);
  }
  if (!first_error.ok()) return first_error;
  return rank0;
}

absl::StatusOr<v1::StepResponse> WorkerGroup::Step(const v1::StepRequest& request) {
  for (const std::unique_ptr<WorkerStepStream>& stream : step_streams_) stream->Send(request);
  return ReceiveStep(request.step_id());
}

// A step sent to every rank whose answers have not been read yet.
class WorkerGroup::PendingStep final : public StepCall {
 public:
  PendingStep(WorkerGroup* group, uint64_t step_id) : group_(group), step_id_(step_id) {}
  // The answers are read by the next step's Wait, or never (the group goes first).
  absl::StatusOr<v1::StepResponse> Wait() override { return group_->ReceiveStep(step_id_); }
  // Nothing to do: a worker refuses at once a step whose predecessor it refused or
  // failed, and a stream that ended fails every step sent on it.

 private:
  WorkerGroup* const group_;
  const uint64_t step_id_;
};

std::unique_ptr<StepCall> WorkerGroup::StartStep(const v1::StepRequest& request) {
  for (const std::unique_ptr<WorkerStepStream>& stream : step_streams_) stream->Send(request);
  return std::make_unique<PendingStep>(this, request.step_id());
}

void WorkerGroup::WatchStepTimeouts() {
  // Checked now and then: a step timeout is seconds, and the streams' blocking reads
  // have no deadline of their own.
  constexpr auto kPoll = std::chrono::milliseconds(20);
  std::unique_lock<std::mutex> lock(watchdog_mu_);
  while (!watchdog_cv_.wait_for(lock, kPoll, [&] { return stopping_; })) {
    const auto now = std::chrono::steady_clock::now();
    for (const std::unique_ptr<WorkerStepStream>& stream : step_streams_) {
      stream->ExpireOverdue(now);
    }
  }
}

absl::StatusOr<RecoveredWorkers> WorkerGroup::Recover(
    std::chrono::system_clock::time_point deadline) {
  ASSIGN_OR_RETURN(const Info info, Initialize(deadline));
  RecoveredWorkers recovered;
  recovered.num_kv_blocks = info.num_kv_blocks;
  recovered.block_size = info.block_size;
  return recovered;
}

absl::Status WorkerGroup::CheckAlive(std::chrono::milliseconds timeout) {
  const int world = world_size();
  std::vector<v1::HealthResponse> responses(world);
  std::vector<grpc::Status> statuses(world);
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts(world);
  Latch latch(world);
  for (int rank = 0; rank < world; ++rank) {
    contexts[rank] = std::make_unique<grpc::ClientContext>();
    contexts[rank]->set_deadline(std::chrono::system_clock::now() + timeout);
    contexts[rank]->AddMetadata(kSchedulerIdMetadataKey, options_.scheduler_id);
    stubs_[rank]->async()->Health(contexts[rank].get(), &health_request_, &responses[rank],
                                  [&, rank](grpc::Status status) {
                                    statuses[rank] = std::move(status);
                                    latch.CountDown();
                                  });
  }
  latch.Wait();
  for (int rank = 0; rank < world; ++rank) {
    const std::string who = absl::StrCat("worker rank ", rank, " (", options_.addresses[rank], ")");
    if (!statuses[rank].ok()) {
      return absl::UnavailableError(
          absl::StrCat(who, " does not answer: ", statuses[rank].error_message()));
    }
    if (!responses[rank].initialized()) {
      return absl::UnavailableError(
          absl::StrCat(who, " is up but not initialised (it restarted, or unloaded its model)"));
    }
  }
  return absl::OkStatus();
}

void WorkerGroup::ShutdownWorkers() {
  for (auto& stub : stubs_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(2));
    context.AddMetadata(kSchedulerIdMetadataKey, options_.scheduler_id);
    v1::ShutdownRequest request;
    v1::ShutdownResponse response;
    stub->Shutdown(&context, request, &response);
  }
}

}  // namespace conveyor::scheduler
