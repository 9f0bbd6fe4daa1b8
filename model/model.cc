#include "model/model.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <numbers>
#include <numeric>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/gguf_weights.h"
#include "common/status_macros.h"

namespace conveyor::model {
namespace {

using kernels::BackendBuffer;

std::string LayerName(int layer, const char* suffix) {
  return absl::StrCat("model.layers.", layer, ".", suffix);
}

// RoPE inverse frequencies, rescaled as config.json's rope_scaling asks.
std::vector<double> InverseFrequencies(const ModelConfig& c) {
  const int half = c.head_dim / 2;
  std::vector<double> inv(half);
  for (int i = 0; i < half; ++i) {
    inv[i] = 1.0 / std::pow(static_cast<double>(c.rope_theta), 2.0 * i / c.head_dim);
  }
  const RopeScaling& s = c.rope_scaling;
  switch (s.type) {
    case RopeScaling::Type::kNone:
      break;
    case RopeScaling::Type::kLinear:
      for (double& f : inv) f /= s.factor;
      break;
    case RopeScaling::Type::kLlama3: {
      const double old_context = s.original_max_position_embeddings;
      const double low_freq_wavelen = old_context / s.low_freq_factor;
      const double high_freq_wavelen = old_context / s.high_freq_factor;
      for (double& f : inv) {
        const double wavelen = 2.0 * std::numbers::pi / f;
        if (wavelen > low_freq_wavelen) {
          f /= s.factor;
        } else if (wavelen >= high_freq_wavelen) {
          const double smooth = (old_context / wavelen - s.low_freq_factor) /
                                (s.high_freq_factor - s.low_freq_factor);
          f = (1.0 - smooth) * f / s.factor + smooth * f;
        }
      }
      break;
    }
    case RopeScaling::Type::kYarn: {
      // transformers' _compute_yarn_parameters: frequencies that rotate more than
      // beta_fast times over the original context are kept, those under beta_slow are
      // divided by factor, and a linear ramp over the dimensions between blends the two.
      const double dim = c.head_dim;
      const double base = c.rope_theta;
      auto correction_dim = [&](double rotations) {
        return dim *
               std::log(s.original_max_position_embeddings / (rotations * 2 * std::numbers::pi)) /
               (2 * std::log(base));
      };
      double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
      if (s.truncate) {
        low = std::floor(low);
        high = std::ceil(high);
      }
      low = std::max(low, 0.0);
      high = std::min(high, dim - 1);
      if (low == high) high += 0.001;  // No division by zero.
      for (int i = 0; i < half; ++i) {
        const double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
        inv[i] = inv[i] / s.factor * ramp + inv[i] * (1 - ramp);
      }
      break;
    }
  }
  // GGUF's rope_freqs.weight (llama.cpp's form of Llama 3's scaling).
  if (!s.frequency_factors.empty()) {
    for (int i = 0; i < half; ++i) inv[i] /= s.frequency_factors[i];
  }
  return inv;
}

// The tensor names of layer `layer`'s router and expert `e`'s projections.
struct ExpertNames {
  std::string router, gate, up, down;
};
ExpertNames ExpertTensorNames(const ModelConfig& c, int layer, int e) {
  if (c.moe_naming == MoeNaming::kMixtral) {
    const std::string expert = absl::StrCat("block_sparse_moe.experts.", e, ".");
    return {LayerName(layer, "block_sparse_moe.gate"), LayerName(layer, (expert + "w1").c_str()),
            LayerName(layer, (expert + "w3").c_str()), LayerName(layer, (expert + "w2").c_str())};
  }
  const std::string expert = absl::StrCat("mlp.experts.", e, ".");
  return {LayerName(layer, "mlp.gate"), LayerName(layer, (expert + "gate_proj").c_str()),
          LayerName(layer, (expert + "up_proj").c_str()),
          LayerName(layer, (expert + "down_proj").c_str())};
}

// The kernels' block type of ggml type `type`, where they have one.
std::optional<kernels::QuantBlockType> QuantBlockTypeOf(GgmlType type) {
  switch (type) {
    case GgmlType::kQ8_0:
      return kernels::QuantBlockType::kQ8_0;
    case GgmlType::kQ4_0:
      return kernels::QuantBlockType::kQ4_0;
    case GgmlType::kQ4_1:
      return kernels::QuantBlockType::kQ4_1;
    case GgmlType::kQ4_K:
      return kernels::QuantBlockType::kQ4_K;
    case GgmlType::kQ5_K:
      return kernels::QuantBlockType::kQ5_K;
    case GgmlType::kQ6_K:
      return kernels::QuantBlockType::kQ6_K;
    default:
      return std::nullopt;
  }
}

// A Hugging Face directory; a GPTQ/AWQ layer's weight comes in the blocks it maps to.
class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(std::unique_ptr<Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  bool Contains(const std::string& name) const override { return ckpt_->Contains(name); }
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    return ckpt_->ReadF32(name, shape, out);
  }
  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& shape, int dim,
                            int64_t begin, int64_t end, float* out) const override {
    return ckpt_->ReadF32Slice(name, shape, dim, begin, end, out);
  }
  absl::Status ReadQuantizedRows(const std::string& name, const std::vector<int64_t>& shape,
                                 int64_t row_begin, int64_t row_end, int64_t col_begin,
                                 int64_t col_end, kernels::QuantBlockType* type,
                                 std::vector<std::byte>* out) const override {
    absl::StatusOr<GgmlType> ggml = ckpt_->QuantizedTypeOf(name);
    if (!ggml.ok()) return absl::UnimplementedError(absl::StrCat(name, " is not quantized"));
    const kernels::QuantBlockType quant = *QuantBlockTypeOf(*ggml);
    const int64_t block = kernels::QuantBlockElements(quant);
    if (col_begin % block != 0 || col_end % block != 0) {
      return absl::UnimplementedError(absl::StrCat("columns [", col_begin, ", ", col_end, ") of ",
                                                   name, " are not whole ", TraitsOf(*ggml).name,
                                                   " blocks"));
    }
    *type = quant;
    return ckpt_->ReadBlocks(name, shape, row_begin, row_end, col_begin, col_end, out);
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
};

class GgufSource final : public WeightSource {
 public:
  explicit GgufSource(std::unique_ptr<GgufWeights> gguf) : gguf_(std::move(gguf)) {}
  bool Contains(const std::string& name) const override { return gguf_->Contains(name); }
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    return gguf_->ReadF32(name, shape, out);
  }
  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& shape, int dim,
                            int64_t begin, int64_t end, float* out) const override {
    return gguf_->ReadF32Slice(name, shape, dim, begin, end, out);
  }
  absl::Status ReadQuantizedRows(const std::string& name, const std::vector<int64_t>& shape,
                                 int64_t row_begin, int64_t row_end, int64_t col_begin,
                                 int64_t col_end, kernels::QuantBlockType* type,
                                 std::vector<std::byte>* out) const override {
    ASSIGN_OR_RETURN(const GgmlType ggml, gguf_->TypeOf(name));
    const std::optional<kernels::QuantBlockType> quant = QuantBlockTypeOf(ggml);
    if (!quant) {
      return absl::UnimplementedError(
          absl::StrCat(name, " is ", TraitsOf(ggml).name, ", not a block type the kernels take"));
    }
    const int64_t block = kernels::QuantBlockElements(*quant);
    if (col_begin % block != 0 || col_end % block != 0) {
      return absl::UnimplementedError(absl::StrCat("columns [", col_begin, ", ", col_end, ") of ",
                                                   name, " are not whole ", TraitsOf(ggml).name,
                                                   " blocks"));
    }
    *type = *quant;
    return gguf_->ReadBlocks(name, shape, row_begin, row_end, col_begin, col_end, out);
  }

 private:
  std::unique_ptr<GgufWeights> gguf_;
};

