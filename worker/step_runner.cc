#include "worker/step_runner.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "rpc/sampling_params_wire.h"

namespace conveyor::worker {
namespace {

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status Invalid(uint64_t seq_id, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_id, ": ", what));
}

// Compiled grammars a runner keeps, with their masks (MaskCache bounds each: a few MiB).
constexpr size_t kMaxCachedGrammars = 64;

void AddAlternatives(const std::vector<model::TokenLogprob>& alternatives,
                     google::protobuf::RepeatedPtrField<v1::TokenLogprob>* out) {
  for (const model::TokenLogprob& alt : alternatives) {
    v1::TokenLogprob* t = out->Add();
    t->set_token_id(alt.token_id);
    t->set_logprob(alt.logprob);
  }
}

void AddSampled(uint64_t seq_id, const model::SampleResult& result, bool with_logprob,
                v1::StepResponse* response) {
  v1::SampledToken* out = response->add_tokens();
  out->set_seq_id(seq_id);
  out->set_token_id(result.token_id);
  if (with_logprob) {
    out->set_logprob(result.logprob);
    AddAlternatives(result.top_logprobs, out->mutable_top_logprobs());
  }
}

// Draft tokens one sequence may carry in a step (RunningSequence.draft_token_ids).
constexpr int kMaxDraftTokens = 32;

}  // namespace

StepRunner::StepRunner(model::LlamaModel* model, model::KvCache* cache, const Options& options)
    : model_(model),
      cache_(cache),
      options_(options),
      sampler_(model->config().vocab_size),
      block_refs_(cache->num_blocks(), 0) {}

absl::Status StepRunner::ValidateBlocks(const google::protobuf::RepeatedField<int32_t>& blocks,
                                        const char* field, uint64_t seq_id) const {
  for (int32_t block : blocks) {
    if (block < 0 || block >= cache_->num_blocks()) {
      return Invalid(seq_id, absl::StrCat(field, " holds block ", block, ", outside [0, ",
                                          cache_->num_blocks(), ")"));
    }
  }
  return absl::OkStatus();
}

void StepRunner::AddSequence(uint64_t seq_id, Sequence seq) {
  for (int32_t block : seq.block_table) ++block_refs_[block];
  sequences_[seq_id] = std::move(seq);
}

void StepRunner::AddBlocks(Sequence& seq, std::span<const int32_t> blocks) {
  for (int32_t block : blocks) ++block_refs_[block];
  seq.block_table.insert(seq.block_table.end(), blocks.begin(), blocks.end());
}

void StepRunner::EraseSequence(uint64_t seq_id) {
  auto it = sequences_.find(seq_id);
  if (it == sequences_.end()) return;
  for (int32_t block : it->second.block_table) --block_refs_[block];
  sequences_.erase(it);
}

void StepRunner::ClearSequences() {
  sequences_.clear();
  std::fill(block_refs_.begin(), block_refs_.end(), 0);
}

