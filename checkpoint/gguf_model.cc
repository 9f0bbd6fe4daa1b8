#include "checkpoint/gguf_model.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "checkpoint/ggml_types.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// general.architecture values llama.cpp's convert_hf_to_gguf.py writes for the models
// Conveyor runs. Llama, Mistral and Mixtral all convert as "llama" (Mixtral with
// llama.expert_count); Qwen2 as "qwen2", Qwen3 as "qwen3", Qwen3-MoE as "qwen3moe".
constexpr const char* kArchitectures[] = {"llama", "qwen2", "qwen3", "qwen3moe"};

// Typed reads of "<arch>.<suffix>" keys; errors are INVALID_ARGUMENT naming file and key.
class MetadataReader {
 public:
  MetadataReader(const GgufFile& file, std::string arch) : file_(file), arch_(std::move(arch)) {}

  std::string Key(absl::string_view suffix) const { return absl::StrCat(arch_, ".", suffix); }
  bool Has(absl::string_view suffix) const { return file_.FindMetadata(Key(suffix)) != nullptr; }

  // A positive int; `fallback` when absent (nullopt: required).
  absl::Status ReadPositiveInt(absl::string_view suffix, std::optional<int> fallback,
                               int* out) const {
    const std::string key = Key(suffix);
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) {
      if (!fallback) return Error(key, "is required");
      *out = *fallback;
      return absl::OkStatus();
    }
    if (value->AsArray() != nullptr) {
      return Error(key, "is a per-layer array; only one value for all layers is supported");
    }
    const std::optional<int64_t> number = value->AsInt();
    if (!number || *number <= 0 || *number > std::numeric_limits<int>::max()) {
      return Error(key, absl::StrCat("must be a positive integer in int range (is ",
                                     GgufValueTypeName(value->type()), ")"));
    }
    *out = static_cast<int>(*number);
    return absl::OkStatus();
  }

  // A positive finite number; left as is when absent.
  absl::Status ReadPositiveFloat(absl::string_view suffix, bool required, float* out) const {
    const std::string key = Key(suffix);
    const GgufValue* value = file_.FindMetadata(key);
    if (value == nullptr) return required ? Error(key, "is required") : absl::OkStatus();
    const std::optional<double> number = value->AsDouble();
    if (!number || !(*number > 0) || !std::isfinite(static_cast<float>(*number))) {
      return Error(key, "must be a positive finite number");
    }
    *out = static_cast<float>(*number);
    return absl::OkStatus();
  }

  absl::Status Error(absl::string_view key, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(file_.path(), ": key '", key, "' ", problem));
  }

 private:
  const GgufFile& file_;
  std::string arch_;
};

