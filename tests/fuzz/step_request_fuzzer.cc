// Fuzzes the worker's validation of what the scheduler sends: InitRequest's argument
// checks (worker/service.cc, WorkerService::Init, on a device that loads nothing) and
// StepRequest validation (worker/step_runner.h, StepRunner::Step) on a tiny random-weight
// model, with the steps that pass run for real. Beyond the sanitizers it checks the
// engine's contract: a step out of order (previous_step_id not the last step handled, or
// that step refused; an id below the last one) is ABORTED, any other rejected step
// INVALID_ARGUMENT, and either returns no tokens and changes nothing; an accepted one
// samples ids inside the vocabulary; the CPU device never fails. The engine has a
// vocabulary (as a worker whose Init carried token_bytes), so steps with a grammar are
// parsed, masked and sampled under it too.
//
// Input: a first byte whose low two bits choose what follows: 0, an InitRequest (the
// rest of the input); otherwise up to kMaxSteps StepRequests run in order on an engine
// that holds no sequences at first, each behind its length as 2 little-endian bytes (the
// last one may run short: it takes what is left).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
#include "grammar/token_mask.h"
#include "grpcpp/test/server_context_test_spouse.h"
#include "kernels/backend.h"
#include "model/kv_cache.h"
#include "model/model.h"
#include "rpc/scheduler_id_metadata.h"
#include "spdlog/spdlog.h"
#include "testing/random_weights.h"
#include "tests/fuzz/fuzz_support.h"
#include "worker.pb.h"
#include "worker/service.h"
#include "worker/step_runner.h"

namespace conveyor::fuzz {
namespace {

constexpr int kMaxSteps = 8;
constexpr int kBlockSize = 16;
constexpr int kNumBlocks = 64;

// A device that cannot make a backend: Init asks for one only once the request passed
// its argument checks and the model's config.json was read, so no Init loads anything
// (no weights, no rendezvous with other ranks that would wait for its deadline).
class NoBackendDevice final : public model::Device {
 public:
  std::string_view name() const override { return "fuzz"; }
  absl::StatusOr<std::unique_ptr<kernels::Backend>> MakeBackend(const ModelConfig&) override {
    return absl::UnimplementedError("fuzz: Init passed its checks");
  }
  absl::StatusOr<std::string> CreateCollectiveId() override {
    return absl::UnimplementedError("no collectives");
  }
  absl::StatusOr<std::unique_ptr<model::Communicator>> Connect(
      std::string_view, int, int, kernels::Backend*,
      std::chrono::system_clock::time_point) override {
    return absl::UnimplementedError("no collectives");
  }
  absl::StatusOr<std::unique_ptr<model::DeviceSampler>> MakeSampler(kernels::Backend*, int,
                                                                    int) override {
    return nullptr;
  }
  absl::StatusOr<uint64_t> DefaultKvBudgetBytes(kernels::Backend*) const override { return 0; }
};

// The worker's real Init, behind the scheduler identity every call must carry. Whatever
// the request, it fails (the device makes no backend): the checks are for the sanitizers.
void FuzzInit(const uint8_t* data, size_t size) {
  static worker::WorkerService* service =
      new worker::WorkerService(std::make_unique<NoBackendDevice>(), {});
  worker::v1::InitRequest request;
  if (!request.ParseFromArray(data, static_cast<int>(size))) return;
  grpc::ServerContext context;
  grpc::testing::ServerContextTestSpouse spouse(&context);
  spouse.AddClientMetadata(kSchedulerIdMetadataKey, "fuzz-scheduler");
  worker::v1::InitResponse response;
  const grpc::Status status = service->Init(&context, &request, &response);
  if (status.ok()) {
    InvariantViolated("Init succeeded on a device that makes no backend",
                      absl::StrCat("request: ", request.ShortDebugString()));
  }
}

struct TinyWorker {
  std::unique_ptr<kernels::Backend> backend = kernels::MakeCpuBackend(1);
  std::unique_ptr<model::LlamaModel> model;
  std::unique_ptr<model::KvCache> cache;
  // A draft model of the same shape, other weights: steps may ask it for proposals.
  std::unique_ptr<model::LlamaModel> draft;
  std::unique_ptr<model::KvCache> draft_cache;
  std::unique_ptr<worker::StepRunner> engine;

  TinyWorker() {
    absl::StatusOr<ModelConfig> config = ModelShapePreset("tiny");
    if (!config.ok()) std::abort();
    auto created =
        model::LlamaModel::Create(*config, *testing::MakeRandomWeightSource(1), backend.get());
    if (!created.ok())
      InvariantViolated("cannot build the tiny model", created.status().ToString());
    model = *std::move(created);
    auto made = model::KvCache::Create(backend.get(), config->num_layers, config->num_kv_heads,
                                       config->head_dim, kBlockSize, kNumBlocks);
    if (!made.ok()) InvariantViolated("cannot make the KV cache", made.status().ToString());
    cache = *std::move(made);
    auto draft_created =
        model::LlamaModel::Create(*config, *testing::MakeRandomWeightSource(2), backend.get());
    if (!draft_created.ok())
      InvariantViolated("cannot build the draft model", draft_created.status().ToString());
    draft = *std::move(draft_created);
    auto draft_made =
        model::KvCache::Create(backend.get(), config->num_layers, config->num_kv_heads,
                               config->head_dim, kBlockSize, kNumBlocks);
    if (!draft_made.ok())
      InvariantViolated("cannot make the draft's KV cache", draft_made.status().ToString());
    draft_cache = *std::move(draft_made);
    worker::StepRunner::Options options;
    // Small steps keep the forward passes (and so the fuzzer) fast.
    options.max_step_tokens = 256;
    options.max_num_seqs = 16;
    engine = std::make_unique<worker::StepRunner>(model.get(), cache.get(), options);
    engine->set_vocabulary(MakeVocabulary(config->vocab_size, config->eos_token_ids));
    engine->set_draft(draft.get(), draft_cache.get());
  }

