#include "worker/service.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <type_traits>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "google/protobuf/unknown_field_set.h"
#include "google/protobuf/util/message_differencer.h"
#include "grammar/token_mask.h"
#include "grpcpp/impl/codegen/proto_utils.h"
#include "grpcpp/impl/rpc_service_method.h"
#include "grpcpp/support/method_handler.h"
#include "grpcpp/support/proto_buffer_reader.h"
#include "rpc/grpc_status.h"
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

// Whether `a` asks for the model and layout `b` was loaded with: the collective id aside,
// which every re-initialisation of a tensor-parallel group renews.
bool SameModelAndLayout(const v1::InitRequest& a, const v1::InitRequest& b) {
  v1::InitRequest same = a;
  same.set_collective_id(b.collective_id());
  return google::protobuf::util::MessageDifferencer::Equals(same, b);
}

// A real InitRequest is a path and a few numbers; a refused one at most this long is
// read to say whether waiting for the worker could help at all.
constexpr size_t kMaxExplainedInitBytes = 64 << 10;

// Parses `raw` into `message`, or INVALID_ARGUMENT naming the message type and what is
// wrong with the bytes.
absl::Status ParseRequest(const grpc::ByteBuffer& raw, google::protobuf::Message* message) {
  if (!raw.Valid()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the call carried no ", message->GetTypeName(), " message"));
  }
  grpc::ByteBuffer bytes(raw);  // Shares the slices: a reader needs its own buffer.
  grpc::ProtoBufferReader reader(&bytes);
  if (reader.status().ok() && message->ParseFromZeroCopyStream(&reader)) {
    return absl::OkStatus();
  }
  // Which of the two ways it fails (only a malformed request pays for a second pass).
  grpc::ByteBuffer again(raw);
  grpc::ProtoBufferReader fields_reader(&again);
  google::protobuf::UnknownFieldSet fields;
  const bool wire_format =
      fields_reader.status().ok() && fields.ParseFromZeroCopyStream(&fields_reader);
  return absl::InvalidArgumentError(absl::StrCat(
      "the request is not a valid ", message->GetTypeName(), " message: its ", raw.Length(),
      " bytes ",
      wire_format ? "are protobuf wire format, but a field does not fit the message (a nested "
                    "message is malformed, or a string is not valid UTF-8)"
                  : "are not protobuf wire format (a bad tag, or a length or number that "
                    "runs past the end)"));
}

// The scheduler identity the call carries (empty: none).
std::string_view CallerId(const grpc::ServerContext& context) {
  const auto it = context.client_metadata().find(kSchedulerIdMetadataKey);
  if (it == context.client_metadata().end()) return {};
  return {it->second.data(), it->second.size()};
}

double Seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

WorkerService::WorkerService(std::unique_ptr<model::Device> device, const Options& options)
    : device_(std::move(device)), options_(options) {
  // The paths of proto/worker.proto's service Worker (as its generated code names them).
  AddRawMethod("/conveyor.worker.v1.Worker/Init", Callers::kClaimants, &WorkerService::Init);
  AddRawMethod("/conveyor.worker.v1.Worker/Step", Callers::kBoundOrNotInitialised,
               &WorkerService::Step);
  // The scheduler's steps arrive on one stream; each message is checked and run as the
  // unary Step runs it (StepStream).
  this->AddMethod(new grpc::internal::RpcServiceMethod(
      "/conveyor.worker.v1.Worker/StepStream", grpc::internal::RpcMethod::BIDI_STREAMING,
      new grpc::internal::BidiStreamingHandler<WorkerService, grpc::ByteBuffer,
                                               v1::StepStreamResponse>(
          [](WorkerService* service, grpc::ServerContext* context,
             grpc::ServerReaderWriter<v1::StepStreamResponse, grpc::ByteBuffer>* stream) {
            return service->StepStream(context, stream);
          },
          this)));
  AddRawMethod("/conveyor.worker.v1.Worker/Health", Callers::kAnyone, &WorkerService::Health);
  AddRawMethod("/conveyor.worker.v1.Worker/Shutdown", Callers::kBound, &WorkerService::Shutdown);
  AddRawMethod("/conveyor.worker.v1.Worker/CreateCollectiveId", Callers::kClaimants,
               &WorkerService::CreateCollectiveId);
}

