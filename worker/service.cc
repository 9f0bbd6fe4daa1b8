#include "worker/service.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/status_macros.h"
#include "google/protobuf/util/message_differencer.h"
#include "spdlog/spdlog.h"

namespace conveyor::worker {
namespace {

constexpr int kDefaultBlockSize = 16;
constexpr int kMaxBlockSize = 1024;
constexpr int kDefaultMaxStepTokens = 8192;
constexpr int kDefaultMaxStepSequences = 256;

void FillModelInfo(const ModelConfig& c, v1::ModelInfo* info) {
  info->set_architecture(c.architecture);
  info->set_vocab_size(c.vocab_size);
  info->set_hidden_size(c.hidden_size);
  info->set_num_layers(c.num_layers);
  info->set_num_attention_heads(c.num_attention_heads);
  info->set_num_kv_heads(c.num_kv_heads);
  info->set_head_dim(c.head_dim);
  info->set_max_context_tokens(c.max_context_tokens);
  for (int id : c.eos_token_ids) info->add_eos_token_ids(id);
  info->set_bos_token_id(c.bos_token_id);
  info->set_num_parameters(c.NumParameters());
}

}  // namespace

WorkerService::WorkerService(std::unique_ptr<model::Device> device, const Options& options)
    : device_(std::move(device)), options_(options) {}

WorkerService::~WorkerService() = default;

bool WorkerService::initialized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_ != nullptr;
}

