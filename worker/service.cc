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
#ifdef CONVEYOR_HAVE_CUDA
#include "kernels/cuda/cuda_backend.h"
#include "worker/nccl_communicator.h"
#endif

namespace conveyor::worker {
namespace {

constexpr int kDefaultBlockSize = 16;
constexpr int kMaxBlockSize = 1024;
constexpr int kDefaultMaxStepTokens = 8192;
constexpr int kDefaultMaxStepSequences = 256;
// Without an explicit budget the CPU worker takes this share of available memory, up
// to a cap (a CPU worker rarely profits from more).
constexpr double kDefaultKvShareOfAvailableMemory = 0.3;
constexpr uint64_t kDefaultKvCapBytes = 4ull << 30;
// Longest an Init waits for the other ranks when its call carries no deadline.
constexpr std::chrono::minutes kMaxRendezvousWait{10};

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

#ifndef CONVEYOR_HAVE_CUDA
absl::Status NoCudaError() {
  return absl::UnimplementedError(
      "this worker was built without CUDA; rebuild with -DCONVEYOR_CUDA=ON");
}
#endif

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

WorkerService::WorkerService(const Options& options) : options_(options) {}

WorkerService::~WorkerService() = default;

bool WorkerService::initialized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return engine_ != nullptr;
}

absl::Status WorkerService::InitLocked(const v1::InitRequest& request,
                                       std::chrono::system_clock::time_point deadline,
                                       v1::InitResponse* response) {
  if (engine_ != nullptr) {
    if (google::protobuf::util::MessageDifferencer::Equals(request, init_request_)) {
      engine_->Reset();
      *response = init_response_;
      spdlog::info("Init repeated (a scheduler restarted?): all sequences dropped");
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "worker is already initialised with ", init_request_.ShortDebugString(),
        "; restart it to load something else"));
  }
  if (request.model_path().empty()) {
    return absl::InvalidArgumentError("model_path is empty");
  }
  const int world = request.tp_world_size() == 0 ? 1 : request.tp_world_size();
  if (world < 1 || request.tp_rank() < 0 || request.tp_rank() >= world) {
    return absl::InvalidArgumentError(absl::StrCat("tp_rank ", request.tp_rank(),
                                                   " is outside tp_world_size ", world));
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
  if (request.max_step_tokens() < 0 || request.max_step_sequences() < 0) {
    return absl::InvalidArgumentError("max_step_tokens and max_step_sequences must be >= 0");
  }

  const auto start = std::chrono::steady_clock::now();
  ASSIGN_OR_RETURN(std::unique_ptr<kernels::Backend> backend, MakeBackend());
  absl::StatusOr<std::unique_ptr<Communicator>> comm = Connect(request, backend.get(), deadline);
  if (request.tp_rank() == 0) {
    // Connected, every rank is done with the rendezvous; failed, the group needs a new id.
    gloo_rendezvous_.reset();
    created_collective_id_.clear();
  }
  RETURN_IF_ERROR(comm.status());
  ASSIGN_OR_RETURN(auto model, LlamaModel::Load(request.model_path(), backend.get(), comm->get()));
  const ModelConfig& c = model->config();
  StepEngine::Options engine_options;
  engine_options.max_step_tokens =
      request.max_step_tokens() == 0 ? kDefaultMaxStepTokens : request.max_step_tokens();
  engine_options.max_step_sequences = request.max_step_sequences() == 0
                                          ? kDefaultMaxStepSequences
                                          : request.max_step_sequences();
  engine_options.tp_rank = request.tp_rank();
  // Before the KV cache is sized, whatever else a step needs: the largest step's
  // activations and the sampler's scratch come out of the same memory.
  RETURN_IF_ERROR(model->ReserveActivations(engine_options.max_step_tokens,
                                            engine_options.max_step_sequences));
  if (options_.backend == "cuda" && options_.cuda_graphs) {
    RETURN_IF_ERROR(model->EnableDecodeGraphs(engine_options.max_step_sequences));
  }
  std::unique_ptr<DeviceSampler> device_sampler;
  if (options_.backend == "cuda" && options_.device_sampling) {
    ASSIGN_OR_RETURN(device_sampler, MakeCudaSampler(backend.get(), c.vocab_size,
                                                     engine_options.max_step_sequences));
  }
  const size_t block_bytes =
      KvCache::BytesPerBlock(c.num_layers, model->local_num_kv_heads(), c.head_dim, block_size,
                             backend->activation_bytes());
  uint64_t budget = request.kv_cache_bytes();
  if (budget == 0) {
    ASSIGN_OR_RETURN(budget, DefaultKvBudget());
  }
  const uint64_t num_blocks = budget / block_bytes;
  if (num_blocks > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("kv_cache_bytes is too large");
  }
  ASSIGN_OR_RETURN(auto cache, KvCache::Create(backend.get(), c.num_layers,
                                               model->local_num_kv_heads(), c.head_dim, block_size,
                                               static_cast<int>(num_blocks)));
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
          .count();

  response->set_num_kv_blocks(cache->num_blocks());
  response->set_block_size(block_size);
  FillModelInfo(c, response->mutable_model());
  response->mutable_model()->set_compute_dtype(backend->activation_bytes() == 4 ? "float32"
                                                                                : "bfloat16");
  response->set_weight_bytes(model->weight_bytes());
  response->set_kv_cache_bytes(cache->size_bytes());
  response->set_load_time_ms(load_ms);
  response->set_backend(backend->name());
  spdlog::info("loaded {} ({} layers, {} parameters; rank {} of {}) on {} in {:.0f} ms; KV "
               "cache: {} blocks of {} tokens ({} MiB)",
               request.model_path(), c.num_layers, c.NumParameters(), request.tp_rank(), world,
               backend->name(), load_ms, cache->num_blocks(), block_size,
               cache->size_bytes() >> 20);

  if (options_.metrics != nullptr) {
    options_.metrics->Initialized(
        std::filesystem::path(request.model_path()).filename().string(), request.tp_rank(),
        load_ms / 1000, static_cast<double>(model->weight_bytes()),
        static_cast<double>(cache->size_bytes()));
  }
  engine_ = std::make_unique<StepEngine>(model.get(), cache.get(), engine_options);
  if (device_sampler != nullptr) engine_->set_device_sampler(std::move(device_sampler));
  init_request_ = request;
  init_response_ = *response;
  backend_ = std::move(backend);
  comm_ = std::move(*comm);
  model_ = std::move(model);
  cache_ = std::move(cache);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<kernels::Backend>> WorkerService::MakeBackend() const {
  if (options_.backend == "cpu") return kernels::MakeCpuBackend(options_.num_threads);
  if (options_.backend == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
    ASSIGN_OR_RETURN(auto backend, kernels::MakeCudaBackend(options_.device));
    return std::unique_ptr<kernels::Backend>(std::move(backend));
#else
    return NoCudaError();
#endif
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown backend \"", options_.backend, "\"; use cpu or cuda"));
}

absl::StatusOr<std::unique_ptr<Communicator>> WorkerService::Connect(
    const v1::InitRequest& request, kernels::Backend* backend,
    std::chrono::system_clock::time_point deadline) const {
  const int world = request.tp_world_size();
  if (world <= 1) return MakeSingleRankCommunicator();
  absl::StatusOr<std::unique_ptr<Communicator>> comm;
  if (options_.backend == "cpu") {
    comm = ConnectGloo(request.collective_id(), request.tp_rank(), world,
                       options_.collective_host, deadline);
  } else {
#ifdef CONVEYOR_HAVE_CUDA
    // MakeBackend made the CUDA backend with default options, hence their dtype.
    comm = ConnectNccl(request.collective_id(), request.tp_rank(), world,
                       static_cast<kernels::CudaBackend*>(backend),
                       kernels::CudaBackendOptions().dtype);
#else
    comm = NoCudaError();
#endif
  }
  if (comm.ok()) {
    spdlog::info("rank {} of {} joined its tensor-parallel group", request.tp_rank(), world);
  }
  return comm;
}

absl::StatusOr<std::string> WorkerService::CreateCollectiveIdLocked() {
  if (engine_ != nullptr) {
    // The id of the Init that succeeded: a restarted scheduler then repeats that Init.
    if (init_request_.tp_world_size() > 1 && init_request_.tp_rank() == 0) {
      return init_request_.collective_id();
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "this worker is initialised as rank ", init_request_.tp_rank(), " of ",
        std::max(init_request_.tp_world_size(), 1), "; ask the rank 0 of a new group"));
  }
  if (options_.backend == "cuda") {
#ifdef CONVEYOR_HAVE_CUDA
    ASSIGN_OR_RETURN(created_collective_id_, CreateNcclCollectiveId());
    return created_collective_id_;
#else
    return NoCudaError();
#endif
  }
  gloo_rendezvous_.reset();
  ASSIGN_OR_RETURN(gloo_rendezvous_, GlooRendezvousServer::Start(options_.collective_host));
  created_collective_id_ = gloo_rendezvous_->collective_id();
  return created_collective_id_;
}

