#include "worker/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::worker {
namespace {

double MillisSince(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

absl::Status Invalid(uint64_t seq_id, const std::string& what) {
  return absl::InvalidArgumentError(absl::StrCat("sequence ", seq_id, ": ", what));
}

absl::Status ValidateSampling(const v1::SamplingParams& p, int max_logprobs, uint64_t seq_id) {
  auto finite = [](float x) { return std::isfinite(x); };
  if (!finite(p.temperature()) || p.temperature() < 0) {
    return Invalid(seq_id, "sampling.temperature must be >= 0");
  }
  if (p.top_k() < 0) return Invalid(seq_id, "sampling.top_k must be >= 0");
  if (!finite(p.top_p()) || p.top_p() < 0 || p.top_p() > 1) {
    return Invalid(seq_id, "sampling.top_p must be in [0, 1]");
  }
  if (!finite(p.min_p()) || p.min_p() < 0 || p.min_p() > 1) {
    return Invalid(seq_id, "sampling.min_p must be in [0, 1]");
  }
  if (!finite(p.repetition_penalty()) || p.repetition_penalty() < 0) {
    return Invalid(seq_id, "sampling.repetition_penalty must be >= 0");
  }
  if (!finite(p.presence_penalty()) || !finite(p.frequency_penalty())) {
    return Invalid(seq_id, "sampling.presence_penalty and frequency_penalty must be finite");
  }
  if (p.num_logprobs() < 0 || p.num_logprobs() > max_logprobs) {
    return Invalid(seq_id, absl::StrCat("sampling.num_logprobs must be in [0, ", max_logprobs,
                                        "]"));
  }
  return absl::OkStatus();
}

}  // namespace

SamplingParams FromProto(const v1::SamplingParams& p) {
  SamplingParams s;
  s.temperature = p.temperature();
  s.top_k = p.top_k();
  s.top_p = p.top_p() == 0.0f ? 1.0f : p.top_p();
  s.min_p = p.min_p();
  s.repetition_penalty = p.repetition_penalty() == 0.0f ? 1.0f : p.repetition_penalty();
  s.presence_penalty = p.presence_penalty();
  s.frequency_penalty = p.frequency_penalty();
  s.seed = p.seed();
  s.num_logprobs = p.num_logprobs();
  return s;
}

StepEngine::StepEngine(LlamaModel* model, KvCache* cache, const Options& options)
    : model_(model),
      cache_(cache),
      options_(options),
      sampler_(model->config().vocab_size) {}

absl::Status StepEngine::ValidateBlocks(const google::protobuf::RepeatedField<int32_t>& blocks,
                                        const char* field, uint64_t seq_id) const {
  for (int32_t block : blocks) {
    if (block < 0 || block >= cache_->num_blocks()) {
      return Invalid(seq_id, absl::StrCat(field, " holds block ", block, ", outside [0, ",
                                          cache_->num_blocks(), ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status StepEngine::Validate(const v1::StepRequest& request,
                                  std::vector<Scheduled>* scheduled) const {
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
  auto check_capacity = [&](uint64_t id, int64_t computed, int64_t num_tokens,
                            int64_t known_tokens, int64_t blocks) -> absl::Status {
    if (num_tokens < 1) return Invalid(id, "num_tokens must be >= 1");
    if (computed + num_tokens > known_tokens) {
      return Invalid(id, absl::StrCat("num_tokens ", num_tokens, " goes past the ",
                                      known_tokens - computed, " token(s) not yet computed"));
    }
    if (computed + num_tokens > config.max_context_tokens) {
      return Invalid(id, absl::StrCat("would reach ", computed + num_tokens,
                                      " tokens, beyond the model's context of ",
                                      config.max_context_tokens));
    }
    if (computed + num_tokens > blocks * block_size) {
      return Invalid(id, absl::StrCat("needs ", computed + num_tokens, " KV slots but its ",
                                      blocks, " block(s) hold ", blocks * block_size));
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
    RETURN_IF_ERROR(check_capacity(id, s.num_computed, r.num_tokens(),
                                   static_cast<int64_t>(s.tokens.size()),
                                   static_cast<int64_t>(s.block_table.size()) +
                                       r.new_block_ids_size()));
    scheduled->push_back({id, nullptr, &r, r.num_tokens()});
  }
  for (const v1::NewSequence& n : request.new_sequences()) {
    const uint64_t id = n.seq_id();
    if (sequences_.contains(id) && !dropped.contains(id)) {
      return Invalid(id, "new_sequences names a sequence the worker already holds");
    }
    if (!seen.insert(id).second) return Invalid(id, "scheduled twice in one step");
    if (n.token_ids_size() == 0) return Invalid(id, "token_ids is empty");
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
    RETURN_IF_ERROR(ValidateSampling(n.sampling(), options_.max_logprobs, id));
    RETURN_IF_ERROR(ValidateBlocks(n.block_ids(), "block_ids", id));
    RETURN_IF_ERROR(check_capacity(id, n.num_cached_tokens(), n.num_tokens(),
                                   n.token_ids_size(), n.block_ids_size()));
    scheduled->push_back({id, &n, nullptr, n.num_tokens()});
  }
  if (total_tokens > options_.max_step_tokens) {
    return absl::InvalidArgumentError(absl::StrCat("step schedules ", total_tokens,
                                                   " tokens, above the worker's limit of ",
                                                   options_.max_step_tokens));
  }
  if (static_cast<int>(scheduled->size()) > options_.max_step_sequences) {
    return absl::InvalidArgumentError(absl::StrCat("step schedules ", scheduled->size(),
                                                   " sequences, above the worker's limit of ",
                                                   options_.max_step_sequences));
  }
  return absl::OkStatus();
}

void StepEngine::BuildBatch(const std::vector<Scheduled>& scheduled) {
  const int block_size = cache_->block_size();
  batch_.Clear();
  sampling_seqs_.clear();
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
      batch_.token_ids.push_back(seq.tokens[pos]);
      batch_.token_seq.push_back(static_cast<int32_t>(i));
      batch_.token_pos.push_back(pos);
      batch_.slot_mapping.push_back(seq.block_table[pos / block_size] * block_size +
                                    pos % block_size);
    }
    // A sequence samples once every token it knows has been computed.
    if (seq.num_computed + scheduled[i].num_tokens == static_cast<int>(seq.tokens.size())) {
      batch_.logit_rows.push_back(batch_.num_tokens() - 1);
      sampling_seqs_.push_back(scheduled[i].seq_id);
    }
  }
}

absl::Status StepEngine::Step(const v1::StepRequest& request, v1::StepResponse* response) {
  const auto start = std::chrono::steady_clock::now();
  std::vector<Scheduled> scheduled;
  RETURN_IF_ERROR(Validate(request, &scheduled));

  // Apply the deltas; from here on the step cannot be rejected.
  if (request.reset()) {
    sequences_.clear();
  } else {
    for (uint64_t id : request.dropped_seq_ids()) sequences_.erase(id);
  }
  for (const Scheduled& s : scheduled) {
    if (s.new_seq != nullptr) {
      Sequence seq;
      seq.tokens.assign(s.new_seq->token_ids().begin(), s.new_seq->token_ids().end());
      seq.num_prompt_tokens = s.new_seq->token_ids_size() - s.new_seq->num_output_tokens();
      seq.num_computed = s.new_seq->num_cached_tokens();
      seq.block_table.assign(s.new_seq->block_ids().begin(), s.new_seq->block_ids().end());
      seq.sampling = FromProto(s.new_seq->sampling());
      sequences_[s.seq_id] = std::move(seq);
    } else {
      Sequence& seq = sequences_.at(s.seq_id);
      seq.block_table.insert(seq.block_table.end(), s.running->new_block_ids().begin(),
                             s.running->new_block_ids().end());
    }
  }
  BuildBatch(scheduled);

  const int vocab = model_->config().vocab_size;
  const int rows = static_cast<int>(sampling_seqs_.size());
  const bool on_device = device_sampler_ != nullptr && rows <= device_sampler_->max_rows();
  const auto forward_start = std::chrono::steady_clock::now();
  double forward_ms = 0;
  absl::Status forward;
  if (on_device) {
    // Forward and sampling are queued together; the sampler's wait is the step's.
    absl::StatusOr<DeviceLogits> logits = model_->ForwardToDevice(batch_, *cache_);
    forward = logits.status();
    if (forward.ok()) {
      rows_to_sample_.clear();
      for (uint64_t seq_id : sampling_seqs_) {
        const Sequence& seq = sequences_.at(seq_id);
        const std::span<const int32_t> all(seq.tokens);
        rows_to_sample_.push_back({&seq.sampling, all.first(seq.num_prompt_tokens),
                                   all.subspan(seq.num_prompt_tokens),
                                   seq.tokens.size() - seq.num_prompt_tokens,
                                   seq.sampling.num_logprobs > 0});
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
  if (!forward.ok()) {
    // The KV cache of the scheduled sequences is now unreliable: forget them so the
    // scheduler must re-add (recompute) them.
    for (const Scheduled& s : scheduled) sequences_.erase(s.seq_id);
    return forward;
  }
  for (const Scheduled& s : scheduled) sequences_.at(s.seq_id).num_computed += s.num_tokens;

  const auto sample_start = std::chrono::steady_clock::now();
  std::vector<float> row;
  for (size_t i = 0; i < sampling_seqs_.size(); ++i) {
    Sequence& seq = sequences_.at(sampling_seqs_[i]);
    const std::span<const int32_t> all(seq.tokens);
    const bool want_logprob = seq.sampling.num_logprobs > 0;
    SampleResult result;
    if (on_device) {
      result = std::move(sampled_[i]);
    } else {
      row.assign(logits_.begin() + i * vocab, logits_.begin() + (i + 1) * vocab);
      result = sampler_.Sample(row, seq.sampling, all.first(seq.num_prompt_tokens),
                               all.subspan(seq.num_prompt_tokens),
                               seq.tokens.size() - seq.num_prompt_tokens, want_logprob);
    }
    seq.tokens.push_back(result.token_id);
    if (options_.tp_rank != 0) continue;
    v1::SampledToken* out = response->add_tokens();
    out->set_seq_id(sampling_seqs_[i]);
    out->set_token_id(result.token_id);
    if (want_logprob) {
      out->set_logprob(result.logprob);
      for (const TokenLogprob& alt : result.top_logprobs) {
        v1::TokenLogprob* t = out->add_top_logprobs();
        t->set_token_id(alt.token_id);
        t->set_logprob(alt.logprob);
      }
    }
  }
  ++steps_executed_;
  response->set_step_id(request.step_id());
  response->set_tp_rank(options_.tp_rank);
  response->set_num_step_tokens(batch_.num_tokens());
  response->mutable_timings()->set_forward_ms(forward_ms);
  response->mutable_timings()->set_sample_ms(MillisSince(sample_start));
  response->mutable_timings()->set_total_ms(MillisSince(start));
  return absl::OkStatus();
}

std::span<const float> StepEngine::LastLogits(uint64_t seq_id) const {
  const size_t vocab = model_->config().vocab_size;
  if (logits_.empty()) return {};
  for (size_t i = 0; i < sampling_seqs_.size(); ++i) {
    if (sampling_seqs_[i] == seq_id) return {logits_.data() + i * vocab, vocab};
  }
  return {};
}

}  // namespace conveyor::worker