absl::Status WorkerService::InitLocked(const v1::InitRequest& request,
                                       std::chrono::system_clock::time_point deadline,
                                       v1::InitResponse* response) {
  if (engine_ != nullptr) {
    // The scheduler re-initialises after a failure (or after it restarted): with the same
    // model and layout, a single rank keeps its model and drops every sequence; a
    // tensor-parallel rank must join the group's new communicator, so it reloads.
    v1::InitRequest same = request;
    same.set_collective_id(init_request_.collective_id());
    if (!google::protobuf::util::MessageDifferencer::Equals(same, init_request_)) {
      return absl::FailedPreconditionError(
          "worker is already initialised with another model or layout; restart it to load "
          "something else");
    }
    if (std::max(request.tp_world_size(), 1) == 1) {
      engine_->Reset();
      *response = init_response_;
      spdlog::info("Init repeated (the scheduler recovers or restarted): all sequences dropped");
      return absl::OkStatus();
    }
    spdlog::info("Init repeated for a new tensor-parallel group: reloading");
    UnloadLocked();
  }
  if (request.model_path().empty()) {
    return absl::InvalidArgumentError("model_path is empty");
  }
  const int world = request.tp_world_size() == 0 ? 1 : request.tp_world_size();
  if (world < 1 || request.tp_rank() < 0 || request.tp_rank() >= world) {
    return absl::InvalidArgumentError(
        absl::StrCat("tp_rank ", request.tp_rank(), " is outside tp_world_size ", world));
  }
  if (world > 1 && request.collective_id().empty()) {
    return absl::InvalidArgumentError(
        "tp_world_size > 1 needs the collective_id that rank 0's CreateCollectiveId made");
  }
  if (world > 1 && request.tp_rank() == 0 && request.collective_id() != created_collective_id_) {
    return absl::FailedPreconditionError(
        "collective_id is not the one this rank 0 created last (did it restart, or did an "
        "earlier Init with it fail?); call CreateCollectiveId again");
  }
  const int block_size = request.block_size() == 0 ? kDefaultBlockSize : request.block_size();
  if (block_size < 1 || block_size > kMaxBlockSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_size must be in [1, ", kMaxBlockSize, "], got ", block_size));
  }
  if (request.max_step_tokens() < 0 || request.max_num_seqs() < 0) {
    return absl::InvalidArgumentError("max_step_tokens and max_num_seqs must be >= 0");
  }

  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(const ModelConfig checkpoint, LoadModelConfig(request.model_path()));
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, device_->MakeBackend(checkpoint));
  absl::StatusOr<std::unique_ptr<model::Communicator>> comm =
      device_->Connect(request.collective_id(), request.tp_rank(), world, backend.get(), deadline);
  if (request.tp_rank() == 0) {
    // Connected, every rank is done with the rendezvous; failed, the group needs a new id.
    device_->EndRendezvous();
    created_collective_id_.clear();
  }
  RETURN_IF_ERROR(comm.status());
  if (world > 1) {
    spdlog::info("rank {} of {} joined its tensor-parallel group", request.tp_rank(), world);
  }
  ASSIGN_OR_RETURN(auto model,
                   model::LlamaModel::Load(request.model_path(), backend.get(), comm->get()));
  const ModelConfig& c = model->config();
  StepEngine::Options engine_options;
  engine_options.max_step_tokens =
      request.max_step_tokens() == 0 ? kDefaultMaxStepTokens : request.max_step_tokens();
  engine_options.max_num_seqs =
      request.max_num_seqs() == 0 ? kDefaultMaxStepSequences : request.max_num_seqs();
  engine_options.tp_rank = request.tp_rank();
  // Before the KV cache is sized, whatever else a step needs: the largest step's
  // activations and the sampler's scratch come out of the same memory.
  RETURN_IF_ERROR(
      model->ReserveActivations(engine_options.max_step_tokens, engine_options.max_num_seqs));
  if (device_->decode_graphs()) {
    RETURN_IF_ERROR(model->EnableDecodeGraphs(engine_options.max_num_seqs));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<model::DeviceSampler> device_sampler,
                   device_->MakeSampler(backend.get(), c.vocab_size, engine_options.max_num_seqs));
  const size_t block_bytes =
      model::KvCache::BytesPerBlock(c.num_layers, model->local_num_kv_heads(), c.head_dim,
                                    block_size, backend->kv_element_bytes());
  uint64_t budget = request.kv_cache_bytes();
  if (budget == 0) {
    ASSIGN_OR_RETURN(budget, device_->DefaultKvBudgetBytes(backend.get()));
  }
  const uint64_t num_blocks = budget / block_bytes;
  if (num_blocks > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("kv_cache_bytes is too large");
  }
  ASSIGN_OR_RETURN(auto cache,
                   model::KvCache::Create(backend.get(), c.num_layers, model->local_num_kv_heads(),
                                          c.head_dim, block_size, static_cast<int>(num_blocks)));
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();

  response->set_num_kv_blocks(cache->num_blocks());
  response->set_block_size(block_size);
  FillModelInfo(c, response->mutable_model());
  response->mutable_model()->set_compute_dtype(backend->activation_bytes() == 4 ? "float32"
                                                                                : "bfloat16");
  response->set_weight_bytes(model->weight_bytes());
  response->set_kv_cache_bytes(cache->size_bytes());
  response->set_load_time_ms(load_ms);
  response->set_backend(backend->name());
  response->set_orders_steps(true);
  response->set_computes_on_host_cores(device_->computes_on_host_cores());
  spdlog::info(
      "loaded {} ({} layers, {} parameters; rank {} of {}) on {} in {:.0f} ms; KV "
      "cache: {} blocks of {} tokens ({} MiB)",
      request.model_path(), c.num_layers, c.NumParameters(), request.tp_rank(), world,
      backend->name(), load_ms, cache->num_blocks(), block_size, cache->size_bytes() >> 20);

  if (options_.metrics != nullptr) {
    options_.metrics->Initialized(std::filesystem::path(request.model_path()).filename().string(),
                                  request.tp_rank(), load_ms / 1000,
                                  static_cast<double>(model->weight_bytes()),
                                  static_cast<double>(cache->size_bytes()));
  }
  engine_ = std::make_unique<StepEngine>(model.get(), cache.get(), engine_options);
  if (device_sampler != nullptr) engine_->set_device_sampler(std::move(device_sampler));
  init_request_ = request;
  init_response_ = *response;
  unload_reason_ = absl::OkStatus();
  backend_ = std::move(backend);
  comm_ = std::move(*comm);
  model_ = std::move(model);
  cache_ = std::move(cache);
  return absl::OkStatus();
}