absl::Status StepRunner::ValidateWrites(const v1::StepRequest& request,
                                        const std::vector<Scheduled>& scheduled) const {
  // References per block once the step's drops and additions apply: the sparse change.
  std::unordered_map<int32_t, int32_t> delta;
  if (request.reset()) {
    for (const auto& [id, seq] : sequences_) {
      for (int32_t block : seq.block_table) --delta[block];
    }
  } else {
    for (uint64_t id : request.dropped_seq_ids()) {
      for (int32_t block : sequences_.at(id).block_table) --delta[block];
    }
  }
  for (const Scheduled& s : scheduled) {
    const auto& added = s.new_seq != nullptr ? s.new_seq->block_ids() : s.running->new_block_ids();
    for (int32_t block : added) ++delta[block];
  }
  auto refs_after = [&](int32_t block) {
    auto it = delta.find(block);
    return block_refs_[block] + (it == delta.end() ? 0 : it->second);
  };
  const int block_size = cache_->block_size();
  for (const Scheduled& s : scheduled) {
    // The blocks of the sequence's table after the step: those it holds, then those the
    // step adds. Only the ones the step writes are checked (no copy of the table).
    const std::vector<int32_t>* held = nullptr;
    const google::protobuf::RepeatedField<int32_t>* added = nullptr;
    int computed = 0;
    if (s.new_seq != nullptr) {
      added = &s.new_seq->block_ids();
      computed = s.new_seq->num_cached_tokens();
    } else {
      const Sequence& seq = sequences_.at(s.seq_id);
      held = &seq.block_table;
      added = &s.running->new_block_ids();
      computed = seq.num_computed;
    }
    const size_t num_held = held == nullptr ? 0 : held->size();
    for (int b = computed / block_size; b <= (computed + s.num_tokens - 1) / block_size; ++b) {
      const int32_t block = static_cast<size_t>(b) < num_held ? (*held)[b] : (*added)[b - num_held];
      // More than one reference: another sequence holds it, or this one twice.
      if (refs_after(block) != 1) {
        return Invalid(s.seq_id,
                       absl::StrCat("would write K/V into block ", block,
                                    ", which another sequence (or this one twice) holds"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StepRunner::MatcherFor(const v1::NewSequence& seq, Scheduled* scheduled) {
  if (vocabulary_ == nullptr) {
    return absl::FailedPreconditionError(
        "has a grammar, but the worker was initialised without token_bytes");
  }
  std::shared_ptr<grammar::MaskCache>& cached = grammars_[seq.grammar()];
  if (cached == nullptr) {
    absl::StatusOr<grammar::Grammar> parsed = grammar::Grammar::Parse(seq.grammar());
    if (!parsed.ok()) {
      grammars_.erase(seq.grammar());
      return absl::InvalidArgumentError(absl::StrCat("grammar: ", parsed.status().message()));
    }
    if (grammars_.size() > kMaxCachedGrammars) {
      grammars_.clear();
      return MatcherFor(seq, scheduled);  // Once: the grammar now goes into an empty cache.
    }
    cached = std::make_shared<grammar::MaskCache>(
        std::make_shared<const grammar::Grammar>(*std::move(parsed)), vocabulary_.get());
  }
  auto matcher = std::make_unique<grammar::Matcher>(cached->shared_grammar());
  // Rebuilt from the output so far (after a preemption or on a new worker): the tokens were
  // sampled under this grammar, so the state is the one they left.
  const int first_output = seq.token_ids_size() - seq.num_output_tokens();
  for (int i = first_output; i < seq.token_ids_size(); ++i) {
    const int32_t token = seq.token_ids(i);
    if (token >= vocabulary_->size() || !matcher->Accept(vocabulary_->bytes(token))) {
      return absl::InvalidArgumentError(absl::StrCat("generated token ", i - first_output, " (id ",
                                                     token, ") is not allowed by its grammar"));
    }
    matcher->Commit();
  }
  scheduled->matcher = std::move(matcher);
  scheduled->masks = cached;
  return absl::OkStatus();
}

void StepRunner::ComputeMask(Sequence& seq) {
  mask_ = grammar::TokenMasker(vocabulary_.get(), seq.masks.get()).Compute(*seq.matcher);
  if (std::all_of(mask_.begin(), mask_.end(), [](uint32_t word) { return word == 0; })) {
    // No token's bytes continue the text (a vocabulary without the character the grammar
    // needs next): end the output rather than break the grammar.
    for (int32_t eos : model_->config().eos_token_ids) {
      if (eos >= 0 && eos < vocabulary_->size()) mask_[eos / 32] |= 1u << (eos % 32);
    }
  }
}

absl::Status StepRunner::CheckProposals(uint64_t seq_id, int32_t num_tokens_to_propose) const {
  if (num_tokens_to_propose == 0) return absl::OkStatus();
  if (num_tokens_to_propose < 0 || num_tokens_to_propose > kMaxDraftTokens) {
    return Invalid(seq_id, absl::StrCat("num_tokens_to_propose must be in [0, ", kMaxDraftTokens,
                                        "], got ", num_tokens_to_propose));
  }
  if (draft_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("sequence ", seq_id,
                     ": asks for proposals, but the worker was initialised without "
                     "draft_model_path"));
  }
  return absl::OkStatus();
}

absl::Status StepRunner::Validate(const v1::StepRequest& request,
                                  std::vector<Scheduled>* scheduled) {
  const ModelConfig& config = model_->config();
  const int block_size = cache_->block_size();
  std::unordered_set<uint64_t> dropped;
  if (request.reset()) {
    for (const auto& [id, seq] : sequences_) dropped.insert(id);
  } else {
    for (uint64_t id : request.dropped_seq_ids()) {
      if (!sequences_.contains(id)) {
        return Invalid(id, "dropped_seq_ids names an unknown sequence");
      }
      if (!dropped.insert(id).second) return Invalid(id, "dropped twice in one step");
    }
  }
  std::unordered_set<uint64_t> seen;
  int64_t total_tokens = 0;
  // Checks what every scheduled sequence must satisfy, given its state after the step.
  auto check_capacity = [&](uint64_t id, int64_t computed, int64_t num_tokens, int64_t known_tokens,
                            int64_t blocks) -> absl::Status {
    if (num_tokens < 1) return Invalid(id, "num_tokens must be >= 1");
    if (computed + num_tokens > known_tokens) {
      return Invalid(id, absl::StrCat("num_tokens ", num_tokens, " goes past the ",
                                      known_tokens - computed, " token(s) not yet computed"));
    }
    if (computed + num_tokens > config.max_context_tokens) {
      return Invalid(
          id, absl::StrCat("would reach ", computed + num_tokens,
                           " tokens, beyond the model's context of ", config.max_context_tokens));
    }
    if (computed + num_tokens > blocks * block_size) {
      return Invalid(id, absl::StrCat("needs ", computed + num_tokens, " KV slots but its ", blocks,
                                      " block(s) hold ", blocks * block_size));
    }
    total_tokens += num_tokens;
    return absl::OkStatus();
  };

  for (const v1::RunningSequence& r : request.running()) {
    const uint64_t id = r.seq_id();
    auto it = sequences_.find(id);
    if (it == sequences_.end() || dropped.contains(id)) {
      return Invalid(id, "running names an unknown sequence (new ones go in new_sequences)");
    }
    if (!seen.insert(id).second) return Invalid(id, "scheduled twice in one step");
    RETURN_IF_ERROR(ValidateBlocks(r.new_block_ids(), "new_block_ids", id));
    const Sequence& s = it->second;
    const int drafts = r.draft_token_ids_size();
    if (drafts > 0) {
      if (drafts > kMaxDraftTokens) {
        return Invalid(id, absl::StrCat("carries ", drafts, " draft tokens, above the limit of ",
                                        kMaxDraftTokens));
      }
      if (r.num_tokens() != 1 || s.num_computed + 1 != static_cast<int>(s.tokens.size())) {
        return Invalid(id, "draft_token_ids needs a decode: num_tokens 1, on the last token");
      }
      for (int32_t token : r.draft_token_ids()) {
        if (token < 0 || token >= config.vocab_size) {
          return Invalid(id,
                         absl::StrCat("draft token id ", token, " is outside the vocabulary [0, ",
                                      config.vocab_size, ")"));
        }
      }
    }
    RETURN_IF_ERROR(CheckProposals(id, r.num_tokens_to_propose()));
    // The drafts count as tokens the sequence knows and computes this step.
    RETURN_IF_ERROR(check_capacity(
        id, s.num_computed, r.num_tokens() + drafts, static_cast<int64_t>(s.tokens.size()) + drafts,
        static_cast<int64_t>(s.block_table.size()) + r.new_block_ids_size()));
    scheduled->push_back({id, nullptr, &r, r.num_tokens() + drafts, nullptr, nullptr});
  }
  for (const v1::NewSequence& n : request.new_sequences()) {
    const uint64_t id = n.seq_id();
    if (sequences_.contains(id) && !dropped.contains(id)) {
      return Invalid(id, "new_sequences names a sequence the worker already holds");
    }
    if (!seen.insert(id).second) return Invalid(id, "scheduled twice in one step");
    if (n.token_ids_size() == 0) return Invalid(id, "token_ids is empty");
    if (n.token_ids_size() > config.max_context_tokens) {
      return Invalid(
          id, absl::StrCat("holds ", n.token_ids_size(), " tokens, beyond the model's context of ",
                           config.max_context_tokens));
    }
    for (int32_t token : n.token_ids()) {
      if (token < 0 || token >= config.vocab_size) {
        return Invalid(id, absl::StrCat("token id ", token, " is outside the vocabulary [0, ",
                                        config.vocab_size, ")"));
      }
    }
    if (n.num_output_tokens() < 0 || n.num_output_tokens() >= n.token_ids_size()) {
      return Invalid(id, "num_output_tokens must be in [0, len(token_ids))");
    }
    if (n.num_cached_tokens() < 0 || n.num_cached_tokens() >= n.token_ids_size()) {
      return Invalid(id, "num_cached_tokens must be in [0, len(token_ids))");
    }
    if (absl::Status sampling =
            ValidateSamplingParams(FromWire(n.sampling()), options_.max_logprobs);
        !sampling.ok()) {
      return Invalid(id, absl::StrCat("sampling.", sampling.message()));
    }
    for (const v1::LogitBias& bias : n.sampling().logit_bias()) {
      if (bias.token_id() >= config.vocab_size) {
        return Invalid(id, absl::StrCat("sampling.logit_bias names token ", bias.token_id(),
                                        ", outside the vocabulary [0, ", config.vocab_size, ")"));
      }
    }
    if (n.has_prompt_logprobs()) {
      if (n.prompt_logprobs() < 0 || n.prompt_logprobs() > options_.max_logprobs) {
        return Invalid(id, absl::StrCat("prompt_logprobs must be in [0, ", options_.max_logprobs,
                                        "], got ", n.prompt_logprobs()));
      }
      if (n.num_cached_tokens() > 0) {
        return Invalid(id,
                       "a sequence that scores its prompt (prompt_logprobs) has no cached tokens");
      }
    }
    RETURN_IF_ERROR(ValidateBlocks(n.block_ids(), "block_ids", id));
    RETURN_IF_ERROR(CheckProposals(id, n.num_tokens_to_propose()));
    RETURN_IF_ERROR(check_capacity(id, n.num_cached_tokens(), n.num_tokens(), n.token_ids_size(),
                                   n.block_ids_size()));
    Scheduled s{id, &n, nullptr, n.num_tokens(), nullptr, nullptr};
    if (!n.grammar().empty()) {
      if (absl::Status made = MatcherFor(n, &s); !made.ok()) {
        return absl::Status(made.code(), absl::StrCat("sequence ", id, ": ", made.message()));
      }
    }
    scheduled->push_back(std::move(s));
  }
  if (total_tokens > options_.max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step schedules ", total_tokens,
                                                   " tokens, above the worker's limit of ",
                                                   options_.max_step_tokens));
  }
  if (static_cast<int>(scheduled->size()) > options_.max_num_seqs) {
    return absl::InvalidArgumentError(absl::StrCat("step schedules ", scheduled->size(),
                                                   " sequences, above the worker's limit of ",
                                                   options_.max_num_seqs));
  }
  return absl::OkStatus();
}

void StepRunner::BuildBatch(const std::vector<Scheduled>& scheduled) {
  const int block_size = cache_->block_size();
  batch_.Clear();
  sampling_seqs_.clear();
  scored_positions_.clear();
  std::vector<int32_t> scored_rows;
  size_t max_blocks = 1;
  for (const Scheduled& s : scheduled) {
    max_blocks = std::max(max_blocks, sequences_.at(s.seq_id).block_table.size());
  }
  batch_.num_seqs = static_cast<int>(scheduled.size());
  batch_.max_blocks_per_seq = static_cast<int>(max_blocks);
  batch_.block_tables.assign(scheduled.size() * max_blocks, 0);
  for (size_t i = 0; i < scheduled.size(); ++i) {
    const Sequence& seq = sequences_.at(scheduled[i].seq_id);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              batch_.block_tables.begin() + i * max_blocks);
    for (int pos = seq.num_computed; pos < seq.num_computed + scheduled[i].num_tokens; ++pos) {
      // A scored prompt: the row of each position whose successor is a prompt token.
      if (seq.prompt_logprobs >= 0 && pos + 1 < seq.num_prompt_tokens) {
        scored_rows.push_back(batch_.num_tokens());
        scored_positions_.emplace_back(scheduled[i].seq_id, pos);
      }
      batch_.token_ids.push_back(seq.tokens[pos]);
      batch_.token_seq.push_back(static_cast<int32_t>(i));
      batch_.token_pos.push_back(pos);
      batch_.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size +
                                    pos % block_size);
    }
    // A sequence samples once every token it knows has been computed: its last token's
    // row, after the row of the last token and each draft before it.
    if (seq.num_computed + scheduled[i].num_tokens == static_cast<int>(seq.tokens.size())) {
      for (int j = seq.num_drafts; j >= 0; --j)
        batch_.logit_rows.push_back(batch_.num_tokens() - 1 - j);
      sampling_seqs_.push_back(scheduled[i].seq_id);
    }
  }
  batch_.logit_rows.insert(batch_.logit_rows.end(), scored_rows.begin(), scored_rows.end());
}

absl::Status StepRunner::CheckOrder(const v1::StepRequest& request) const {
  const uint64_t id = request.step_id();
  const uint64_t previous = request.previous_step_id();
  if (id != 0 && id < last_step_id_) {
    return absl::AbortedError(absl::StrCat("step ", id, " arrived after step ", last_step_id_,
                                           " was handled; steps run in the order of their ids"));
  }
  if (previous == 0) return absl::OkStatus();
  if (previous != last_step_id_) {
    return absl::AbortedError(absl::StrCat("step ", id, " was built on step ", previous,
                                           ", but the last step this worker handled is ",
                                           last_step_id_));
  }
  if (!last_step_ok_) {
    return absl::AbortedError(absl::StrCat("step ", id, " was built on step ", previous,
                                           ", which did not run here (refused or failed)"));
  }
  return absl::OkStatus();
}

absl::Status StepRunner::Step(const v1::StepRequest& request, v1::StepResponse* response) {
  absl::Status status = CheckOrder(request);
  if (status.ok()) status = RunStep(request, response);
  // A step refused for its order counts as handled too (not as run), so that one built on
  // it is refused at once rather than left waiting. A late one changes nothing.
  if (request.step_id() >= last_step_id_) {
    last_step_id_ = request.step_id();
    last_step_ok_ = status.ok();
  }
  return status;
}

int32_t StepRunner::SampleInto(uint64_t step_id, uint64_t seq_id, Sequence& seq,
                               std::vector<float>& row, v1::StepResponse* response) {
  const std::span<const int32_t> all(seq.tokens);
  if (logits_tap_ != nullptr) logits_tap_->OnLogits(step_id, seq_id, row);
  if (seq.matcher != nullptr) ComputeMask(seq);
  const model::SampleResult result = sampler_.Sample(
      row, seq.sampling, all.first(seq.num_prompt_tokens), all.subspan(seq.num_prompt_tokens),
      seq.tokens.size() - seq.num_prompt_tokens, seq.sampling.num_logprobs > 0,
      seq.matcher != nullptr ? mask_.data() : nullptr);
  if (seq.matcher != nullptr && result.token_id < vocabulary_->size()) {
    // The mask allowed it, so the bytes are accepted (EOS, which adds none, ends it).
    seq.matcher->Accept(vocabulary_->bytes(result.token_id));
    seq.matcher->Commit();
  }
  seq.tokens.push_back(result.token_id);
  if (options_.tp_rank == 0) {
    AddSampled(seq_id, result, seq.sampling.num_logprobs > 0, response);
  }
  return result.token_id;
}

absl::Status StepRunner::FailStep(uint64_t step_id, const std::vector<Scheduled>& scheduled,
                                  const absl::Status& failure) {
  // The KV cache of the scheduled sequences is now unreliable: forget them so the
  // scheduler must re-add (recompute) them (drafts and all).
  for (const Scheduled& s : scheduled) EraseSequence(s.seq_id);
  device_failed_ = true;
  // UNAVAILABLE from a collective: a peer rank went away (the group must be rebuilt,
  // nothing was wrong with the step). Anything else is the device's own error.
  if (failure.code() == absl::StatusCode::kUnavailable) {
    return absl::UnavailableError(
        absl::StrCat("step ", step_id, " lost a tensor-parallel peer: ", failure.message()));
  }
  return absl::InternalError(
      absl::StrCat("step ", step_id, " failed on the device: ", failure.message()));
}

absl::Status StepRunner::DraftForward() {
  draft_logits_.resize(draft_batch_.logit_rows.size() *
                       static_cast<size_t>(draft_->config().vocab_size));
  return draft_->Forward(draft_batch_, *draft_cache_, draft_logits_.data());
}

// The draft model proposes greedily: each proposal is the argmax of its row (ties to the
// lower id), which keeps verification exact with any sampling (docs/speculative-decoding.md).
// Its K/V needs no care beyond being the draft's own: the model verifies every proposal,
// so a stale entry could only cost acceptance, never change an output.
absl::Status StepRunner::Propose(v1::StepResponse* response) {
  const int block_size = cache_->block_size();
  const int vocab = draft_->config().vocab_size;
  const int draft_context = draft_->config().max_context_tokens;
  struct Proposing {
    uint64_t seq_id;
    Sequence* seq;
    int k;                          // Proposals it gets.
    std::vector<int32_t> proposed;  // So far.
  };
  std::vector<Proposing> proposing;
  size_t max_blocks = 1;
  for (uint64_t seq_id : sampling_seqs_) {
    Sequence& seq = sequences_.at(seq_id);
    if (seq.num_to_propose == 0) continue;
    const int len = static_cast<int>(seq.tokens.size());
    // The last proposal's K/V holds where the tokens kept equal it.
    int valid = seq.num_draft_computed;
    for (int32_t token : seq.draft_tail) {
      if (valid >= len || seq.tokens[valid] != token) break;
      ++valid;
    }
    seq.draft_tail.clear();
    // The last token is always fed (again): its row gives the first proposal.
    seq.num_draft_computed = std::min(valid, len - 1);
    // Proposal j (from 1) comes from the row of position len - 2 + j, whose K/V is
    // written: k proposals need positions len - 1 (the last token, which the model has
    // not computed yet either) to len + k - 2 within the draft's context, in slots of
    // blocks the sequence alone holds.
    int k = std::min(seq.num_to_propose, draft_context - len + 1);
    for (int pos = len - 1; pos <= len + k - 2; ++pos) {
      const size_t b = pos / block_size;
      if (b >= seq.block_table.size() || block_refs_[seq.block_table[b]] != 1) {
        k = pos - len + 1;
        break;
      }
    }
    if (k <= 0) continue;
    max_blocks = std::max(max_blocks, seq.block_table.size());
    proposing.push_back({seq_id, &seq, k, {}});
  }
  if (proposing.empty()) return absl::OkStatus();

  std::vector<size_t> row_owner;  // The Proposing each logit row of draft_batch_ is for.
  auto start_batch = [&] {
    draft_batch_.Clear();
    draft_batch_.max_blocks_per_seq = static_cast<int>(max_blocks);
    row_owner.clear();
  };
  // Appends `tokens` of proposing[i] at positions from `pos`, the last one's logit row
  // wanted when `sample`.
  auto append = [&](size_t i, std::span<const int32_t> tokens, int pos, bool sample) {
    const Sequence& seq = *proposing[i].seq;
    const int index = draft_batch_.num_seqs++;
    draft_batch_.block_tables.resize(static_cast<size_t>(draft_batch_.num_seqs) * max_blocks, 0);
    std::copy(seq.block_table.begin(), seq.block_table.end(),
              draft_batch_.block_tables.begin() + index * max_blocks);
    for (int32_t token : tokens) {
      draft_batch_.token_ids.push_back(token);
      draft_batch_.token_seq.push_back(index);
      draft_batch_.token_pos.push_back(pos);
      draft_batch_.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size +
                                          pos % block_size);
      ++pos;
    }
    if (sample) {
      draft_batch_.logit_rows.push_back(draft_batch_.num_tokens() - 1);
      row_owner.push_back(i);
    }
  };
  auto run = [&]() -> absl::Status {
    if (draft_batch_.num_tokens() == 0) return absl::OkStatus();
    RETURN_IF_ERROR(DraftForward());
    for (size_t r = 0; r < row_owner.size(); ++r) {
      const float* row = draft_logits_.data() + r * vocab;
      proposing[row_owner[r]].proposed.push_back(
          static_cast<int32_t>(std::max_element(row, row + vocab) - row));
    }
    start_batch();
    return absl::OkStatus();
  };

  // The catch-up: every token without draft K/V (a whole prompt at a sequence's first
  // proposal), in batches of at most max_step_tokens, which the activations are sized for.
  start_batch();
  for (size_t i = 0; i < proposing.size(); ++i) {
    Sequence& seq = *proposing[i].seq;
    const int len = static_cast<int>(seq.tokens.size());
    while (seq.num_draft_computed < len) {
      const int room = options_.max_step_tokens - draft_batch_.num_tokens();
      if (room <= 0 || draft_batch_.num_seqs == options_.max_num_seqs) {
        RETURN_IF_ERROR(run());
        continue;
      }
      const int n = std::min(room, len - seq.num_draft_computed);
      const std::span<const int32_t> all(seq.tokens);
      append(i, all.subspan(seq.num_draft_computed, n), seq.num_draft_computed,
             seq.num_draft_computed + n == len);
      seq.num_draft_computed += n;
    }
  }
  RETURN_IF_ERROR(run());
  // Then one token per pass: proposal j fed back for proposal j + 1.
  for (int j = 1;; ++j) {
    for (size_t i = 0; i < proposing.size(); ++i) {
      const Proposing& p = proposing[i];
      if (p.k <= j) continue;
      const int len = static_cast<int>(p.seq->tokens.size());
      append(i, std::span<const int32_t>(&p.proposed[j - 1], 1), len - 1 + j, true);
    }
    if (draft_batch_.num_tokens() == 0) break;
    RETURN_IF_ERROR(run());
  }
  for (Proposing& p : proposing) {
    p.seq->draft_tail.assign(p.proposed.begin(), p.proposed.end() - 1);
    if (options_.tp_rank == 0) {
      v1::DraftProposal* out = response->add_proposals();
      out->set_seq_id(p.seq_id);
      out->mutable_token_ids()->Add(p.proposed.begin(), p.proposed.end());
    }
  }
  return absl::OkStatus();
}