// Tensor parallelism splits heads, the MLP and every expert evenly; the vocabulary is
// padded instead.
absl::Status CheckShardable(const ModelConfig& c, int world) {
  for (const auto& [what, value] :
       {std::pair<const char*, int>{"num_attention_heads", c.num_attention_heads},
        {"num_key_value_heads", c.num_kv_heads},
        {"intermediate_size", c.intermediate_size},
        {"moe_intermediate_size", c.HasExperts() ? c.moe_intermediate_size : 0}}) {
    if (value % world != 0) {
      return absl::InvalidArgumentError(absl::StrCat("tensor parallelism over ", world,
                                                     " ranks needs ", what, " divisible by ", world,
                                                     ", but the model has ", value));
    }
  }
  return absl::OkStatus();
}

// A GGUF file rather than a Hugging Face checkpoint directory.
bool IsGgufPath(const std::string& path) { return absl::EndsWith(path, ".gguf"); }

}  // namespace

void ForwardBatch::Clear() {
  token_ids.clear();
  token_seq.clear();
  token_pos.clear();
  slot_mapping.clear();
  num_seqs = 0;
  max_blocks_per_seq = 0;
  block_tables.clear();
  logit_rows.clear();
}

absl::StatusOr<ModelConfig> LoadCheckpointConfig(const std::string& path) {
  if (!IsGgufPath(path)) return LoadModelConfig(path);
  ASSIGN_OR_RETURN(std::unique_ptr<GgufWeights> gguf, GgufWeights::Open(path));
  return gguf->config();
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             kernels::Backend* backend,
                                                             Communicator* comm) {
  if (IsGgufPath(model_dir)) {
    ASSIGN_OR_RETURN(std::unique_ptr<GgufWeights> gguf, GgufWeights::Open(model_dir));
    const ModelConfig config = gguf->config();
    return Create(config, GgufSource(std::move(gguf)), backend, comm);
  }
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt,
                   Checkpoint::Open(model_dir, config.quantization));
  return Create(config, CheckpointSource(std::move(ckpt)), backend, comm);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                               const WeightSource& weights,
                                                               kernels::Backend* backend,
                                                               Communicator* comm) {
  RETURN_IF_ERROR(CheckShardable(config, comm == nullptr ? 1 : comm->world_size()));
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, backend, comm));
  RETURN_IF_ERROR(model->LoadWeights(weights));
  RETURN_IF_ERROR(model->BuildRopeTable());
  return model;
}

LlamaModel::LlamaModel(ModelConfig config, kernels::Backend* backend, Communicator* comm)
    : config_(std::move(config)),
      backend_(backend),
      own_comm_(comm == nullptr ? MakeSingleRankCommunicator() : nullptr),
      comm_(comm == nullptr ? own_comm_.get() : comm) {
  const int world = comm_->world_size();
  num_heads_ = config_.num_attention_heads / world;
  num_kv_heads_ = config_.num_kv_heads / world;
  ffn_ = config_.intermediate_size / world;
  expert_ffn_ = config_.moe_intermediate_size / world;
  vocab_shard_ = (config_.vocab_size + world - 1) / world;
  vocab_begin_ = comm_->rank() * vocab_shard_;
}

