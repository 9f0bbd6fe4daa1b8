#include "worker/model.h"

#include <cmath>
#include <cstring>
#include <numbers>

#include "absl/strings/str_cat.h"
#include "common/checkpoint.h"
#include "common/status_macros.h"

namespace conveyor::worker {
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
  }
  return inv;
}

class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(std::unique_ptr<Checkpoint> ckpt) : ckpt_(std::move(ckpt)) {}
  bool Contains(const std::string& name) const override { return ckpt_->Contains(name); }
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    return ckpt_->ReadF32(name, shape, out);
  }

 private:
  std::unique_ptr<Checkpoint> ckpt_;
};

class RandomSource final : public WeightSource {
 public:
  explicit RandomSource(uint64_t seed) : seed_(seed) {}
  bool Contains(const std::string& name) const override { return name != "lm_head.weight"; }
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& shape,
                       float* out) const override {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    const bool is_norm = name.find("norm") != std::string::npos;
    const bool is_bias = name.ends_with(".bias");
    // Uniform in [-a, a] has variance a²/3; pick a for variance 1/fan_in.
    const double a = shape.size() == 2 ? std::sqrt(3.0 / shape[1]) : 0.1;
    uint64_t state = seed_ ^ std::hash<std::string>()(name);
    for (int64_t i = 0; i < count; ++i) {
      // splitmix64: cheap and good enough for benchmark weights.
      state += 0x9E3779B97F4A7C15ull;
      uint64_t z = state;
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      const double u = (z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
      out[i] = static_cast<float>(is_norm ? 1.0 + 0.1 * u : (is_bias ? 0.1 * u : a * u));
    }
    return absl::OkStatus();
  }

 private:
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<WeightSource> MakeRandomWeightSource(uint64_t seed) {
  return std::make_unique<RandomSource>(seed);
}

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

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Load(const std::string& model_dir,
                                                             kernels::Backend* backend) {
  ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(model_dir));
  ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(model_dir));
  return Create(config, CheckpointSource(std::move(ckpt)), backend);
}

absl::StatusOr<std::unique_ptr<LlamaModel>> LlamaModel::Create(const ModelConfig& config,
                                                               const WeightSource& weights,
                                                               kernels::Backend* backend) {
  std::unique_ptr<LlamaModel> model(new LlamaModel(config, backend));
  RETURN_IF_ERROR(model->LoadWeights(weights));
  RETURN_IF_ERROR(model->BuildRopeTable());
  return model;
}

LlamaModel::~LlamaModel() = default;