template <class Request, class Response>
void WorkerService::AddRawMethod(const char* path, Callers callers,
                                 TypedCall<Request, Response> call) {
  // As generated code registers a synchronous method, with bytes for messages
  // (SerializationTraits<grpc::ByteBuffer> hands over what gRPC received): handlers run
  // on the synchronous server's threads, where a step or an Init may take its time.
  this->AddMethod(new grpc::internal::RpcServiceMethod(
      path, grpc::internal::RpcMethod::NORMAL_RPC,
      new grpc::internal::RpcMethodHandler<WorkerService, grpc::ByteBuffer, grpc::ByteBuffer>(
          [callers, call](WorkerService* service, grpc::ServerContext* context,
                          const grpc::ByteBuffer* raw, grpc::ByteBuffer* response) {
            return service->HandleRaw(callers, call, context, *raw, response);
          },
          this)));
}

template <class Request, class Response>
grpc::Status WorkerService::HandleRaw(Callers callers, TypedCall<Request, Response> call,
                                      grpc::ServerContext* context, const grpc::ByteBuffer& raw,
                                      grpc::ByteBuffer* response) {
  if (absl::Status admitted = AdmitCaller(*context, callers); !admitted.ok()) {
    if constexpr (std::is_same_v<Request, v1::InitRequest>) {
      admitted = ExplainInitRefusal(std::move(admitted), raw);
    }
    return ToGrpcStatus(admitted);
  }
  Request request;
  if (absl::Status parsed = ParseRequest(raw, &request); !parsed.ok()) {
    spdlog::warn("a call of the bound scheduler refused: {}", std::string(parsed.message()));
    return ToGrpcStatus(parsed);
  }
  Response typed_response;
  if (grpc::Status status = (this->*call)(context, &request, &typed_response); !status.ok()) {
    return status;
  }
  bool own_buffer = false;
  return grpc::SerializationTraits<Response>::Serialize(typed_response, response, &own_buffer);
}

WorkerService::~WorkerService() = default;

bool WorkerService::initialized() const {
  std::lock_guard<std::mutex> lock(mu_);
  return runner_ != nullptr;
}