LlamaModel::~LlamaModel() = default;

absl::Status LlamaModel::LoadWeights(const WeightSource& weights) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, ffn = c.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;
  // This rank's rows of q, k, v and gate/up, columns of o and down.
  const int rank = comm_->rank();
  const int64_t q_local = static_cast<int64_t>(num_heads_) * c.head_dim;
  const int64_t kv_local = static_cast<int64_t>(num_kv_heads_) * c.head_dim;
  const int64_t ffn_local = ffn_;

  std::vector<float> host;
  // Uploads `values` to the backend, as float32 or in the compute dtype.
  auto upload = [&](const std::vector<float>& values, bool keep_f32,
                    BackendBuffer* out) -> absl::Status {
    ASSIGN_OR_RETURN(void* ptr, keep_f32 ? backend_->UploadF32(values.data(), values.size())
                                         : backend_->UploadCompute(values.data(), values.size()));
    *out = BackendBuffer(ptr, kernels::BackendDeleter{backend_});
    weight_bytes_ += values.size() * (keep_f32 ? sizeof(float) : backend_->activation_bytes());
    return absl::OkStatus();
  };
  auto upload_norm = [&](const std::string& name, BackendBuffer* out,
                         int64_t size) -> absl::Status {
    host.resize(size);
    RETURN_IF_ERROR(weights.ReadF32(name, {size}, host.data()));
    return upload(host, true, out);
  };
  // Reads rows [begin, end) of `name` (shape {rows} or {rows, cols}) into `out`; rows
  // past the tensor's end (vocabulary padding) are left as they are.
  auto read_rows = [&](const std::string& name, std::vector<int64_t> shape, int64_t begin,
                       int64_t end, float* out) -> absl::Status {
    end = std::min(end, shape[0]);
    if (end <= begin) return absl::OkStatus();
    return weights.ReadF32Slice(name, shape, 0, begin, end, out);
  };
  std::vector<float> bias;
  auto finish = [&](int64_t out, int64_t in,
                    bool with_bias) -> absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> {
    ASSIGN_OR_RETURN(auto weight,
                     backend_->PackLinear(host.data(), static_cast<int>(out), static_cast<int>(in),
                                          with_bias ? bias.data() : nullptr));
    weight_bytes_ += weight->size_bytes();
    return weight;
  };
  // Rows [begin, end) of a checkpoint matrix [rows, in] (and of its bias).
  struct RowSlice {
    std::string name;
    int64_t rows, begin, end;
  };
  // The weight of `parts` (each rows [begin, end) and input columns [col_begin, col_end)
  // of the matrix `<name>.weight` [rows, in], rows past its end zero) kept in its GGUF
  // blocks, with `bias` (null or one per output); nullptr where the source or the backend
  // will not (UNIMPLEMENTED from either), so the caller packs floats instead.
  std::vector<std::vector<std::byte>> block_bytes;
  auto pack_quantized =
      [&](const std::vector<RowSlice>& parts, int64_t in, int64_t col_begin, int64_t col_end,
          const float* bias_values) -> absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> {
    std::vector<kernels::QuantizedRows> rows;
    rows.reserve(parts.size());
    block_bytes.assign(parts.size(), {});
    for (size_t i = 0; i < parts.size(); ++i) {
      const RowSlice& p = parts[i];
      kernels::QuantBlockType type{};
      const int64_t end = std::min(p.end, p.rows);
      const absl::Status read =
          weights.ReadQuantizedRows(p.name + ".weight", {p.rows, in}, p.begin, end, col_begin,
                                    col_end, &type, &block_bytes[i]);
      if (absl::IsUnimplemented(read)) return nullptr;
      RETURN_IF_ERROR(read);
      // Rows past the tensor (vocabulary padding) as zero blocks: zero scales, zero weights.
      const size_t row_bytes = kernels::QuantRowBytes(type, static_cast<int>(col_end - col_begin));
      block_bytes[i].resize(block_bytes[i].size() + (p.end - end) * row_bytes, std::byte{0});
      rows.push_back({type, static_cast<int>(p.end - p.begin), block_bytes[i].data()});
    }
    absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> weight =
        backend_->PackLinearQuantized(rows, static_cast<int>(col_end - col_begin), bias_values);
    if (absl::IsUnimplemented(weight.status())) return nullptr;
    if (weight.ok()) weight_bytes_ += (*weight)->size_bytes();
    return weight;
  };
  // A column-parallel layer: row slices of matrices with input width `in`, stacked along
  // the output dimension, with their biases (absent ones are zeros) when `with_bias`.
  auto pack_rows = [&](const std::vector<RowSlice>& parts, int64_t in,
                       bool with_bias) -> absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> {
    int64_t out = 0;
    for (const RowSlice& p : parts) out += p.end - p.begin;
    bias.assign(with_bias ? out : 0, 0.0f);
    int64_t row = 0;
    for (const RowSlice& p : parts) {
      if (with_bias) {
        RETURN_IF_ERROR(read_rows(p.name + ".bias", {p.rows}, p.begin, p.end, bias.data() + row));
      }
      row += p.end - p.begin;
    }
    ASSIGN_OR_RETURN(std::unique_ptr<kernels::LinearWeight> quantized,
                     pack_quantized(parts, in, 0, in, with_bias ? bias.data() : nullptr));
    if (quantized != nullptr) return quantized;
    host.assign(out * in, 0.0f);
    row = 0;
    for (const RowSlice& p : parts) {
      RETURN_IF_ERROR(
          read_rows(p.name + ".weight", {p.rows, in}, p.begin, p.end, host.data() + row * in));
      row += p.end - p.begin;
    }
    return finish(out, in, with_bias);
  };
  // A row-parallel layer: input columns [begin, end) of matrix `name` [out, in], with its
  // whole bias when `with_bias` (one rank adds it, before the all-reduce).
  auto pack_columns =
      [&](const std::string& name, int64_t out, int64_t in, int64_t begin, int64_t end,
          bool with_bias) -> absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> {
    bias.resize(with_bias ? out : 0);
    if (with_bias) RETURN_IF_ERROR(weights.ReadF32(name + ".bias", {out}, bias.data()));
    ASSIGN_OR_RETURN(
        std::unique_ptr<kernels::LinearWeight> quantized,
        pack_quantized({{name, out, 0, out}}, in, begin, end, with_bias ? bias.data() : nullptr));
    if (quantized != nullptr) return quantized;
    host.resize(out * (end - begin));
    RETURN_IF_ERROR(weights.ReadF32Slice(name + ".weight", {out, in}, 1, begin, end, host.data()));
    return finish(out, end - begin, with_bias);
  };

  // A sparse layer: the whole router on every rank, this rank's slice of every expert.
  auto load_experts = [&](int i, Layer* l) -> absl::Status {
    const int64_t experts = c.num_experts, expert_ffn = c.moe_intermediate_size;
    const std::string router = ExpertTensorNames(c, i, 0).router + ".weight";
    host.resize(experts * hidden);
    RETURN_IF_ERROR(weights.ReadF32(router, {experts, hidden}, host.data()));
    ASSIGN_OR_RETURN(l->router,
                     backend_->PackLinearFullPrecision(host.data(), static_cast<int>(experts),
                                                       static_cast<int>(hidden), nullptr));
    weight_bytes_ += l->router->size_bytes();
    const int64_t begin = rank * static_cast<int64_t>(expert_ffn_);
    const int64_t end = begin + expert_ffn_;
    for (int e = 0; e < experts; ++e) {
      const ExpertNames names = ExpertTensorNames(c, i, e);
      ASSIGN_OR_RETURN(
          l->expert_gate_up.emplace_back(),
          pack_rows({{names.gate, expert_ffn, begin, end}, {names.up, expert_ffn, begin, end}},
                    hidden, false));
      ASSIGN_OR_RETURN(l->expert_down.emplace_back(),
                       pack_columns(names.down, hidden, expert_ffn, begin, end, false));
      l->expert_gate_up_ptrs.push_back(l->expert_gate_up.back().get());
      l->expert_down_ptrs.push_back(l->expert_down.back().get());
    }
    return absl::OkStatus();
  };

  host.assign((vocab_shard_ + 1) * hidden, 0.0f);
  RETURN_IF_ERROR(read_rows("model.embed_tokens.weight", {vocab, hidden}, vocab_begin_,
                            vocab_begin_ + vocab_shard_, host.data()));
  RETURN_IF_ERROR(upload(host, false, &embedding_));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    Layer& l = layers_[i];
    RETURN_IF_ERROR(upload_norm(LayerName(i, "input_layernorm.weight"), &l.input_norm, hidden));
    RETURN_IF_ERROR(upload_norm(LayerName(i, "post_attention_layernorm.weight"),
                                &l.post_attention_norm, hidden));
    if (c.qk_norm) {
      RETURN_IF_ERROR(upload_norm(LayerName(i, "self_attn.q_norm.weight"), &l.q_norm, c.head_dim));
      RETURN_IF_ERROR(upload_norm(LayerName(i, "self_attn.k_norm.weight"), &l.k_norm, c.head_dim));
    }
    ASSIGN_OR_RETURN(
        l.qkv,
        pack_rows(
            {{LayerName(i, "self_attn.q_proj"), q_dim, rank * q_local, (rank + 1) * q_local},
             {LayerName(i, "self_attn.k_proj"), kv_dim, rank * kv_local, (rank + 1) * kv_local},
             {LayerName(i, "self_attn.v_proj"), kv_dim, rank * kv_local, (rank + 1) * kv_local}},
            hidden, c.qkv_bias));
    ASSIGN_OR_RETURN(l.o,
                     pack_columns(LayerName(i, "self_attn.o_proj"), hidden, q_dim, rank * q_local,
                                  (rank + 1) * q_local, c.o_bias && rank == 0));
    if (c.IsSparseLayer(i)) {
      RETURN_IF_ERROR(load_experts(i, &l));
      continue;
    }
    ASSIGN_OR_RETURN(
        l.gate_up,
        pack_rows({{LayerName(i, "mlp.gate_proj"), ffn, rank * ffn_local, (rank + 1) * ffn_local},
                   {LayerName(i, "mlp.up_proj"), ffn, rank * ffn_local, (rank + 1) * ffn_local}},
                  hidden, false));
    ASSIGN_OR_RETURN(l.down, pack_columns(LayerName(i, "mlp.down_proj"), hidden, ffn,
                                          rank * ffn_local, (rank + 1) * ffn_local, false));
  }
  RETURN_IF_ERROR(upload_norm("model.norm.weight", &final_norm_, hidden));
  const bool tied = c.tie_word_embeddings || !weights.Contains("lm_head.weight");
  ASSIGN_OR_RETURN(lm_head_, pack_rows({{tied ? "model.embed_tokens" : "lm_head", vocab,
                                         vocab_begin_, vocab_begin_ + vocab_shard_}},
                                       hidden, false));
  return absl::OkStatus();
}