absl::StatusOr<uint64_t> WorkerService::DefaultKvBudget() const {
#ifdef CONVEYOR_HAVE_CUDA
  if (options_.backend == "cuda") {
    // Measured after the weights are loaded, so what is free is what the cache may use.
    ASSIGN_OR_RETURN(size_t free_bytes, kernels::FreeDeviceMemoryBytes(options_.device));
    return static_cast<uint64_t>(free_bytes * options_.gpu_memory_fraction);
  }
#endif
  return std::min(kDefaultKvCapBytes, static_cast<uint64_t>(AvailableMemoryBytes() *
                                                            kDefaultKvShareOfAvailableMemory));
}

grpc::Status WorkerService::Init(grpc::ServerContext* context, const v1::InitRequest* request,
                                 v1::InitResponse* response) {
  const auto deadline =
      std::min(context->deadline(), std::chrono::system_clock::now() + kMaxRendezvousWait);
  std::lock_guard<std::mutex> lock(mu_);
  const absl::Status status = InitLocked(*request, deadline, response);
  if (!status.ok()) spdlog::error("Init failed: {}", status.ToString());
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::Step(grpc::ServerContext*, const v1::StepRequest* request,
                                 v1::StepResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  if (engine_ == nullptr) {
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "worker is not initialised; call Init first");
  }
  const absl::Status status = engine_->Step(*request, response);
  if (!status.ok()) {
    spdlog::warn("step {} rejected: {}", request->step_id(), status.ToString());
    if (options_.metrics != nullptr) options_.metrics->CountStepError();
  } else if (options_.metrics != nullptr) {
    options_.metrics->ObserveStep(response->timings().total_ms() / 1000,
                                  response->num_step_tokens());
  }
  return ToGrpcStatus(status);
}

