#include "model/direct_runner.h"

#include <algorithm>
#include <numeric>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace conveyor::model {

DirectRunner::DirectRunner(LlamaModel* model, KvCache* cache) : model_(model), cache_(cache) {
  Clear();
}

void DirectRunner::Clear() {
  seqs_.clear();
  // Highest first, so that pop_back hands out blocks 0, 1, 2, ...
  free_blocks_.resize(cache_->num_blocks());
  std::iota(free_blocks_.rbegin(), free_blocks_.rend(), 0);
}

int DirectRunner::Add(std::vector<int32_t> tokens, int num_cached) {
  Sequence seq;
  seq.tokens = std::move(tokens);
  seq.computed = std::clamp(num_cached, 0, static_cast<int>(seq.tokens.size()));
  seqs_.push_back(std::move(seq));
  return static_cast<int>(seqs_.size()) - 1;
}

void DirectRunner::Append(int seq, int32_t token) { seqs_[seq].tokens.push_back(token); }

absl::StatusOr<int> DirectRunner::Step(std::span<const int> seqs, int max_chunk, bool all_positions,
                                       std::vector<float>* logits) {
  RETURN_IF_ERROR(BuildBatch(seqs, max_chunk, all_positions));
  const int rows = static_cast<int>(batch_.logit_rows.size());
  logits->resize(static_cast<size_t>(rows) * model_->config().vocab_size);
  RETURN_IF_ERROR(model_->Forward(batch_, *cache_, logits->data()));
  for (size_t i = 0; i < seqs.size(); ++i) seqs_[seqs[i]].computed += chunks_[i];
  return rows;
}

absl::StatusOr<DeviceLogits> DirectRunner::StepOnDevice(std::span<const int> seqs, int max_chunk,
                                                        bool all_positions) {
  RETURN_IF_ERROR(BuildBatch(seqs, max_chunk, all_positions));
  ASSIGN_OR_RETURN(DeviceLogits logits, model_->ForwardToDevice(batch_, *cache_));
  for (size_t i = 0; i < seqs.size(); ++i) seqs_[seqs[i]].computed += chunks_[i];
  return logits;
}

absl::Status DirectRunner::BuildBatch(std::span<const int> seqs, int max_chunk,
                                      bool all_positions) {
  const int block_size = cache_->block_size();
  batch_.Clear();
  batch_.num_seqs = static_cast<int>(seqs.size());
  // Blocks first: every sequence needs room up to the end of its chunk, and cached
  // tokens it was added with occupy blocks as well.
  std::vector<int>& chunk = chunks_;
  chunk.assign(seqs.size(), 0);
  for (size_t i = 0; i < seqs.size(); ++i) {
    Sequence& s = seqs_[seqs[i]];
    const int pending = static_cast<int>(s.tokens.size()) - s.computed;
    chunk[i] = max_chunk > 0 ? std::min(pending, max_chunk) : pending;
    const int needed = (s.computed + chunk[i] + block_size - 1) / block_size;
    while (static_cast<int>(s.blocks.size()) < needed) {
      if (free_blocks_.empty()) {
        return absl::ResourceExhaustedError(
            absl::StrCat("the KV cache's ", cache_->num_blocks(), " blocks of ", block_size,
                         " tokens are all in use; make the cache larger or the batch smaller"));
      }
      s.blocks.push_back(free_blocks_.back());
      free_blocks_.pop_back();
    }
    batch_.max_blocks_per_seq = std::max(batch_.max_blocks_per_seq, needed);
  }
  for (size_t i = 0; i < seqs.size(); ++i) {
    const Sequence& s = seqs_[seqs[i]];
    for (int pos = s.computed; pos < s.computed + chunk[i]; ++pos) {
      if (all_positions) batch_.logit_rows.push_back(batch_.num_tokens());
      batch_.token_ids.push_back(s.tokens[pos]);
      batch_.token_seq.push_back(static_cast<int32_t>(i));
      batch_.token_pos.push_back(pos);
      batch_.slot_mapping.push_back(s.blocks[pos / block_size] * block_size + pos % block_size);
    }
    const bool done = s.computed + chunk[i] == static_cast<int>(s.tokens.size());
    if (!all_positions && done && chunk[i] > 0) {
      batch_.logit_rows.push_back(batch_.num_tokens() - 1);
    }
    for (int b = 0; b < batch_.max_blocks_per_seq; ++b) {
      batch_.block_tables.push_back(b < static_cast<int>(s.blocks.size()) ? s.blocks[b] : 0);
    }
  }
  return absl::OkStatus();
}

absl::Status DirectRunner::ComputeAll(std::span<const int> seqs, int max_step_tokens) {
  std::vector<float> logits;
  std::vector<int> group;
  int tokens = 0;
  auto flush = [&]() -> absl::Status {
    if (group.empty()) return absl::OkStatus();
    RETURN_IF_ERROR(Step(group, 0, false, &logits).status());
    group.clear();
    tokens = 0;
    return absl::OkStatus();
  };
  for (int seq : seqs) {
    int pending = static_cast<int>(seqs_[seq].tokens.size()) - seqs_[seq].computed;
    // A sequence longer than the step budget goes alone, in chunks.
    while (pending > max_step_tokens) {
      RETURN_IF_ERROR(flush());
      const int one[] = {seq};
      RETURN_IF_ERROR(Step(one, max_step_tokens, false, &logits).status());
      pending -= max_step_tokens;
    }
    if (tokens + pending > max_step_tokens) RETURN_IF_ERROR(flush());
    group.push_back(seq);
    tokens += pending;
  }
  return flush();
}

int Argmax(std::span<const float> values) {
  return static_cast<int>(std::max_element(values.begin(), values.end()) - values.begin());
}

}  // namespace conveyor::model