absl::Status WorkerService::InitLocked(const v1::InitRequest& request,
                                       std::chrono::system_clock::time_point deadline,
                                       v1::InitResponse* response) {
  if (runner_ != nullptr) {
    // The scheduler re-initialises after a failure (or after it restarted): with the same
    // model and layout, a single rank keeps its model and drops every sequence; a
    // tensor-parallel rank must join the group's new communicator, so it reloads.
    if (!SameModelAndLayout(request, init_request_)) {
      return absl::FailedPreconditionError(
          "worker is already initialised with another model or layout; restart it to load "
          "something else");
    }
    if (std::max(request.tp_world_size(), 1) == 1) {
      runner_->Reset();
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

  model::RankOptions rank_options;
  rank_options.model_path = request.model_path();
  rank_options.rank = request.tp_rank();
  rank_options.world_size = world;
  rank_options.collective_id = request.collective_id();
  rank_options.block_size = block_size;
  rank_options.max_step_tokens =
      request.max_step_tokens() == 0 ? kDefaultMaxStepTokens : request.max_step_tokens();
  rank_options.max_num_seqs =
      request.max_num_seqs() == 0 ? kDefaultMaxStepSequences : request.max_num_seqs();
  rank_options.kv_cache_bytes = request.kv_cache_bytes();
  rank_options.draft_model_path = request.draft_model_path();
  absl::StatusOr<std::unique_ptr<model::Rank>> rank =
      model::Rank::Create(*device_, rank_options, deadline);
  // Rank 0's collective id served its one rendezvous, connected or not.
  if (request.tp_rank() == 0) created_collective_id_.clear();
  RETURN_IF_ERROR(rank.status());
  if (world > 1) {
    spdlog::info("rank {} of {} joined its tensor-parallel group", request.tp_rank(), world);
  }
  const ModelConfig& c = (*rank)->config();
  model::KvCache& cache = (*rank)->cache();

  response->set_num_kv_blocks(cache.num_blocks());
  response->set_block_size(block_size);
  FillModelInfo(c, response->mutable_model());
  response->mutable_model()->set_compute_dtype(std::string((*rank)->compute_dtype()));
  response->set_weight_bytes((*rank)->weight_bytes());
  response->set_kv_cache_bytes(cache.size_bytes());
  response->set_load_time_ms((*rank)->load_ms());
  response->set_backend(std::string((*rank)->backend_name()));
  response->set_orders_steps(true);
  response->set_computes_on_host_cores(device_->computes_on_host_cores());
  if (const model::LlamaModel* draft = (*rank)->draft_model(); draft != nullptr) {
    FillModelInfo(draft->config(), response->mutable_draft_model());
    response->mutable_draft_model()->set_compute_dtype(std::string((*rank)->compute_dtype()));
    spdlog::info("loaded the draft model {} ({} layers, {} parameters)", request.draft_model_path(),
                 draft->config().num_layers, draft->config().NumParameters());
  }
  spdlog::info(
      "loaded {} ({} layers, {} parameters; rank {} of {}) on {} in {:.0f} ms; KV "
      "cache: {} blocks of {} tokens ({} MiB)",
      request.model_path(), c.num_layers, c.NumParameters(), request.tp_rank(), world,
      (*rank)->backend_name(), (*rank)->load_ms(), cache.num_blocks(), block_size,
      cache.size_bytes() >> 20);

  if (options_.metrics != nullptr) {
    options_.metrics->Initialized(std::filesystem::path(request.model_path()).filename().string(),
                                  request.tp_rank(), (*rank)->load_ms() / 1000,
                                  static_cast<double>((*rank)->weight_bytes()),
                                  static_cast<double>(cache.size_bytes()));
  }
  StepRunner::Options runner_options;
  runner_options.max_step_tokens = rank_options.max_step_tokens;
  runner_options.max_num_seqs = rank_options.max_num_seqs;
  runner_options.tp_rank = request.tp_rank();
  runner_ = std::make_unique<StepRunner>(&(*rank)->model(), &cache, runner_options);
  if ((*rank)->draft_model() != nullptr) {
    runner_->set_draft((*rank)->draft_model(), (*rank)->draft_cache());
  }
  if (request.token_bytes_size() > 0) {
    // The model's vocabulary may be larger than the tokenizer's: ids beyond add nothing.
    std::vector<std::string> token_bytes(c.vocab_size);
    for (int id = 0; id < std::min(c.vocab_size, request.token_bytes_size()); ++id) {
      token_bytes[id] = request.token_bytes(id);
    }
    std::vector<bool> special(c.vocab_size, false);
    for (int32_t id : request.special_token_ids()) {
      if (id >= 0 && id < c.vocab_size) special[id] = true;
    }
    runner_->set_vocabulary(std::make_unique<grammar::Vocabulary>(
        std::move(token_bytes), std::move(special), c.eos_token_ids));
  }
  if (auto device_sampler = (*rank)->TakeDeviceSampler(); device_sampler != nullptr) {
    runner_->set_device_sampler(std::move(device_sampler));
  }
  init_request_ = request;
  init_response_ = *response;
  unload_reason_ = absl::OkStatus();
  rank_ = *std::move(rank);
  return absl::OkStatus();
}

absl::StatusOr<std::string> WorkerService::CreateCollectiveIdLocked() {
  if (runner_ != nullptr) {
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
  runner_.reset();
  rank_.reset();
  init_request_.Clear();
  init_response_.Clear();
  std::lock_guard<std::mutex> binding(binding_mu_);
  loaded_init_.reset();
}

absl::Status WorkerService::CheckCallerLocked(std::string_view id, Callers callers,
                                              std::chrono::steady_clock::time_point now) const {
  if (callers == Callers::kAnyone || (!id.empty() && id == bound_scheduler_)) {
    return absl::OkStatus();
  }
  if (id.empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        "calls to a worker must carry the ", kSchedulerIdMetadataKey,
        " metadata of the scheduler it serves; only a conveyor-scheduler drives a worker"));
  }
  if (bound_scheduler_.empty()) {
    switch (callers) {
      case Callers::kClaimants:
        return absl::OkStatus();
      case Callers::kBoundOrNotInitialised:
        // What the call would say once parsed, whatever it asks: a worker holds nothing a
        // step could touch before an Init succeeded (which binds it).
        return absl::FailedPreconditionError("worker is not initialised; call Init first");
      default:
        return absl::PermissionDeniedError(
            "this worker serves no scheduler yet; only the scheduler whose Init bound it may "
            "shut it down");
    }
  }
  // The bound scheduler's identity stays out of every message: it is all a caller needs
  // to pass for it.
  const auto silent = now - last_contact_;
  const double lease_s = Seconds(options_.binding_lease);
  if (silent > options_.binding_lease) {
    if (callers == Callers::kClaimants) return absl::OkStatus();
    return absl::PermissionDeniedError(absl::StrFormat(
        "this worker served another scheduler, silent for %.1f s (beyond the %.0f s binding "
        "lease): it is free, but only an Init that succeeds binds it to a new scheduler",
        Seconds(silent), lease_s));
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "this worker serves another scheduler, which last called it %.1f s ago; it becomes "
      "free for another once that scheduler has been silent for the %.0f s binding lease: "
      "in %.1f s at the earliest (each of its calls, liveness checks included, renews the "
      "lease)",
      Seconds(silent), lease_s, Seconds(options_.binding_lease - silent)));
}