absl::Status LlamaModel::BuildRopeTable() {
  const int half = config_.head_dim / 2;
  const int positions = config_.max_context_tokens;
  const std::vector<double> inv = InverseFrequencies(config_);
  // YaRN scales cos and sin (so both q and k: the attention logits by its square).
  const double scale = config_.rope_scaling.type == RopeScaling::Type::kYarn
                           ? config_.rope_scaling.attention_factor
                           : 1.0;
  std::vector<float> table(2 * static_cast<size_t>(positions) * half);
  float* sin_part = table.data() + static_cast<size_t>(positions) * half;
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * inv[i];
      table[static_cast<size_t>(p) * half + i] = static_cast<float>(scale * std::cos(angle));
      sin_part[static_cast<size_t>(p) * half + i] = static_cast<float>(scale * std::sin(angle));
    }
  }
  ASSIGN_OR_RETURN(void* ptr, backend_->UploadF32(table.data(), table.size()));
  rope_table_ = BackendBuffer(ptr, kernels::BackendDeleter{backend_});
  weight_bytes_ += table.size() * sizeof(float);
  return absl::OkStatus();
}

absl::Status LlamaModel::Reserve(int num_tokens, int num_logit_rows, int metadata_ints) {
  const ModelConfig& c = config_;
  const size_t e = backend_->activation_bytes();
  auto grow = [&](BackendBuffer* buf, size_t elements) -> absl::Status {
    if (!graphs_.empty()) {  // They hold the pointers about to be freed.
      backend_->DropGraphs();
      graphs_.clear();
    }
    ASSIGN_OR_RETURN(*buf, kernels::AllocateBuffer(backend_, elements * e));
    return absl::OkStatus();
  };
  if (num_tokens > reserved_tokens_) {
    // Grow geometrically so a slowly rising batch does not reallocate every step.
    const size_t n = std::max(num_tokens, 2 * reserved_tokens_);
    const size_t qkv_width = static_cast<size_t>(num_heads_ + 2 * num_kv_heads_) * c.head_dim;
    RETURN_IF_ERROR(grow(&residual_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&normed_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&qkv_, n * qkv_width));
    RETURN_IF_ERROR(grow(&attention_, n * num_heads_ * c.head_dim));
    RETURN_IF_ERROR(grow(&projected_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&gate_up_, n * 2 * ffn_));
    RETURN_IF_ERROR(grow(&mlp_, n * ffn_));
    reserved_tokens_ = static_cast<int>(n);
  }
  if (num_logit_rows > reserved_logit_rows_) {
    const size_t n = std::max(num_logit_rows, 2 * reserved_logit_rows_);
    RETURN_IF_ERROR(grow(&final_rows_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&logits_, n * comm_->world_size() * vocab_shard_));
    reserved_logit_rows_ = static_cast<int>(n);
  }
  if (metadata_ints > reserved_metadata_ints_) {
    const size_t n = std::max(metadata_ints, 2 * reserved_metadata_ints_);
    // Graphs have their own metadata buffer: this one may move under them.
    ASSIGN_OR_RETURN(metadata_, kernels::AllocateBuffer(backend_, n * sizeof(int32_t)));
    reserved_metadata_ints_ = static_cast<int>(n);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, const KvCache& cache, float* logits) {
  ASSIGN_OR_RETURN(const DeviceLogits device, ForwardToDevice(batch, cache));
  if (device.rows == 0) return absl::OkStatus();
  const ModelConfig& c = config_;
  const int rows = device.rows;
  const int world = device.world;
  const size_t slice = static_cast<size_t>(device.layout_rows) * vocab_shard_;
  gathered_.resize(world * slice);
  backend_->CopyActivationsToHost(gathered_.data(), device.data, gathered_.size());
  RETURN_IF_ERROR(backend_->Synchronize());
  // [world, rows, vocab_shard] to [rows, vocab], dropping the last shard's padding.
  for (int r = 0; r < world; ++r) {
    const int begin = r * vocab_shard_;
    const int width = std::min(vocab_shard_, c.vocab_size - begin);
    for (int row = 0; row < rows && width > 0; ++row) {
      std::memcpy(logits + static_cast<size_t>(row) * c.vocab_size + begin,
                  gathered_.data() + r * slice + static_cast<size_t>(row) * vocab_shard_,
                  width * sizeof(float));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceLogits> LlamaModel::ForwardToDevice(const ForwardBatch& batch,
                                                         const KvCache& cache) {
  const ModelConfig& c = config_;
  const int n = batch.num_tokens();
  const int rows = static_cast<int>(batch.logit_rows.size());
  if (GraphEligible(batch, cache)) return ForwardGraph(batch, cache);
  DeviceLogits result;
  result.world = comm_->world_size();
  result.shard = vocab_shard_;
  result.vocab_size = c.vocab_size;
  if (n == 0) return result;
  const int metadata_ints = 4 * n + static_cast<int>(batch.block_tables.size()) + rows;
  RETURN_IF_ERROR(Reserve(n, rows, metadata_ints));

  shard_ids_.resize(n);
  for (int t = 0; t < n; ++t) {
    const int32_t row = batch.token_ids[t] - vocab_begin_;
    shard_ids_[t] = row >= 0 && row < vocab_shard_ ? row : vocab_shard_;
  }

  // Step metadata, copied to the backend in one buffer.
  int32_t* meta = static_cast<int32_t*>(metadata_.get());
  size_t offset = 0;
  auto put = [&](const std::vector<int32_t>& v) {
    const int32_t* dst = meta + offset;
    backend_->CopyToBackend(meta + offset, v.data(), v.size() * sizeof(int32_t));
    offset += v.size();
    return dst;
  };
  const int32_t* ids = put(shard_ids_);
  kernels::AttentionBatch attn;
  attn.num_tokens = n;
  attn.token_seq = put(batch.token_seq);
  attn.token_pos = put(batch.token_pos);
  attn.slot_mapping = put(batch.slot_mapping);
  attn.num_seqs = batch.num_seqs;
  attn.block_tables = put(batch.block_tables);
  attn.max_blocks_per_seq = batch.max_blocks_per_seq;
  attn.block_size = cache.block_size();
  const int32_t* logit_rows = put(batch.logit_rows);
  RETURN_IF_ERROR(Compute(ids, attn, logit_rows, rows, cache));
  // What failed while queueing (a launch, a library call) shows now; a fault of the
  // queued work shows when the caller synchronises.
  RETURN_IF_ERROR(backend_->last_error());
  if (rows == 0) return result;
  result.data = logits_.get();
  result.rows = rows;
  result.layout_rows = rows;
  return result;
}

absl::Status LlamaModel::Compute(const int32_t* ids, const kernels::AttentionBatch& attn,
                                 const int32_t* logit_rows, int rows, const KvCache& cache) {
  const ModelConfig& c = config_;
  const int n = attn.num_tokens;
  kernels::AttentionShape shape;
  shape.num_heads = num_heads_;
  shape.num_kv_heads = num_kv_heads_;
  shape.head_dim = c.head_dim;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const int qkv_width = (num_heads_ + 2 * num_kv_heads_) * c.head_dim;
  const size_t act = backend_->activation_bytes();
  char* qkv = static_cast<char*>(qkv_.get());
  void* k_part = qkv + static_cast<size_t>(num_heads_) * c.head_dim * act;
  void* v_part = qkv + static_cast<size_t>(num_heads_ + num_kv_heads_) * c.head_dim * act;
  const size_t hidden_count = static_cast<size_t>(n) * c.hidden_size;

  kernels::Backend& b = *backend_;
  b.Embedding(embedding_.get(), c.hidden_size, ids, n, residual_.get());
  RETURN_IF_ERROR(comm_->AllReduceSum(residual_.get(), hidden_count));
  for (int i = 0; i < c.num_layers; ++i) {
    const Layer& l = layers_[i];
    if (i == 0) {
      b.RmsNorm(residual_.get(), l.input_norm.get(), n, c.hidden_size, c.rms_norm_eps,
                normed_.get());
    } else {
      b.AddRmsNorm(residual_.get(), projected_.get(), l.input_norm.get(), n, c.hidden_size,
                   c.rms_norm_eps, normed_.get());
    }
    b.Linear(normed_.get(), n, *l.qkv, qkv);
    if (c.qk_norm) {
      b.HeadRmsNorm(qkv, n, qkv_width, num_heads_, c.head_dim, l.q_norm.get(), c.rms_norm_eps);
      b.HeadRmsNorm(k_part, n, qkv_width, num_kv_heads_, c.head_dim, l.k_norm.get(),
                    c.rms_norm_eps);
    }
    b.Rope(qkv, k_part, n, qkv_width, attn.token_pos, rope_table_.get(), c.max_context_tokens,
           shape);
    b.WriteKv(k_part, v_part, n, qkv_width, attn.slot_mapping, shape, cache.layer(i));
    b.PagedAttention(qkv, qkv_width, attn, shape, cache.layer(i), attention_.get());
    b.Linear(attention_.get(), n, *l.o, projected_.get());
    RETURN_IF_ERROR(comm_->AllReduceSum(projected_.get(), hidden_count));
    b.AddRmsNorm(residual_.get(), projected_.get(), l.post_attention_norm.get(), n, c.hidden_size,
                 c.rms_norm_eps, normed_.get());
    if (l.router != nullptr) {
      RETURN_IF_ERROR(MixtureOfExperts(l, n));
    } else {
      b.Linear(normed_.get(), n, *l.gate_up, gate_up_.get());
      b.SiluMul(gate_up_.get(), n, ffn_, mlp_.get());
      b.Linear(mlp_.get(), n, *l.down, projected_.get());
    }
    RETURN_IF_ERROR(comm_->AllReduceSum(projected_.get(), hidden_count));
  }
  if (rows == 0) return absl::OkStatus();
  // Only the rows that sample need the final norm and the (large) LM head.
  b.AddRmsNorm(residual_.get(), projected_.get(), final_norm_.get(), n, c.hidden_size,
               c.rms_norm_eps, normed_.get());
  b.GatherRows(normed_.get(), c.hidden_size, logit_rows, rows, final_rows_.get());
  const size_t slice = static_cast<size_t>(rows) * vocab_shard_;
  b.Linear(final_rows_.get(), rows, *lm_head_,
           static_cast<char*>(logits_.get()) + comm_->rank() * slice * act);
  return comm_->AllGather(logits_.get(), slice);
}

absl::Status LlamaModel::ReserveExperts(int n) {
  if (n <= reserved_expert_tokens_) return absl::OkStatus();
  const ModelConfig& c = config_;
  const size_t tokens = std::max(n, 2 * reserved_expert_tokens_);
  const size_t rows = tokens * c.experts_per_token;
  const size_t e = backend_->activation_bytes();
  ASSIGN_OR_RETURN(expert_in_, kernels::AllocateBuffer(backend_, rows * c.hidden_size * e));
  ASSIGN_OR_RETURN(expert_gate_up_, kernels::AllocateBuffer(backend_, rows * 2 * expert_ffn_ * e));
  ASSIGN_OR_RETURN(expert_act_, kernels::AllocateBuffer(backend_, rows * expert_ffn_ * e));
  ASSIGN_OR_RETURN(expert_out_, kernels::AllocateBuffer(backend_, rows * c.hidden_size * e));
  ASSIGN_OR_RETURN(router_logits_, kernels::AllocateBuffer(backend_, tokens * c.num_experts * e));
  ASSIGN_OR_RETURN(routing_, kernels::AllocateBuffer(backend_, 3 * rows * sizeof(int32_t)));
  reserved_expert_tokens_ = static_cast<int>(tokens);
  return absl::OkStatus();
}

absl::Status LlamaModel::MixtureOfExperts(const Layer& l, int n) {
  const ModelConfig& c = config_;
  const int experts = c.num_experts, k = c.experts_per_token;
  const size_t rows = static_cast<size_t>(n) * k;
  kernels::Backend& b = *backend_;
  RETURN_IF_ERROR(ReserveExperts(n));
  b.Linear(normed_.get(), n, *l.router, router_logits_.get());
  host_router_logits_.resize(static_cast<size_t>(n) * experts);
  b.CopyActivationsToHost(host_router_logits_.data(), router_logits_.get(),
                          host_router_logits_.size());
  RETURN_IF_ERROR(b.Synchronize());

  // Each token's experts: softmax in float, the k most probable (ties to the lower
  // index), renormalised if asked; then listed in ascending expert order, the order
  // their outputs are summed in.
  host_routing_.resize(2 * rows);
  host_expert_weights_.resize(rows);
  int32_t* gather = host_routing_.data();
  int32_t* sources = gather + rows;
  float* weights = host_expert_weights_.data();
  std::vector<int>& order = routing_order_;
  std::vector<float>& probs = routing_probs_;
  order.resize(experts);
  probs.resize(experts);
  expert_offsets_.assign(experts + 1, 0);
  for (int t = 0; t < n; ++t) {
    const float* logits = host_router_logits_.data() + static_cast<size_t>(t) * experts;
    const float max = *std::max_element(logits, logits + experts);
    float sum = 0;
    for (int e = 0; e < experts; ++e) sum += probs[e] = std::exp(logits[e] - max);
    for (int e = 0; e < experts; ++e) probs[e] /= sum;
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int a, int b) {
      return probs[a] > probs[b] || (probs[a] == probs[b] && a < b);
    });
    float top_sum = 0;
    for (int j = 0; j < k; ++j) top_sum += probs[order[j]];
    std::sort(order.begin(), order.begin() + k);
    for (int j = 0; j < k; ++j) {
      const int e = order[j];
      sources[static_cast<size_t>(t) * k + j] = e;  // The expert, until its slot is known.
      weights[static_cast<size_t>(t) * k + j] = c.norm_topk_prob ? probs[e] / top_sum : probs[e];
      ++expert_offsets_[e + 1];
    }
  }
  // The (token, expert) pairs grouped by expert, tokens in order within each group.
  for (int e = 0; e < experts; ++e) expert_offsets_[e + 1] += expert_offsets_[e];
  expert_fill_.assign(expert_offsets_.begin(), expert_offsets_.end() - 1);
  for (size_t i = 0; i < rows; ++i) {
    const int slot = expert_fill_[sources[i]]++;
    gather[slot] = static_cast<int32_t>(i / k);
    sources[i] = slot;
  }
  int32_t* device = static_cast<int32_t*>(routing_.get());
  b.CopyToBackend(device, host_routing_.data(), host_routing_.size() * sizeof(int32_t));
  float* device_weights = reinterpret_cast<float*>(device + 2 * rows);
  b.CopyToBackend(device_weights, weights, rows * sizeof(float));

  const int m = static_cast<int>(rows);
  b.GatherRows(normed_.get(), c.hidden_size, device, m, expert_in_.get());
  b.GroupedLinear(expert_in_.get(), l.expert_gate_up_ptrs.data(), expert_offsets_.data(), experts,
                  expert_gate_up_.get());
  b.SiluMul(expert_gate_up_.get(), m, expert_ffn_, expert_act_.get());
  b.GroupedLinear(expert_act_.get(), l.expert_down_ptrs.data(), expert_offsets_.data(), experts,
                  expert_out_.get());
  b.WeightedRowSum(expert_out_.get(), c.hidden_size, device + rows, device_weights, n, k,
                   projected_.get());
  return absl::OkStatus();
}

absl::Status LlamaModel::EnableDecodeGraphs(int max_batch) {
  if (!backend_->supports_graphs()) {
    return absl::UnimplementedError(absl::StrCat(backend_->name(), " has no graphs"));
  }
  if (max_batch < 1) return absl::InvalidArgumentError("graphs need a batch of at least 1");
  graph_max_batch_ = static_cast<int>(std::bit_ceil(static_cast<unsigned>(max_batch)));
  return absl::OkStatus();
}

bool LlamaModel::GraphEligible(const ForwardBatch& batch, const KvCache& cache) const {
  const int n = batch.num_tokens();
  // An MoE layer routes on the host, in the middle of the pass.
  if (graph_max_batch_ == 0 || config_.HasExperts() || n == 0 || n > graph_max_batch_ ||
      batch.num_seqs != n || static_cast<int>(batch.logit_rows.size()) != n) {
    return false;
  }
  const int max_width = (config_.max_context_tokens + cache.block_size() - 1) / cache.block_size();
  if (batch.max_blocks_per_seq > max_width) return false;
  for (int t = 0; t < n; ++t) {
    if (batch.token_seq[t] != t || batch.logit_rows[t] != t) return false;
  }
  return true;
}

absl::StatusOr<DeviceLogits> LlamaModel::ForwardGraph(const ForwardBatch& batch,
                                                      const KvCache& cache) {
  const int n = batch.num_tokens();
  const int padded = static_cast<int>(std::bit_ceil(static_cast<unsigned>(n)));
  const int max_width = (config_.max_context_tokens + cache.block_size() - 1) / cache.block_size();
  const int width = std::min(max_width, static_cast<int>(std::bit_ceil(static_cast<unsigned>(
                                            std::max(batch.max_blocks_per_seq, 1)))));
  if (graph_cache_ != &cache) {  // Captured against another cache's layers.
    backend_->DropGraphs();
    graphs_.clear();
    graph_cache_ = &cache;
  }
  // Buffers at their largest first, so that no capture sees a pointer that moves later.
  RETURN_IF_ERROR(Reserve(graph_max_batch_, graph_max_batch_, 0));
  const int max_ints = graph_max_batch_ * (5 + max_width);
  if (graph_metadata_ints_ < max_ints) {
    backend_->DropGraphs();
    graphs_.clear();
    ASSIGN_OR_RETURN(graph_metadata_,
                     kernels::AllocateBuffer(backend_, max_ints * sizeof(int32_t)));
    graph_metadata_ints_ = max_ints;
  }

  // Fixed layout for (padded, width): ids, seqs, positions, slots, tables, logit rows.
  // Padding tokens embed the zero row, sit at position 0 of an all-zero block table
  // (reading, never writing: slot -1 skips the KV write) and their rows are ignored.
  graph_host_.assign(static_cast<size_t>(padded) * (5 + width), 0);
  int32_t* ids = graph_host_.data();
  int32_t* seqs = ids + padded;
  int32_t* pos = seqs + padded;
  int32_t* slots = pos + padded;
  int32_t* tables = slots + padded;
  int32_t* rows = tables + static_cast<size_t>(padded) * width;
  for (int t = 0; t < padded; ++t) {
    seqs[t] = t;
    rows[t] = t;
    if (t >= n) {
      ids[t] = vocab_shard_;
      slots[t] = -1;
      continue;
    }
    const int32_t row = batch.token_ids[t] - vocab_begin_;
    ids[t] = row >= 0 && row < vocab_shard_ ? row : vocab_shard_;
    pos[t] = batch.token_pos[t];
    slots[t] = batch.slot_mapping[t];
    std::copy_n(batch.block_tables.begin() + static_cast<size_t>(t) * batch.max_blocks_per_seq,
                batch.max_blocks_per_seq, tables + static_cast<size_t>(t) * width);
  }
  int32_t* device = static_cast<int32_t*>(graph_metadata_.get());
  backend_->CopyToBackend(device, graph_host_.data(), graph_host_.size() * sizeof(int32_t));

  kernels::AttentionBatch attn;
  attn.num_tokens = padded;
  attn.token_seq = device + padded;
  attn.token_pos = device + 2 * padded;
  attn.slot_mapping = device + 3 * padded;
  attn.num_seqs = padded;
  attn.block_tables = device + 4 * padded;
  attn.max_blocks_per_seq = width;
  attn.block_size = cache.block_size();
  const int32_t* logit_rows = attn.block_tables + static_cast<size_t>(padded) * width;

  auto [it, inserted] = graphs_.try_emplace({padded, width}, -1);
  if (inserted) {
    RETURN_IF_ERROR(backend_->BeginCapture());
    const absl::Status computed = Compute(device, attn, logit_rows, padded, cache);
    absl::StatusOr<int> graph = backend_->EndCapture();
    if (!computed.ok() || !graph.ok()) {
      graphs_.erase(it);
      return computed.ok() ? graph.status() : computed;
    }
    it->second = *graph;
  }
  backend_->Replay(it->second);
  RETURN_IF_ERROR(backend_->last_error());

  DeviceLogits result;
  result.world = comm_->world_size();
  result.shard = vocab_shard_;
  result.vocab_size = config_.vocab_size;
  result.data = logits_.get();
  result.rows = n;
  result.layout_rows = padded;
  return result;
}

}  // namespace conveyor::model