absl::StatusOr<std::string> WorkerService::CreateCollectiveIdLocked() {
  if (engine_ != nullptr) {
    // A re-initialisation (the scheduler recovers, or restarted): the group forms anew
    // around a new id, and every rank's Init with it reloads.
    if (init_request_.tp_world_size() <= 1 || init_request_.tp_rank() != 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "this worker is initialised as rank ", init_request_.tp_rank(), " of ",
          std::max(init_request_.tp_world_size(), 1), "; ask the rank 0 of a new group"));
    }
  }
  ASSIGN_OR_RETURN(created_collective_id_, device_->CreateCollectiveId());
  return created_collective_id_;
}

void WorkerService::UnloadLocked() {
  step_done_.notify_all();  // A step waiting for another finds no model now.
  engine_.reset();
  cache_.reset();
  model_.reset();
  comm_.reset();
  backend_.reset();
  init_request_.Clear();
  init_response_.Clear();
}

absl::Status WorkerService::AuthorizeLocked(const grpc::ServerContext& context, bool claim,
                                            bool allow_unbound) {
  const auto it = context.client_metadata().find(kSchedulerIdMetadataKey);
  const std::string_view id = it == context.client_metadata().end()
                                  ? std::string_view()
                                  : std::string_view(it->second.data(), it->second.size());
  if (id.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "calls to a worker must carry the ", kSchedulerIdMetadataKey,
        " metadata of the scheduler it serves; only a conveyor-scheduler drives a worker"));
  }
  const auto now = std::chrono::steady_clock::now();
  const bool lapsed = !bound_scheduler_.empty() && now - last_contact_ > options_.binding_lease;
  if (bound_scheduler_ == id) {
    last_contact_ = now;
    return absl::OkStatus();
  }
  // A worker nobody initialised holds nothing a step could touch: let the call say so
  // ("not initialised") rather than refuse it. Shutdown still needs a binding.
  if (allow_unbound && bound_scheduler_.empty()) return absl::OkStatus();
  if (!claim || !(bound_scheduler_.empty() || lapsed)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "this worker serves another scheduler; it becomes free ",
        std::chrono::duration_cast<std::chrono::seconds>(options_.binding_lease).count(),
        " s after that scheduler's last call"));
  }
  if (lapsed) {
    spdlog::warn(
        "the scheduler this worker served has been silent for over {} s; a new one "
        "takes it over",
        std::chrono::duration_cast<std::chrono::seconds>(options_.binding_lease).count());
    if (engine_ != nullptr) engine_->Reset();
  }
  bound_scheduler_ = std::string(id);
  last_contact_ = now;
  return absl::OkStatus();
}

grpc::Status WorkerService::Init(grpc::ServerContext* context, const v1::InitRequest* request,
                                 v1::InitResponse* response) {
  const auto deadline =
      std::min(context->deadline(), std::chrono::system_clock::now() + options_.rendezvous_timeout);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status allowed = AuthorizeLocked(*context, /*claim=*/true); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  const absl::Status status = InitLocked(*request, deadline, response);
  if (!status.ok()) spdlog::error("Init failed: {}", status.ToString());
  return ToGrpcStatus(status);
}

absl::Status WorkerService::CheckInitializedLocked() const {
  if (engine_ != nullptr) return absl::OkStatus();
  return absl::FailedPreconditionError(
      unload_reason_.ok()
          ? std::string("worker is not initialised; call Init first")
          : absl::StrCat("worker is not initialised (its model was unloaded after: ",
                         unload_reason_.message(), "); call Init again"));
}