absl::Status WorkerService::AdmitCaller(const grpc::ServerContext& context, Callers callers) const {
  std::lock_guard<std::mutex> binding(binding_mu_);
  return CheckCallerLocked(CallerId(context), callers, std::chrono::steady_clock::now());
}

absl::Status WorkerService::ExplainInitRefusal(absl::Status refusal,
                                               const grpc::ByteBuffer& raw) const {
  if (refusal.code() != absl::StatusCode::kPermissionDenied ||
      raw.Length() > kMaxExplainedInitBytes) {
    return refusal;
  }
  v1::InitRequest request;
  if (!ParseRequest(raw, &request).ok()) return refusal;
  std::lock_guard<std::mutex> binding(binding_mu_);
  if (!loaded_init_.has_value() || SameModelAndLayout(request, *loaded_init_)) return refusal;
  // Not the model path: the refusal must not tell a stranger what another Init loaded.
  return absl::PermissionDeniedError(absl::StrCat(
      refusal.message(),
      "; and it holds another model or layout than this Init asks for, so waiting for it "
      "will not help: restart the worker to load another model"));
}

absl::Status WorkerService::AuthorizeLocked(const grpc::ServerContext& context, Callers callers) {
  const std::string_view id = CallerId(context);
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> binding(binding_mu_);
  RETURN_IF_ERROR(CheckCallerLocked(id, callers, now));
  if (!id.empty() && id == bound_scheduler_) last_contact_ = now;
  return absl::OkStatus();
}

void WorkerService::Bind(std::string_view id, const v1::InitRequest& request) {
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> binding(binding_mu_);
  if (!bound_scheduler_.empty() && bound_scheduler_ != id) {
    spdlog::warn(
        "the scheduler this worker served had been silent for {:.1f} s (binding lease: {:.0f} "
        "s); a new one initialised it and takes it over",
        Seconds(now - last_contact_), Seconds(options_.binding_lease));
  }
  bound_scheduler_ = std::string(id);
  last_contact_ = now;
  loaded_init_ = request;
}