absl::Status ReadRopeScaling(const GgufFile& file, const MetadataReader& reader,
                             ModelConfig* config) {
  if (const GgufTensorInfo* freqs = file.FindTensor("rope_freqs.weight")) {
    // convert_hf_to_gguf writes Llama 3's rope_scaling as per-frequency divisors (and no
    // rope.scaling.type): inverse frequency i is divided by factor i.
    const int64_t half = config->head_dim / 2;
    int64_t count = 1;
    for (int64_t d : freqs->dims) count *= d;
    if (count != half) {
      return absl::InvalidArgumentError(
          absl::StrCat(file.path(), ": tensor 'rope_freqs.weight' has ", count,
                       " elements; RoPE frequency factors need head_dim / 2 = ", half));
    }
    ASSIGN_OR_RETURN(std::vector<float> factors, file.DequantizeTensor(*freqs));
    for (int64_t i = 0; i < half; ++i) {
      if (!std::isfinite(factors[i]) || factors[i] <= 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(file.path(), ": tensor 'rope_freqs.weight' element ", i, " is ",
                         factors[i], "; RoPE frequency factors must be finite and positive"));
      }
    }
    config->rope_scaling.frequency_factors = std::move(factors);
  }
  RopeScaling& scaling = config->rope_scaling;
  std::string type = "none";
  if (const GgufValue* value = file.FindMetadata(reader.Key("rope.scaling.type"))) {
    if (value->AsString() == nullptr) {
      return reader.Error(reader.Key("rope.scaling.type"), "must be a string");
    }
    type = *value->AsString();
  } else if (reader.Has("rope.scale_linear")) {  // Older files.
    type = "linear";
    RETURN_IF_ERROR(reader.ReadPositiveFloat("rope.scale_linear", true, &scaling.factor));
    scaling.type = RopeScaling::Type::kLinear;
    return absl::OkStatus();
  }
  if (type == "none") return absl::OkStatus();
  if (type != "linear" && type != "yarn") {
    return reader.Error(reader.Key("rope.scaling.type"),
                        absl::StrCat("'", type, "' is not supported (none, linear, yarn)"));
  }
  RETURN_IF_ERROR(reader.ReadPositiveFloat("rope.scaling.factor", true, &scaling.factor));
  if (type == "linear") {
    scaling.type = RopeScaling::Type::kLinear;
    return absl::OkStatus();
  }
  scaling.type = RopeScaling::Type::kYarn;
  RETURN_IF_ERROR(reader.ReadPositiveInt("rope.scaling.original_context_length",
                                         config->max_context_tokens,
                                         &scaling.original_max_position_embeddings));
  RETURN_IF_ERROR(
      reader.ReadPositiveFloat("rope.scaling.yarn_beta_fast", false, &scaling.beta_fast));
  RETURN_IF_ERROR(
      reader.ReadPositiveFloat("rope.scaling.yarn_beta_slow", false, &scaling.beta_slow));
  // transformers' default attention factor (what the file's HF config implied unless it
  // named another; GGUF keeps no such key).
  scaling.attention_factor =
      scaling.factor <= 1 ? 1.0f : static_cast<float>(0.1 * std::log(scaling.factor) + 1.0);
  return absl::OkStatus();
}

absl::Status ReadTokenId(const GgufFile& file, const std::string& key, int vocab_size,
                         std::optional<int>* out) {
  const GgufValue* value = file.FindMetadata(key);
  if (value == nullptr) return absl::OkStatus();
  const std::optional<int64_t> id = value->AsInt();
  if (!id || *id < 0 || *id >= vocab_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": key '", key, "' must be a token id in [0, ", vocab_size, ")"));
  }
  *out = static_cast<int>(*id);
  return absl::OkStatus();
}

std::string LayerTensor(int layer, absl::string_view suffix) {
  return absl::StrCat("blk.", layer, ".", suffix);
}

}  // namespace

std::string SupportedGgufArchitectures() { return absl::StrJoin(kArchitectures, ", "); }

std::string WeightDtypeOfGguf(const GgufFile& file) {
  std::map<GgmlType, int> count;
  for (const GgufTensorInfo& t : file.tensors()) {
    if (t.dims.size() >= 2 && absl::StartsWith(t.name, "blk.")) ++count[t.type];
  }
  if (count.empty()) return "";
  const GgmlType most =
      std::max_element(count.begin(), count.end(), [](const auto& a, const auto& b) {
        return a.second < b.second;
      })->first;
  switch (most) {
    case GgmlType::kF32:
      return "float32";
    case GgmlType::kF16:
      return "float16";
    case GgmlType::kBF16:
      return "bfloat16";
    default:
      return TraitsOf(most).name;
  }
}

absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file) {
  absl::StatusOr<std::string> arch = file.GetString("general.architecture");
  if (!arch.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": key 'general.architecture' is missing or not a string"));
  }
  if (absl::c_find_if(kArchitectures, [&](const char* a) { return *arch == a; }) ==
      std::end(kArchitectures)) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": key 'general.architecture': '", *arch,
                     "' is not supported (supported: ", SupportedGgufArchitectures(), ")"));
  }
  const MetadataReader reader(file, *arch);
  ModelConfig config;
  RETURN_IF_ERROR(reader.ReadPositiveInt("block_count", std::nullopt, &config.num_layers));
  RETURN_IF_ERROR(reader.ReadPositiveInt("embedding_length", std::nullopt, &config.hidden_size));
  RETURN_IF_ERROR(
      reader.ReadPositiveInt("context_length", std::nullopt, &config.max_context_tokens));
  RETURN_IF_ERROR(
      reader.ReadPositiveInt("attention.head_count", std::nullopt, &config.num_attention_heads));
  RETURN_IF_ERROR(reader.ReadPositiveInt("attention.head_count_kv", config.num_attention_heads,
                                         &config.num_kv_heads));
  if (config.num_attention_heads % config.num_kv_heads != 0) {
    return reader.Error(reader.Key("attention.head_count_kv"),
                        absl::StrCat(config.num_kv_heads, " does not divide head_count ",
                                     config.num_attention_heads));
  }
  if (reader.Has("attention.key_length")) {
    RETURN_IF_ERROR(reader.ReadPositiveInt("attention.key_length", std::nullopt, &config.head_dim));
    int value_length = config.head_dim;
    RETURN_IF_ERROR(
        reader.ReadPositiveInt("attention.value_length", config.head_dim, &value_length));
    if (value_length != config.head_dim) {
      return reader.Error(reader.Key("attention.value_length"),
                          absl::StrCat(value_length, " differs from key_length ", config.head_dim,
                                       " (not supported)"));
    }
  } else if (config.hidden_size % config.num_attention_heads != 0) {
    return reader.Error(reader.Key("embedding_length"),
                        absl::StrCat(config.hidden_size, " is not a multiple of head_count ",
                                     config.num_attention_heads, " and no key_length is given"));
  } else {
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  if (config.head_dim % 2 != 0) {
    return reader.Error(reader.Key("attention.key_length"),
                        absl::StrCat("head size must be even, is ", config.head_dim));
  }
  int rotary_dims = config.head_dim;
  RETURN_IF_ERROR(reader.ReadPositiveInt("rope.dimension_count", config.head_dim, &rotary_dims));
  if (rotary_dims != config.head_dim) {
    return reader.Error(reader.Key("rope.dimension_count"),
                        absl::StrCat(rotary_dims, " differs from the head size ", config.head_dim,
                                     " (partial RoPE is not supported)"));
  }
  RETURN_IF_ERROR(
      reader.ReadPositiveFloat("attention.layer_norm_rms_epsilon", true, &config.rms_norm_eps));
  RETURN_IF_ERROR(reader.ReadPositiveFloat("rope.freq_base", false, &config.rope_theta));
  RETURN_IF_ERROR(ReadRopeScaling(file, reader, &config));

  // The vocabulary is the embedding's rows; the metadata, where it says, must agree.
  const GgufTensorInfo* embedding = file.FindTensor("token_embd.weight");
  if (embedding == nullptr || embedding->dims.size() != 2 ||
      embedding->dims[0] != config.hidden_size || embedding->dims[1] <= 0 ||
      embedding->dims[1] > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": tensor 'token_embd.weight' is missing or not [vocab, ",
                     config.hidden_size, "]"));
  }
  config.vocab_size = static_cast<int>(embedding->dims[1]);
  if (reader.Has("vocab_size")) {
    int declared = 0;
    RETURN_IF_ERROR(reader.ReadPositiveInt("vocab_size", std::nullopt, &declared));
    if (declared != config.vocab_size) {
      return reader.Error(
          reader.Key("vocab_size"),
          absl::StrCat(declared, " differs from token_embd.weight's ", config.vocab_size, " rows"));
    }
  }

  // What the metadata does not say, the tensors do (as llama.cpp's loader reads them).
  config.torch_dtype = WeightDtypeOfGguf(file);
  config.tie_word_embeddings = file.FindTensor("output.weight") == nullptr;
  config.qkv_bias = file.FindTensor("blk.0.attn_q.bias") != nullptr;
  config.o_bias = file.FindTensor("blk.0.attn_output.bias") != nullptr;
  config.qk_norm = file.FindTensor("blk.0.attn_q_norm.weight") != nullptr;

  int experts = 0;
  RETURN_IF_ERROR(reader.ReadPositiveInt("expert_count", 0, &experts));
  const bool moe = experts > 0;
  if (*arch == "llama") {
    config.model_type = moe ? "mixtral" : "llama";
    config.architecture = moe ? "MixtralForCausalLM" : "LlamaForCausalLM";
  } else if (*arch == "qwen2") {
    config.model_type = "qwen2";
    config.architecture = "Qwen2ForCausalLM";
  } else if (*arch == "qwen3") {
    config.model_type = "qwen3";
    config.architecture = "Qwen3ForCausalLM";
  } else {
    config.model_type = "qwen3_moe";
    config.architecture = "Qwen3MoeForCausalLM";
    if (!moe) return reader.Error(reader.Key("expert_count"), "is required for qwen3moe");
  }
  if (*arch == "qwen2" && !config.qkv_bias) {
    return absl::InvalidArgumentError(
        absl::StrCat(file.path(), ": a qwen2 model needs tensor 'blk.0.attn_q.bias'"));
  }
  if (moe) {
    config.num_experts = experts;
    RETURN_IF_ERROR(
        reader.ReadPositiveInt("expert_used_count", std::nullopt, &config.experts_per_token));
    if (config.experts_per_token > experts) {
      return reader.Error(
          reader.Key("expert_used_count"),
          absl::StrCat(config.experts_per_token, " exceeds expert_count ", experts));
    }
    // llama.cpp renormalises the chosen experts' weights for both (expert_weights_norm,
    // where written, says so explicitly).
    config.norm_topk_prob = true;
    if (const GgufValue* norm = file.FindMetadata(reader.Key("expert_weights_norm"))) {
      if (const bool* flag = std::get_if<bool>(&norm->value)) config.norm_topk_prob = *flag;
    }
    if (*arch == "llama") {
      config.moe_naming = MoeNaming::kMixtral;
      RETURN_IF_ERROR(reader.ReadPositiveInt("feed_forward_length", std::nullopt,
                                             &config.moe_intermediate_size));
      config.intermediate_size = config.moe_intermediate_size;
    } else {
      config.moe_naming = MoeNaming::kQwen3;
      RETURN_IF_ERROR(reader.ReadPositiveInt("expert_feed_forward_length", std::nullopt,
                                             &config.moe_intermediate_size));
      RETURN_IF_ERROR(reader.ReadPositiveInt("feed_forward_length", config.moe_intermediate_size,
                                             &config.intermediate_size));
    }
    // A layer is sparse when it has a router (all are when no router is found, the
    // layout of files with per-expert tensors).
    config.sparse_layers.assign(config.num_layers, false);
    bool any_router = false;
    for (int layer = 0; layer < config.num_layers; ++layer) {
      const bool router = file.FindTensor(LayerTensor(layer, "ffn_gate_inp.weight")) != nullptr;
      config.sparse_layers[layer] = router;
      any_router |= router;
    }
    if (!any_router) config.sparse_layers.assign(config.num_layers, true);
  } else {
    RETURN_IF_ERROR(
        reader.ReadPositiveInt("feed_forward_length", std::nullopt, &config.intermediate_size));
  }

  std::optional<int> bos, eos, eot;
  RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.bos_token_id", config.vocab_size, &bos));
  RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eos_token_id", config.vocab_size, &eos));
  RETURN_IF_ERROR(ReadTokenId(file, "tokenizer.ggml.eot_token_id", config.vocab_size, &eot));
  if (bos) config.bos_token_id = *bos;
  if (eos) config.eos_token_ids.push_back(*eos);
  if (eot && eot != eos) config.eos_token_ids.push_back(*eot);
  return config;
}