grpc::Status WorkerService::Health(grpc::ServerContext*, const v1::HealthRequest*,
                                   v1::HealthResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  response->set_initialized(engine_ != nullptr);
  if (engine_ != nullptr) {
    response->set_num_sequences(engine_->num_sequences());
    response->set_steps_executed(engine_->steps_executed());
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Shutdown(grpc::ServerContext*, const v1::ShutdownRequest*,
                                     v1::ShutdownResponse*) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown_requested_ = true;
  }
  shutdown_cv_.notify_all();
  return grpc::Status::OK;
}

grpc::Status WorkerService::CreateCollectiveId(grpc::ServerContext*,
                                               const v1::CreateCollectiveIdRequest*,
                                               v1::CreateCollectiveIdResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  absl::StatusOr<std::string> id = CreateCollectiveIdLocked();
  if (!id.ok()) {
    spdlog::error("CreateCollectiveId failed: {}", id.status().ToString());
    return ToGrpcStatus(id.status());
  }
  response->set_collective_id(*std::move(id));
  return grpc::Status::OK;
}

void WorkerService::WaitForShutdownRequest() {
  std::unique_lock<std::mutex> lock(mu_);
  shutdown_cv_.wait(lock, [&] { return shutdown_requested_; });
}

}  // namespace conveyor::worker