  // Token 0 is a control token; 1-255 are the single bytes and the rest pairs of printable
  // characters, so any grammar over bytes can make progress.
  static std::unique_ptr<grammar::Vocabulary> MakeVocabulary(int size,
                                                             const std::vector<int32_t>& eos) {
    std::vector<std::string> bytes(size);
    std::vector<bool> special(size, false);
    special[0] = true;
    for (int id = 1; id < size; ++id) {
      if (id < 256) {
        bytes[id] = std::string(1, static_cast<char>(id));
      } else {
        const int pair = id - 256;
        bytes[id] = {static_cast<char>(' ' + pair % 95), static_cast<char>(' ' + pair / 95 % 95)};
      }
    }
    return std::make_unique<grammar::Vocabulary>(std::move(bytes), std::move(special), eos);
  }
};

void FuzzSteps(const uint8_t* data, size_t size) {
  static TinyWorker* w = new TinyWorker();
  w->engine->Reset();
  const int vocab = w->model->config().vocab_size;
  uint64_t last_step = 0;  // What the engine's step order should be, kept alongside.
  bool last_ran = false;
  for (int step = 0; step < kMaxSteps && size >= 2; ++step) {
    const size_t length = std::min<size_t>(data[0] | static_cast<size_t>(data[1]) << 8, size - 2);
    worker::v1::StepRequest request;
    const bool parsed = request.ParseFromArray(data + 2, static_cast<int>(length));
    data += 2 + length;
    size -= 2 + length;
    if (!parsed) continue;
    const int sequences_before = w->engine->num_sequences();
    const uint64_t id = request.step_id();
    const uint64_t previous = request.previous_step_id();
    const bool out_of_order =
        (id != 0 && id < last_step) || (previous != 0 && (previous != last_step || !last_ran));
    worker::v1::StepResponse response;
    const absl::Status status = w->engine->Step(request, &response);
    if (w->engine->device_failed()) {
      InvariantViolated("the CPU device failed", status.ToString());
    }
    if (id >= last_step) {
      last_step = id;
      last_ran = status.ok();
    }
    if (w->engine->last_step_id() != last_step) {
      InvariantViolated("the engine's last step is not the last one handled",
                        absl::StrCat(w->engine->last_step_id(), " != ", last_step));
    }
    if (out_of_order != (status.code() == absl::StatusCode::kAborted)) {
      InvariantViolated(out_of_order ? "a step out of order was not refused ABORTED"
                                     : "a step in order was refused ABORTED",
                        absl::StrCat(status.ToString(), "\nstep: ", request.ShortDebugString()));
    }
    if (!status.ok()) {
      if ((!out_of_order && status.code() != absl::StatusCode::kInvalidArgument) ||
          response.tokens_size() != 0 || w->engine->num_sequences() != sequences_before) {
        InvariantViolated("a rejected step that is not INVALID_ARGUMENT or changed something",
                          absl::StrCat(status.ToString(), "\nstep: ", request.ShortDebugString()));
      }
      continue;
    }
    for (const worker::v1::SampledToken& token : response.tokens()) {
      if (token.token_id() < 0 || token.token_id() >= vocab) {
        InvariantViolated("a sampled token outside the vocabulary",
                          absl::StrCat(token.token_id(), "\nstep: ", request.ShortDebugString()));
      }
    }
    for (const worker::v1::DraftProposal& proposal : response.proposals()) {
      int asked = 0;
      for (const auto& r : request.running()) {
        if (r.seq_id() == proposal.seq_id()) asked = r.num_tokens_to_propose();
      }
      for (const auto& n : request.new_sequences()) {
        if (n.seq_id() == proposal.seq_id()) asked = n.num_tokens_to_propose();
      }
      if (proposal.token_ids_size() < 1 || proposal.token_ids_size() > asked) {
        InvariantViolated("a proposal of more tokens than asked for, or none",
                          absl::StrCat(proposal.token_ids_size(), " for ", asked,
                                       "\nstep: ", request.ShortDebugString()));
      }
      for (int32_t token : proposal.token_ids()) {
        if (token < 0 || token >= vocab) {
          InvariantViolated("a proposed token outside the vocabulary",
                            absl::StrCat(token, "\nstep: ", request.ShortDebugString()));
        }
      }
    }
  }
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Rejections are logged at warn/error level: at thousands a second that is noise.
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  if ((data[0] & 3) == 0) {
    conveyor::fuzz::FuzzInit(data + 1, size - 1);
  } else {
    conveyor::fuzz::FuzzSteps(data + 1, size - 1);
  }
  return 0;
}