absl::Status LlamaModel::LoadWeights(const WeightSource& weights) {
  const ModelConfig& c = config_;
  const int64_t hidden = c.hidden_size, vocab = c.vocab_size, ffn = c.intermediate_size;
  const int64_t q_dim = static_cast<int64_t>(c.num_attention_heads) * c.head_dim;
  const int64_t kv_dim = static_cast<int64_t>(c.num_kv_heads) * c.head_dim;

  std::vector<float> host;
  // Reads a vector/matrix into backend memory, as float32 or in the compute dtype.
  auto upload = [&](const std::string& name, std::vector<int64_t> shape, bool keep_f32,
                    BackendBuffer* out) -> absl::Status {
    int64_t count = 1;
    for (int64_t d : shape) count *= d;
    host.resize(count);
    RETURN_IF_ERROR(weights.ReadF32(name, shape, host.data()));
    ASSIGN_OR_RETURN(void* ptr, keep_f32 ? backend_->UploadF32(host.data(), count)
                                         : backend_->UploadCompute(host.data(), count));
    *out = BackendBuffer(ptr, kernels::BackendDeleter{backend_});
    weight_bytes_ += count * (keep_f32 ? sizeof(float) : backend_->activation_bytes());
    return absl::OkStatus();
  };
  // Reads matrices with the same input width stacked along the output dimension, with
  // their biases (absent ones are zeros) when `with_bias`, into one packed linear layer.
  std::vector<float> bias;
  auto pack = [&](const std::vector<std::pair<std::string, int64_t>>& parts, int64_t in,
                  bool with_bias) -> absl::StatusOr<std::unique_ptr<kernels::LinearWeight>> {
    int64_t out = 0;
    for (const auto& [name, rows] : parts) out += rows;
    host.resize(out * in);
    bias.assign(with_bias ? out : 0, 0.0f);
    int64_t row = 0;
    for (const auto& [name, rows] : parts) {
      RETURN_IF_ERROR(weights.ReadF32(name + ".weight", {rows, in}, host.data() + row * in));
      if (with_bias) {
        RETURN_IF_ERROR(weights.ReadF32(name + ".bias", {rows}, bias.data() + row));
      }
      row += rows;
    }
    ASSIGN_OR_RETURN(auto weight,
                     backend_->PackLinear(host.data(), static_cast<int>(out),
                                          static_cast<int>(in),
                                          with_bias ? bias.data() : nullptr));
    weight_bytes_ += weight->size_bytes();
    return weight;
  };

  RETURN_IF_ERROR(upload("model.embed_tokens.weight", {vocab, hidden}, false, &embedding_));
  layers_.resize(c.num_layers);
  for (int i = 0; i < c.num_layers; ++i) {
    Layer& l = layers_[i];
    RETURN_IF_ERROR(upload(LayerName(i, "input_layernorm.weight"), {hidden}, true, &l.input_norm));
    RETURN_IF_ERROR(upload(LayerName(i, "post_attention_layernorm.weight"), {hidden},
                           true, &l.post_attention_norm));
    ASSIGN_OR_RETURN(l.qkv, pack({{LayerName(i, "self_attn.q_proj"), q_dim},
                                  {LayerName(i, "self_attn.k_proj"), kv_dim},
                                  {LayerName(i, "self_attn.v_proj"), kv_dim}},
                                 hidden, c.qkv_bias));
    ASSIGN_OR_RETURN(l.o, pack({{LayerName(i, "self_attn.o_proj"), hidden}}, q_dim, c.o_bias));
    ASSIGN_OR_RETURN(l.gate_up, pack({{LayerName(i, "mlp.gate_proj"), ffn},
                                      {LayerName(i, "mlp.up_proj"), ffn}},
                                     hidden, false));
    ASSIGN_OR_RETURN(l.down, pack({{LayerName(i, "mlp.down_proj"), hidden}}, ffn, false));
  }
  RETURN_IF_ERROR(upload("model.norm.weight", {hidden}, true, &final_norm_));
  const bool tied = c.tie_word_embeddings || !weights.Contains("lm_head.weight");
  ASSIGN_OR_RETURN(lm_head_,
                   pack({{tied ? "model.embed_tokens" : "lm_head", vocab}}, hidden, false));
  return absl::OkStatus();
}