grpc::Status WorkerService::Init(grpc::ServerContext* context, const v1::InitRequest* request,
                                 v1::InitResponse* response) {
  const auto deadline =
      std::min(context->deadline(), std::chrono::system_clock::now() + options_.rendezvous_timeout);
  std::lock_guard<std::mutex> lock(mu_);
  if (absl::Status allowed = AuthorizeLocked(*context, Callers::kClaimants); !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  const absl::Status status = InitLocked(*request, deadline, response);
  if (!status.ok()) {
    // Binds nothing: a caller whose Init fails holds no free worker.
    spdlog::error("Init failed: {}", status.ToString());
    return ToGrpcStatus(status);
  }
  Bind(CallerId(*context), *request);
  return grpc::Status::OK;
}

absl::Status WorkerService::CheckInitializedLocked() const {
  if (runner_ != nullptr) return absl::OkStatus();
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
  while (runner_ != nullptr && runner_->last_step_id() < previous) {
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
  if (absl::Status allowed = AuthorizeLocked(*context, Callers::kBoundOrNotInitialised);
      !allowed.ok()) {
    return ToGrpcStatus(allowed);
  }
  if (absl::Status ready = CheckInitializedLocked(); !ready.ok()) return ToGrpcStatus(ready);
  // Two calls in flight may take the lock in either order: the later step waits here for
  // the one it was built on.
  if (absl::Status ready = AwaitPreviousStepLocked(lock, *context, *request); !ready.ok()) {
    return ToGrpcStatus(ready);
  }
  const absl::Status status = runner_->Step(*request, response);
  step_done_.notify_all();
  if (runner_->device_failed()) {
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

grpc::Status WorkerService::StepStream(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::StepStreamResponse, grpc::ByteBuffer>* stream) {
  // A caller that may not step is refused once, for the whole stream; the bound
  // scheduler is checked again for every step (Step), as its binding may lapse.
  if (absl::Status admitted = AdmitCaller(*context, Callers::kBoundOrNotInitialised);
      !admitted.ok()) {
    return ToGrpcStatus(admitted);
  }
  {
    std::lock_guard<std::mutex> lock(streams_mu_);
    if (streams_closed_) {
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the worker is shutting down");
    }
    step_streams_.insert(context);
  }
  absl::Cleanup forget = [&] {
    std::lock_guard<std::mutex> lock(streams_mu_);
    step_streams_.erase(context);
  };
  grpc::ByteBuffer raw;
  v1::StepRequest request;
  v1::StepStreamResponse answer;
  while (stream->Read(&raw)) {
    request.Clear();
    answer.Clear();
    if (absl::Status parsed = ParseRequest(raw, &request); !parsed.ok()) {
      // Not a step: no id to answer it under, and whatever sent it is broken. The stream
      // ends with why, which fails the steps the scheduler sent on it.
      spdlog::warn("a step stream of the bound scheduler refused: {}",
                   std::string(parsed.message()));
      return ToGrpcStatus(parsed);
    }
    const grpc::Status status = Step(context, &request, answer.mutable_response());
    answer.set_step_id(request.step_id());
    answer.set_status_code(status.error_code());
    if (!status.ok()) {
      answer.set_status_message(status.error_message());
      answer.clear_response();
    }
    if (!stream->Write(answer)) break;  // The scheduler went away, or gave up the stream.
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Health(grpc::ServerContext* context, const v1::HealthRequest*,
                                   v1::HealthResponse* response) {
  std::lock_guard<std::mutex> lock(mu_);
  // Open to anyone (it changes nothing); from the bound scheduler it also renews the
  // binding while that scheduler is idle.
  AuthorizeLocked(*context, Callers::kAnyone).IgnoreError();
  response->set_initialized(runner_ != nullptr);
  if (runner_ != nullptr) {
    response->set_num_sequences(runner_->num_sequences());
    response->set_steps_executed(runner_->steps_executed());
  }
  return grpc::Status::OK;
}

grpc::Status WorkerService::Shutdown(grpc::ServerContext* context, const v1::ShutdownRequest*,
                                     v1::ShutdownResponse*) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::Status allowed = AuthorizeLocked(*context, Callers::kBound); !allowed.ok()) {
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
  // Binds nothing (the group's Init does): creating an id holds no free worker.
  if (absl::Status allowed = AuthorizeLocked(*context, Callers::kClaimants); !allowed.ok()) {
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
    // The open step streams end now (their handlers return once the step they run, if
    // any, is done), so that the server's shutdown does not wait for the scheduler.
    std::lock_guard<std::mutex> lock(streams_mu_);
    streams_closed_ = true;
    for (grpc::ServerContext* context : step_streams_) context->TryCancel();
  }
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