absl::Status WorkerService::AwaitPreviousStepLocked(std::unique_lock<std::mutex>& lock,
                                                    const grpc::ServerContext& context,
                                                    const v1::StepRequest& request) {
  const uint64_t previous = request.previous_step_id();
  // Checked now and then rather than woken for: gRPC has no callback for a cancelled call
  // into a synchronous handler.
  constexpr auto kPoll = std::chrono::milliseconds(20);
  while (engine_ != nullptr && engine_->last_step_id() < previous) {
    if (context.IsCancelled()) {
      return absl::CancelledError(absl::StrCat(
          "step ", request.step_id(), " was cancelled while it waited for step ", previous));
    }
    if (std::chrono::system_clock::now() >= context.deadline()) {
      return absl::DeadlineExceededError(absl::StrCat(
          "step ", request.step_id(), " waited for step ", previous, " until its deadline"));
    }
    step_done_.wait_for(lock, kPoll);
  }
  return CheckInitializedLocked();  // The model goes if the step before failed on the device.
}

grpc::Status WorkerService::Step(grpc::ServerContext* context, const v1::StepRequest* request,
                                 v1::StepResponse* response) {
  std::unique_lock<std::mutex> lock(mu_);
  if (absl::Status allowed = AuthorizeLocked(*context, /*claim=*/false, /*allow_unbound=*/true);
      !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  if (absl::Status ready = CheckInitializedLocked(); !ready.ok()) return ToGrpcStatus(ready);
  // Two calls in flight may take the lock in either order: the later step waits here for
  // the one it was built on.
  if (absl::Status ready = AwaitPreviousStepLocked(lock, *context, *request); !ready.ok()) {
    return ToGrpcStatus(ready);
  }
  const absl::Status status = engine_->Step(*request, response);
  step_done_.notify_all();
  if (engine_->device_failed()) {
    // The backend's error is sticky (a faulted CUDA context computes nothing more), and
    // so is a communicator that lost a peer: free it all, so that Health says so and the
    // scheduler's next Init builds anew.
    spdlog::error("unloading the model: {}", status.ToString());
    unload_reason_ = status;
    UnloadLocked();
    if (options_.metrics != nullptr) options_.metrics->CountStepError();
  } else if (!status.ok()) {
    spdlog::warn("step {} rejected: {}", request->step_id(), status.ToString());
    if (options_.metrics != nullptr) options_.metrics->CountStepError();
  } else if (options_.metrics != nullptr) {
    options_.metrics->ObserveStep(response->timings().total_ms() / 1000,
                                  response->num_step_tokens());
  }
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::Health(grpc::ServerContext* context, const v1::HealthRequest*,
                                   v1::HealthResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  // Open to anyone (it changes nothing); from the bound scheduler it also renews the
  // binding while that scheduler is idle.
  AuthorizeLocked(*context, /*claim=*/false).IgnoreError();
  response->set_initialized(engine_ != nullptr);
  if (engine_ != nullptr) {
    response->set_num_sequences(engine_->num_sequences());
    response->set_steps_executed(engine_->steps_executed());
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest*,
                                     v1::ShutdownResponse*) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status allowed = AuthorizeLocked(*context, /*claim=*/false); !allowed.ok()) {
      return ToGrpcStatus(allowed);
    }
    spdlog::info("Shutdown requested by the scheduler");
  }
  RequestShutdown();
  return grpc::Status::OK;
}

grpc::Status WorkerService::CreateCollectiveId(grpc::ServerContext* context,
                                               const v1::CreateCollectiveIdRequest*,
                                               v1::CreateCollectiveIdResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status allowed = AuthorizeLocked(*context, /*claim=*/true); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  absl::StatusOr<std::string> id = CreateCollectiveIdLocked();
  if (!id.ok()) {
    spdlog::error("CreateCollectiveId failed: {}", id.status().ToString());
    return ToGrpcStatus(id.status());
  }
  response->set_collective_id(*std::move(id));
  return grpc::Status::OK;
}

void WorkerService::RequestShutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  shutdown_cv_.notify_all();
}

void WorkerService::WaitForShutdownRequest() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_cv_.wait(lock, [&] { return shutdown_requested_; });
}

}  // namespace conveyor::worker