absl::Status LlamaModel::BuildRopeTable() {
  const int half = config_.head_dim / 2;
  const int positions = config_.max_context_tokens;
  const std::vector<double> inv = InverseFrequencies(config_);
  std::vector<float> table(2 * static_cast<size_t>(positions) * half);
  float* sin_part = table.data() + static_cast<size_t>(positions) * half;
  for (int p = 0; p < positions; ++p) {
    for (int i = 0; i < half; ++i) {
      const double angle = p * inv[i];
      table[static_cast<size_t>(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_part[static_cast<size_t>(p) * half + i] = static_cast<float>(std::sin(angle));
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
    ASSIGN_OR_RETURN(*buf, kernels::AllocateBuffer(backend_, elements * e));
    return absl::OkStatus();
  };
  if (num_tokens > reserved_tokens_) {
    // Grow geometrically so a slowly rising batch does not reallocate every step.
    const size_t n = std::max(num_tokens, 2 * reserved_tokens_);
    const size_t qkv_width = static_cast<size_t>(c.num_attention_heads + 2 * c.num_kv_heads) *
                             c.head_dim;
    RETURN_IF_ERROR(grow(&residual_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&normed_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&qkv_, n * qkv_width));
    RETURN_IF_ERROR(grow(&attention_, n * c.num_attention_heads * c.head_dim));
    RETURN_IF_ERROR(grow(&projected_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&gate_up_, n * 2 * c.intermediate_size));
    RETURN_IF_ERROR(grow(&mlp_, n * c.intermediate_size));
    reserved_tokens_ = static_cast<int>(n);
  }
  if (num_logit_rows > reserved_logit_rows_) {
    const size_t n = std::max(num_logit_rows, 2 * reserved_logit_rows_);
    RETURN_IF_ERROR(grow(&final_rows_, n * c.hidden_size));
    RETURN_IF_ERROR(grow(&logits_, n * c.vocab_size));
    reserved_logit_rows_ = static_cast<int>(n);
  }
  if (metadata_ints > reserved_metadata_ints_) {
    const size_t n = std::max(metadata_ints, 2 * reserved_metadata_ints_);
    ASSIGN_OR_RETURN(metadata_, kernels::AllocateBuffer(backend_, n * sizeof(int32_t)));
    reserved_metadata_ints_ = static_cast<int>(n);
  }
  return absl::OkStatus();
}

absl::Status LlamaModel::Forward(const ForwardBatch& batch, const KvCache& cache,
                                 float* logits) {
  const ModelConfig& c = config_;
  const int n = batch.num_tokens();
  const int rows = static_cast<int>(batch.logit_rows.size());
  if (n == 0) return absl::OkStatus();
  const int metadata_ints = 4 * n + static_cast<int>(batch.block_tables.size()) + rows;
  RETURN_IF_ERROR(Reserve(n, rows, metadata_ints));

  // Step metadata, copied to the backend in one buffer.
  int32_t* meta = static_cast<int32_t*>(metadata_.get());
  size_t offset = 0;
  auto put = [&](const std::vector<int32_t>& v) {
    const int32_t* dst = meta + offset;
    backend_->CopyToBackend(meta + offset, v.data(), v.size() * sizeof(int32_t));
    offset += v.size();
    return dst;
  };
  const int32_t* ids = put(batch.token_ids);
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

  kernels::AttentionShape shape;
  shape.num_heads = c.num_attention_heads;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  shape.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(c.head_dim)));
  const int qkv_width = (c.num_attention_heads + 2 * c.num_kv_heads) * c.head_dim;
  const size_t act = backend_->activation_bytes();
  char* qkv = static_cast<char*>(qkv_.get());
  void* k_part = qkv + static_cast<size_t>(c.num_attention_heads) * c.head_dim * act;
  void* v_part = qkv + static_cast<size_t>(c.num_attention_heads + c.num_kv_heads) *
                           c.head_dim * act;

  kernels::Backend& b = *backend_;
  b.Embedding(embedding_.get(), c.hidden_size, ids, n, residual_.get());
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
    b.Rope(qkv, k_part, n, qkv_width, attn.token_pos, rope_table_.get(), c.max_context_tokens,
           shape);
    b.WriteKv(k_part, v_part, n, qkv_width, attn.slot_mapping, shape, cache.layer(i));
    b.PagedAttention(qkv, qkv_width, attn, shape, cache.layer(i), attention_.get());
    b.Linear(attention_.get(), n, *l.o, projected_.get());
    b.AddRmsNorm(residual_.get(), projected_.get(), l.post_attention_norm.get(), n,
                 c.hidden_size, c.rms_norm_eps, normed_.get());
    b.Linear(normed_.get(), n, *l.gate_up, gate_up_.get());
    b.SiluMul(gate_up_.get(), n, c.intermediate_size, mlp_.get());
    b.Linear(mlp_.get(), n, *l.down, projected_.get());
  }
  if (rows == 0) return absl::OkStatus();
  // Only the rows that sample need the final norm and the (large) LM head.
  b.AddRmsNorm(residual_.get(), projected_.get(), final_norm_.get(), n, c.hidden_size,
               c.rms_norm_eps, normed_.get());
  b.GatherRows(normed_.get(), c.hidden_size, logit_rows, rows, final_rows_.get());
  b.Linear(final_rows_.get(), rows, *lm_head_, logits_.get());
  b.CopyActivationsToHost(logits, logits_.get(), static_cast<size_t>(rows) * c.vocab_size);
  b.Synchronize();
  return absl::OkStatus();
}

}  // namespace conveyor::worker