absl::Status StepRunner::RunStep(const v1::StepRequest& request, v1::StepResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Scheduled> scheduled;
  RETURN_IF_ERROR(Validate(request, &scheduled));
  RETURN_IF_ERROR(ValidateWrites(request, scheduled));

  // Apply the deltas; from here on the step cannot be rejected.
  if (request.reset()) {
    ClearSequences();
  } else {
    for (uint64_t id : request.dropped_seq_ids()) EraseSequence(id);
  }
  for (Scheduled& s : scheduled) {
    if (s.new_seq != nullptr) {
      Sequence seq;
      seq.tokens.assign(s.new_seq->token_ids().begin(), s.new_seq->token_ids().end());
      seq.num_prompt_tokens = s.new_seq->token_ids_size() - s.new_seq->num_output_tokens();
      seq.num_computed = s.new_seq->num_cached_tokens();
      seq.block_table.assign(s.new_seq->block_ids().begin(), s.new_seq->block_ids().end());
      seq.sampling = FromWire(s.new_seq->sampling());
      seq.matcher = std::move(s.matcher);
      seq.masks = std::move(s.masks);
      seq.num_to_propose = s.new_seq->num_tokens_to_propose();
      if (s.new_seq->has_prompt_logprobs()) seq.prompt_logprobs = s.new_seq->prompt_logprobs();
      AddSequence(s.seq_id, std::move(seq));
    } else {
      const auto& added = s.running->new_block_ids();
      Sequence& seq = sequences_.at(s.seq_id);
      AddBlocks(seq, std::span<const int32_t>(added.data(), added.size()));
      const auto& drafts = s.running->draft_token_ids();
      seq.tokens.insert(seq.tokens.end(), drafts.begin(), drafts.end());
      seq.num_drafts = drafts.size();
      seq.num_to_propose = s.running->num_tokens_to_propose();
    }
  }
  BuildBatch(scheduled);

  const int vocab = model_->config().vocab_size;
  const int rows = static_cast<int>(batch_.logit_rows.size());
  // Grammar masks are applied on the host: a step with a constrained row samples there.
  // Drafts are verified one position after another (each draw sees the tokens kept
  // before it): on the host too. So is a row with a logit_bias (the device sampler has
  // none yet).
  const bool host_only =
      std::any_of(sampling_seqs_.begin(), sampling_seqs_.end(), [&](uint64_t id) {
        const Sequence& seq = sequences_.at(id);
        return seq.matcher != nullptr || seq.num_drafts > 0 || !seq.sampling.logit_bias.empty();
      });
  // Scored prompt rows are read on the host.
  const bool on_device = device_sampler_ != nullptr && rows <= device_sampler_->max_rows() &&
                         !host_only && scored_positions_.empty();
  const auto forward_start = std::chrono::steady_clock::now();
  double forward_ms = 0;
  absl::Status forward;
  if (on_device) {
    // Forward and sampling are queued together; the sampler's wait is the step's.
    absl::StatusOr<model::DeviceLogits> logits = model_->ForwardToDevice(batch_, *cache_);
    forward = logits.status();
    if (forward.ok()) {
      rows_to_sample_.clear();
      for (uint64_t seq_id : sampling_seqs_) {
        const Sequence& seq = sequences_.at(seq_id);
        const std::span<const int32_t> all(seq.tokens);
        rows_to_sample_.push_back(
            {&seq.sampling, all.first(seq.num_prompt_tokens), all.subspan(seq.num_prompt_tokens),
             seq.tokens.size() - seq.num_prompt_tokens, seq.sampling.num_logprobs > 0});
      }
      forward = device_sampler_->Sample(*logits, rows_to_sample_, &sampled_);
    }
    forward_ms = MillisSince(forward_start);
    logits_.clear();
  } else {
    logits_.resize(static_cast<size_t>(rows) * vocab);
    forward = model_->Forward(batch_, *cache_, logits_.data());
    forward_ms = MillisSince(forward_start);
  }
  if (!forward.ok()) return FailStep(request.step_id(), scheduled, forward);
  for (const Scheduled& s : scheduled) sequences_.at(s.seq_id).num_computed += s.num_tokens;

  const auto sample_start = std::chrono::steady_clock::now();
  std::vector<float> row;
  size_t first_row = 0;
  for (size_t i = 0; i < sampling_seqs_.size(); ++i) {
    const uint64_t seq_id = sampling_seqs_[i];
    Sequence& seq = sequences_.at(seq_id);
    if (on_device) {  // No grammar, no drafts: one row each.
      const model::SampleResult& result = sampled_[i];
      seq.tokens.push_back(result.token_id);
      if (options_.tp_rank == 0) {
        AddSampled(seq_id, result, seq.sampling.num_logprobs > 0, response);
      }
      ++first_row;
      continue;
    }
    // Row j scores the token after the last one and j drafts. Each draft is kept while
    // it equals what is sampled at its position, the draw a step without drafts would
    // make there (same logits, tokens before it, draw index): so the tokens kept are
    // those that decoding one token per step gives, whatever was proposed.
    const std::vector<int32_t> drafts(seq.tokens.end() - seq.num_drafts, seq.tokens.end());
    seq.tokens.resize(seq.tokens.size() - seq.num_drafts);
    int kept = 0;
    for (int j = 0; j <= seq.num_drafts; ++j) {
      row.assign(logits_.begin() + (first_row + j) * vocab,
                 logits_.begin() + (first_row + j + 1) * vocab);
      const int32_t token = SampleInto(request.step_id(), seq_id, seq, row, response);
      if (j == seq.num_drafts || token != drafts[j]) break;
      ++kept;
    }
    first_row += seq.num_drafts + 1;
    // K/V is good up to the last kept draft; the slots after it are written again later.
    seq.num_computed -= seq.num_drafts - kept;
    seq.num_drafts = 0;
  }
  if (options_.tp_rank == 0) {
    for (size_t k = 0; k < scored_positions_.size(); ++k) {
      const auto [seq_id, pos] = scored_positions_[k];
      const Sequence& seq = sequences_.at(seq_id);
      const std::span<const float> logits(logits_.data() + (first_row + k) * vocab, vocab);
      const model::SampleResult scored =
          sampler_.Score(logits, seq.tokens[pos + 1], seq.prompt_logprobs);
      v1::PromptLogprob* out = response->add_prompt_logprobs();
      out->set_seq_id(seq_id);
      out->set_position(pos + 1);
      out->set_token_id(scored.token_id);
      out->set_logprob(scored.logprob);
      AddAlternatives(scored.top_logprobs, out->mutable_top_logprobs());
    }
  }
  const double sample_ms = MillisSince(sample_start);
  double propose_ms = 0;
  if (draft_ != nullptr) {
    const auto propose_start = std::chrono::steady_clock::now();
    if (absl::Status proposed = Propose(response); !proposed.ok()) {
      return FailStep(request.step_id(), scheduled, proposed);
    }
    propose_ms = MillisSince(propose_start);
  }
  ++steps_executed_;
  response->set_step_id(request.step_id());
  response->set_tp_rank(options_.tp_rank);
  response->set_num_step_tokens(batch_.num_tokens());
  response->mutable_timings()->set_forward_ms(forward_ms);
  response->mutable_timings()->set_sample_ms(sample_ms);
  response->mutable_timings()->set_propose_ms(propose_ms);
  response->mutable_timings()->set_total_ms(MillisSince(start));
  return absl::OkStatus();
}

}  // namespace conveyor::worker