std::optional<HfTensorName> HfNameOfGgufTensor(std::string_view gguf_name_std,
                                               const ModelConfig& config) {
  const absl::string_view gguf_name(gguf_name_std.data(), gguf_name_std.size());
  if (gguf_name == "token_embd.weight") return HfTensorName{"model.embed_tokens.weight"};
  if (gguf_name == "output_norm.weight") return HfTensorName{"model.norm.weight"};
  if (gguf_name == "output.weight") return HfTensorName{"lm_head.weight"};
  // blk.N.<what>.<weight|bias>, or blk.N.ffn_<gate|up|down>.E.weight (per-expert files).
  const std::vector<absl::string_view> parts = absl::StrSplit(gguf_name, '.');
  int layer = 0;
  if (parts.size() < 4 || parts[0] != "blk" || !absl::SimpleAtoi(parts[1], &layer) || layer < 0 ||
      layer >= config.num_layers) {
    return std::nullopt;
  }
  const absl::string_view what = parts[2];
  const absl::string_view kind = parts.back();  // "weight" or "bias".
  if (kind != "weight" && kind != "bias") return std::nullopt;
  const std::string prefix = absl::StrCat("model.layers.", layer, ".");
  const bool mixtral = config.moe_naming == MoeNaming::kMixtral;
  const std::string moe = mixtral ? "block_sparse_moe." : "mlp.";
  auto expert_name = [&](absl::string_view projection, absl::string_view expert) {
    static constexpr std::pair<absl::string_view, absl::string_view> kMixtralNames[] = {
        {"gate", "w1"}, {"up", "w3"}, {"down", "w2"}};
    absl::string_view hf = projection;
    std::string suffix = "_proj";
    if (mixtral) {
      for (const auto& [gguf, mixtral_name] : kMixtralNames) {
        if (gguf == projection) hf = mixtral_name;
      }
      suffix.clear();
    }
    return absl::StrCat(prefix, moe, "experts.", expert, ".", hf, suffix, ".", kind);
  };

  if (parts.size() == 5) {  // blk.N.ffn_gate.E.weight: one expert of a per-expert file.
    int expert = 0;
    if (!config.HasExperts() || !absl::SimpleAtoi(parts[3], &expert) || expert < 0 ||
        expert >= config.num_experts || !absl::StartsWith(what, "ffn_")) {
      return std::nullopt;
    }
    const absl::string_view projection = what.substr(4);
    if (projection != "gate" && projection != "up" && projection != "down") return std::nullopt;
    return HfTensorName{expert_name(projection, parts[3])};
  }
  if (parts.size() != 4) return std::nullopt;

  static constexpr std::pair<absl::string_view, absl::string_view> kLayerNames[] = {
      {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
      {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
      {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
      {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
      {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
      {"ffn_down", "mlp.down_proj"},
  };
  for (const auto& [gguf, hf] : kLayerNames) {
    if (what != gguf) continue;
    HfTensorName name{absl::StrCat(prefix, hf, ".", kind)};
    // Only the llama architecture (Llama, Mistral, Mixtral) is permuted on conversion.
    const bool llama_arch = config.model_type == "llama" || config.model_type == "mixtral";
    if (llama_arch && what == "attn_q") name.rope_permuted_heads = config.num_attention_heads;
    if (llama_arch && what == "attn_k") name.rope_permuted_heads = config.num_kv_heads;
    return name;
  }
  if (what == "ffn_gate_inp" && kind == "weight") {
    return HfTensorName{absl::StrCat(prefix, moe, "gate.weight")};
  }
  for (absl::string_view projection : {"gate", "up", "down"}) {
    if (what == absl::StrCat("ffn_", projection, "_exps")) {
      return HfTensorName{expert_name(projection, "{expert}"), /*experts_merged=*/true};
    }
  }
  return std::nullopt;
}

int64_t HfRowOfPermutedRow(int64_t gguf_row, int64_t head_rows) {
  const int64_t half = head_rows / 2;
  const int64_t head = gguf_row / head_rows;
  const int64_t within = gguf_row % head_rows;  // 2i + j.
  return head * head_rows + (within % 2) * half + within / 2;
}

}  // namespace conveyor
