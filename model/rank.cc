#include "model/rank.h"

#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/model_config.h"
#include "common/status_macros.h"

namespace conveyor::model {

Rank::~Rank() = default;

absl::Status Rank::LoadDraft(Rank& rank, const RankOptions& options) {
  const ModelConfig& c = rank.model_->config();
  absl::StatusOr<std::unique_ptr<LlamaModel>> draft =
      LlamaModel::Load(options.draft_model_path, rank.backend_.get(), rank.comm_.get());
  if (!draft.ok()) {
    return absl::Status(
        draft.status().code(),
        absl::StrCat("draft model ", options.draft_model_path, ": ", draft.status().message()));
  }
  const ModelConfig& d = (*draft)->config();
  // Its proposals are the model's token ids: the vocabularies must be one (a larger
  // padded embedding, as some checkpoints have, would propose ids the model lacks).
  if (d.vocab_size != c.vocab_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "draft model ", options.draft_model_path, " has a vocabulary of ", d.vocab_size,
        " tokens, the model ", c.vocab_size, ": a draft must share the model's tokenizer"));
  }
  // Its steps are at most the model's (a catch-up is cut to fit), with one logit row per
  // sequence.
  RETURN_IF_ERROR((*draft)->ReserveActivations(options.max_step_tokens, options.max_num_seqs));
  rank.draft_model_ = *std::move(draft);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Rank>> Rank::Create(Device& device, const RankOptions& options,
                                                   std::chrono::system_clock::time_point deadline) {
  const auto start = std::chrono::steady_clock::now();
  // Rank 0's rendezvous serves one attempt: connected, every rank is done with it; failed
  // (here or before connecting), the group needs a new collective id.
  bool rendezvous_open = options.rank == 0;
  auto end_rendezvous = [&] {
    if (rendezvous_open) device.EndRendezvous();
    rendezvous_open = false;
  };
  absl::Cleanup end_on_failure = end_rendezvous;
  std::unique_ptr<Rank> rank(new Rank());
  ASSIGN_OR_RETURN(const ModelConfig checkpoint, LoadCheckpointConfig(options.model_path));
  ASSIGN_OR_RETURN(rank->backend_, device.MakeBackend(checkpoint));
  absl::StatusOr<std::unique_ptr<Communicator>> comm = device.Connect(
      options.collective_id, options.rank, options.world_size, rank->backend_.get(), deadline);
  end_rendezvous();
  RETURN_IF_ERROR(comm.status());
  rank->comm_ = *std::move(comm);
  ASSIGN_OR_RETURN(rank->model_,
                   LlamaModel::Load(options.model_path, rank->backend_.get(), rank->comm_.get()));
  LlamaModel& model = *rank->model_;
  const ModelConfig& c = model.config();
  if (!options.draft_model_path.empty()) {
    RETURN_IF_ERROR(LoadDraft(*rank, options));
  }
  // Before the KV cache is sized, whatever else a step needs: the largest step's
  // activations and the sampler's scratch come out of the same memory.
  RETURN_IF_ERROR(model.ReserveActivations(options.max_step_tokens, options.max_num_seqs));
  if (device.decode_graphs()) RETURN_IF_ERROR(model.EnableDecodeGraphs(options.max_num_seqs));
  ASSIGN_OR_RETURN(rank->device_sampler_,
                   device.MakeSampler(rank->backend_.get(), c.vocab_size, options.max_num_seqs));
  // A block's bytes in the KV cache of `m`, and that cache; the draft's has as many
  // blocks as the model's, out of the same budget.
  kernels::Backend* backend = rank->backend_.get();
  auto bytes_per_block = [&](const LlamaModel& m) {
    return KvCache::BytesPerBlock(m.config().num_layers, m.local_num_kv_heads(),
                                  m.config().head_dim, options.block_size,
                                  backend->kv_element_bytes());
  };
  auto make_cache = [&](const LlamaModel& m, int num_blocks) {
    return KvCache::Create(backend, m.config().num_layers, m.local_num_kv_heads(),
                           m.config().head_dim, options.block_size, num_blocks);
  };
  const LlamaModel* draft = rank->draft_model_.get();
  const size_t block_bytes = bytes_per_block(model) + (draft ? bytes_per_block(*draft) : 0);
  uint64_t budget = options.kv_cache_bytes;
  if (budget == 0) {
    ASSIGN_OR_RETURN(budget, device.DefaultKvBudgetBytes(rank->backend_.get()));
  }
  const uint64_t num_blocks = budget / block_bytes;
  if (num_blocks > static_cast<uint64_t>(INT32_MAX)) {
    return absl::InvalidArgumentError("kv_cache_bytes is too large");
  }
  ASSIGN_OR_RETURN(rank->cache_, make_cache(model, static_cast<int>(num_blocks)));
  if (draft != nullptr) {
    ASSIGN_OR_RETURN(rank->draft_cache_, make_cache(*draft, static_cast<int>(num_blocks)));
  }
  rank->load_ms_ =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  return rank;
}

std::string_view Rank::compute_dtype() const {
  return backend_->activation_bytes() == 4 ? "float32" : "bfloat16";
}

}  // namespace conveyor::model
