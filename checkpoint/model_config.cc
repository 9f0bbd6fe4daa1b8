#include "checkpoint/model_config.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "checkpoint/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {

enum class Need { kRequired, kOptional };

bool FitsInInt(const nlohmann::json& value) {
  if (value.is_number_unsigned()) {
    return value.get<uint64_t>() <= static_cast<uint64_t>(std::numeric_limits<int>::max());
  }
  return value.is_number_integer() && value.get<int64_t>() >= std::numeric_limits<int>::min() &&
         value.get<int64_t>() <= std::numeric_limits<int>::max();
}

// Typed access to the keys of one JSON object; every error is INVALID_ARGUMENT naming
// the source file and the key (prefixed for nested objects, e.g. "rope_scaling.factor").
class ConfigReader {
 public:
  ConfigReader(const nlohmann::json& object, std::string_view source, std::string_view prefix)
      : object_(object), source_(source), prefix_(prefix) {}

  // Whether `key` is present with a non-null value.
  bool Has(const std::string& key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

  // Stores `key`'s value in `*out`. An absent or null optional key leaves `*out` as is.
  template <typename T>
  absl::Status Read(const std::string& key, Need need, T* out) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) {
      return need == Need::kRequired ? Error(key, "is required") : absl::OkStatus();
    }
    return Convert(key, *it, out);
  }

  // Reads an int or a list of ints (e.g. eos_token_id); absent or null gives none.
  absl::Status ReadIntList(const std::string& key, std::vector<int>* out) const {
    out->clear();
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return absl::OkStatus();
    if (!it->is_array()) return Convert(key, *it, &out->emplace_back());
    for (const nlohmann::json& element : *it) {
      RETURN_IF_ERROR(Convert(key, element, &out->emplace_back()));
    }
    return absl::OkStatus();
  }

  absl::Status Error(const std::string& key, absl::string_view problem) const {
    return absl::InvalidArgumentError(absl::StrCat(source_, ": '", prefix_, key, "' ", problem));
  }

 private:
  template <typename T>
  absl::Status Convert(const std::string& key, const nlohmann::json& value, T* out) const {
    if constexpr (std::is_same_v<T, int>) {
      if (!FitsInInt(value)) {
        return Error(key, absl::StrCat("must be an integer in int range, got ", value.dump()));
      }
      *out = value.get<int>();
    } else if constexpr (std::is_same_v<T, float>) {
      if (!value.is_number()) {
        return Error(key, absl::StrCat("must be a number, got ", value.dump()));
      }
      *out = value.get<float>();
    } else if constexpr (std::is_same_v<T, bool>) {
      if (!value.is_boolean()) {
        return Error(key, absl::StrCat("must be a boolean, got ", value.dump()));
      }
      *out = value.get<bool>();
    } else {
      static_assert(std::is_same_v<T, std::string>);
      if (!value.is_string()) {
        return Error(key, absl::StrCat("must be a string, got ", value.dump()));
      }
      *out = value.get<std::string>();
    }
    return absl::OkStatus();
  }

  const nlohmann::json& object_;
  std::string source_;
  std::string prefix_;
};

absl::Status RequirePositive(const ConfigReader& reader, const std::string& key, double value) {
  if (value > 0) return absl::OkStatus();
  return reader.Error(key, absl::StrCat("must be positive, got ", value));
}

// YaRN's keys, with transformers' defaults and its attention factor
// (_compute_yarn_parameters in modeling_rope_utils.py).
absl::Status ParseYarn(const ConfigReader& reader, int max_position_embeddings,
                       RopeScaling* scaling) {
  scaling->original_max_position_embeddings = max_position_embeddings;
  RETURN_IF_ERROR(reader.Read("original_max_position_embeddings", Need::kOptional,
                              &scaling->original_max_position_embeddings));
  RETURN_IF_ERROR(RequirePositive(reader, "original_max_position_embeddings",
                                  scaling->original_max_position_embeddings));
  RETURN_IF_ERROR(reader.Read("beta_fast", Need::kOptional, &scaling->beta_fast));
  RETURN_IF_ERROR(reader.Read("beta_slow", Need::kOptional, &scaling->beta_slow));
  RETURN_IF_ERROR(RequirePositive(reader, "beta_fast", scaling->beta_fast));
  RETURN_IF_ERROR(RequirePositive(reader, "beta_slow", scaling->beta_slow));
  RETURN_IF_ERROR(reader.Read("truncate", Need::kOptional, &scaling->truncate));
  auto mscale = [](double scale, double m) {
    return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0;
  };
  if (reader.Has("attention_factor")) {
    RETURN_IF_ERROR(reader.Read("attention_factor", Need::kRequired, &scaling->attention_factor));
    return RequirePositive(reader, "attention_factor", scaling->attention_factor);
  }
  float m = 0, m_all = 0;
  RETURN_IF_ERROR(reader.Read("mscale", Need::kOptional, &m));
  RETURN_IF_ERROR(reader.Read("mscale_all_dim", Need::kOptional, &m_all));
  scaling->attention_factor = static_cast<float>(
      m != 0 && m_all != 0 ? mscale(scaling->factor, m) / mscale(scaling->factor, m_all)
                           : mscale(scaling->factor, 1.0));
  return absl::OkStatus();
}

// `max_position_embeddings` is YaRN's default original context.
absl::Status ParseRopeScaling(const nlohmann::json& json, std::string_view source,
                              int max_position_embeddings, RopeScaling* scaling) {
  const ConfigReader reader(json, source, "rope_scaling.");
  // Newer transformers write "rope_type"; older configs write "type".
  const std::string type_key = reader.Has("rope_type") ? "rope_type" : "type";
  std::string type;
  RETURN_IF_ERROR(reader.Read(type_key, Need::kRequired, &type));
  if (type == "default") {  // transformers' spelling of "no scaling".
    scaling->type = RopeScaling::Type::kNone;
    return absl::OkStatus();
  }
  if (type == "linear") {
    scaling->type = RopeScaling::Type::kLinear;
  } else if (type == "llama3") {
    scaling->type = RopeScaling::Type::kLlama3;
  } else if (type == "yarn") {
    scaling->type = RopeScaling::Type::kYarn;
  } else {
    return reader.Error(
        type_key, absl::StrCat("'", type, "' is not supported (supported: linear, llama3, yarn)"));
  }
  RETURN_IF_ERROR(reader.Read("factor", Need::kRequired, &scaling->factor));
  RETURN_IF_ERROR(RequirePositive(reader, "factor", scaling->factor));
  if (scaling->type == RopeScaling::Type::kYarn)
    return ParseYarn(reader, max_position_embeddings, scaling);
  if (scaling->type != RopeScaling::Type::kLlama3) return absl::OkStatus();
  RETURN_IF_ERROR(reader.Read("low_freq_factor", Need::kOptional, &scaling->low_freq_factor));
  RETURN_IF_ERROR(reader.Read("high_freq_factor", Need::kOptional, &scaling->high_freq_factor));
  RETURN_IF_ERROR(reader.Read("original_max_position_embeddings", Need::kOptional,
                              &scaling->original_max_position_embeddings));
  RETURN_IF_ERROR(RequirePositive(reader, "low_freq_factor", scaling->low_freq_factor));
  // The llama3 rule interpolates between the two wavelength bounds, dividing by the gap.
  if (scaling->high_freq_factor <= scaling->low_freq_factor) {
    return reader.Error("high_freq_factor", "must exceed low_freq_factor");
  }
  return RequirePositive(reader, "original_max_position_embeddings",
                         scaling->original_max_position_embeddings);
}

absl::Status CheckTokenId(const ConfigReader& reader, const std::string& key, int id,
                          int vocab_size) {
  if (id >= 0 && id < vocab_size) return absl::OkStatus();
  return reader.Error(key,
                      absl::StrCat("id ", id, " is outside the vocabulary [0, ", vocab_size, ")"));
}

constexpr const char* kModelTypes[] = {"llama", "mistral", "mixtral",
                                       "qwen2", "qwen3",   "qwen3_moe"};

// The mixture-of-experts keys of qwen3_moe and mixtral, with transformers' defaults.
absl::Status ParseExperts(const ConfigReader& reader, ModelConfig* config) {
  const bool mixtral = config->model_type == "mixtral";
  config->moe_naming = mixtral ? MoeNaming::kMixtral : MoeNaming::kQwen3;
  const std::string experts_key = mixtral ? "num_local_experts" : "num_experts";
  config->num_experts = mixtral ? 8 : 128;
  config->experts_per_token = mixtral ? 2 : 8;
  RETURN_IF_ERROR(reader.Read(experts_key, Need::kOptional, &config->num_experts));
  RETURN_IF_ERROR(RequirePositive(reader, experts_key, config->num_experts));
  RETURN_IF_ERROR(reader.Read("num_experts_per_tok", Need::kOptional, &config->experts_per_token));
  if (config->experts_per_token < 1 || config->experts_per_token > config->num_experts) {
    return reader.Error("num_experts_per_tok",
                        absl::StrCat("must be in [1, ", experts_key, " = ", config->num_experts,
                                     "], got ", config->experts_per_token));
  }
  config->sparse_layers.assign(config->num_layers, true);
  if (mixtral) {  // Every layer is sparse; intermediate_size is each expert's.
    config->moe_intermediate_size = config->intermediate_size;
    config->norm_topk_prob = true;
    return absl::OkStatus();
  }
  config->moe_intermediate_size = 768;
  RETURN_IF_ERROR(
      reader.Read("moe_intermediate_size", Need::kOptional, &config->moe_intermediate_size));
  RETURN_IF_ERROR(RequirePositive(reader, "moe_intermediate_size", config->moe_intermediate_size));
  RETURN_IF_ERROR(reader.Read("norm_topk_prob", Need::kOptional, &config->norm_topk_prob));
  // Qwen3MoeDecoderLayer: sparse unless listed in mlp_only_layers, and then only every
  // decoder_sparse_step-th layer (1-based).
  int step = 1;
  RETURN_IF_ERROR(reader.Read("decoder_sparse_step", Need::kOptional, &step));
  RETURN_IF_ERROR(RequirePositive(reader, "decoder_sparse_step", step));
  std::vector<int> dense;
  RETURN_IF_ERROR(reader.ReadIntList("mlp_only_layers", &dense));
  for (int layer = 0; layer < config->num_layers; ++layer) {
    config->sparse_layers[layer] = (layer + 1) % step == 0;
  }
  for (int layer : dense) {
    if (layer < 0 || layer >= config->num_layers) {
      return reader.Error("mlp_only_layers",
                          absl::StrCat("layer ", layer, " is outside [0, num_hidden_layers = ",
                                       config->num_layers, ")"));
    }
    config->sparse_layers[layer] = false;
  }
  return absl::OkStatus();
}

// transformers' FineGrainedFP8Config (quant_method "fp8", as Qwen3's and DeepSeek's FP8
// checkpoints carry it): e4m3 weights with a float scale per weight_block_size block,
// dequantized at load. The activations stay in the storage's precision, so
// activation_scheme (dynamic or static FP8 inputs, for FP8 GEMMs) changes nothing here.
absl::Status ParseFp8(const ConfigReader& reader, ModelConfig* config) {
  WeightQuantization& q = config->quantization;
  q.method = WeightQuantization::Method::kFp8;
  std::string fmt = "e4m3";
  RETURN_IF_ERROR(reader.Read("fmt", Need::kOptional, &fmt));
  if (absl::AsciiStrToLower(fmt) != "e4m3") {
    return reader.Error("fmt", absl::StrCat("'", fmt, "' is not supported (quant_method '",
                                            q.method_name, "': supported: e4m3)"));
  }
  std::vector<int> block = {128, 128};
  if (reader.Has("weight_block_size")) {
    RETURN_IF_ERROR(reader.ReadIntList("weight_block_size", &block));
  }
  if (block.size() != 2 || block[0] <= 0 || block[1] <= 0) {
    return reader.Error("weight_block_size",
                        absl::StrCat("must be two positive sizes [rows, columns] (quant_method '",
                                     q.method_name, "')"));
  }
  q.fp8_block_rows = block[0];
  q.fp8_block_cols = block[1];
  return absl::OkStatus();
}

// `quantization_config` (transformers' GPTQConfig and AwqConfig; AutoAWQ's own spellings
// w_bit and q_group_size too): the layouts checkpoint/quantized_linear.h maps to ggml
// blocks, everything else refused naming the quant_method and what does not map.
absl::Status ParseQuantization(const nlohmann::json& json, std::string_view source,
                               ModelConfig* config) {
  const ConfigReader reader(json, source, "quantization_config.");
  WeightQuantization& q = config->quantization;
  RETURN_IF_ERROR(reader.Read("quant_method", Need::kRequired, &q.method_name));
  const std::string method = absl::AsciiStrToLower(q.method_name);
  auto refuse = [&](const std::string& key, const std::string& what) {
    return reader.Error(key, absl::StrCat(what, " (quant_method '", q.method_name,
                                          "'): Conveyor loads GPTQ (4 or 8 bits) and AWQ (4 "
                                          "bits, GEMM) where they map to ggml blocks, and "
                                          "block-wise FP8 (e4m3)"));
  };
  if (method == "fp8") return ParseFp8(reader, config);
  if (method != "gptq" && method != "awq") {
    return refuse("quant_method", "is not supported");
  }
  const bool gptq = method == "gptq";
  q.method = gptq ? WeightQuantization::Method::kGptq : WeightQuantization::Method::kAwq;
  const std::string bits_key = !gptq && !reader.Has("bits") ? "w_bit" : "bits";
  const std::string group_key = !gptq && !reader.Has("group_size") ? "q_group_size" : "group_size";
  RETURN_IF_ERROR(reader.Read(bits_key, Need::kRequired, &q.bits));
  q.group_size = 128;  // GPTQConfig's and AwqConfig's default.
  RETURN_IF_ERROR(reader.Read(group_key, Need::kOptional, &q.group_size));
  if (q.bits != 4 && !(gptq && q.bits == 8)) {
    return refuse(
        bits_key,
        absl::StrCat(q.bits, " bits are not supported (supported: ", gptq ? "4, 8" : "4", ")"));
  }
  if (q.group_size != -1 && (q.group_size <= 0 || q.group_size % 32 != 0)) {
    return refuse(group_key, absl::StrCat("groups of ", q.group_size,
                                          " do not map to ggml's blocks of 32 (supported: a "
                                          "multiple of 32, or -1)"));
  }
  if (gptq) {
    RETURN_IF_ERROR(reader.Read("sym", Need::kOptional, &q.sym));
    RETURN_IF_ERROR(reader.Read("desc_act", Need::kOptional, &q.desc_act));
    // GPTQModel writes "format" as well as (or instead of) "checkpoint_format".
    std::string format = "gptq";
    const std::string format_key = reader.Has("checkpoint_format") ? "checkpoint_format" : "format";
    RETURN_IF_ERROR(reader.Read(format_key, Need::kOptional, &format));
    if (format == "gptq") {
      q.zero_offset = 1;
    } else if (format == "gptq_v2") {
      q.zero_offset = 0;
    } else {
      return refuse(format_key,
                    absl::StrCat("'", format, "' is not supported (supported: gptq, gptq_v2)"));
    }
    std::string pack_dtype = "int32";
    RETURN_IF_ERROR(reader.Read("pack_dtype", Need::kOptional, &pack_dtype));
    if (pack_dtype != "int32") {
      return refuse("pack_dtype",
                    absl::StrCat("'", pack_dtype, "' is not supported (supported: int32)"));
    }
    if (q.bits == 8 && !q.sym) {
      return refuse("sym", "8-bit weights with zero points (sym false) do not map to Q8_0");
    }
    config->torch_dtype = q.bits == 8 ? "Q8_0" : q.sym ? "Q4_0" : "Q4_1";
    return absl::OkStatus();
  }
  bool zero_point = true;
  RETURN_IF_ERROR(reader.Read("zero_point", Need::kOptional, &zero_point));
  if (!zero_point) return refuse("zero_point", "weights without zero points are not supported");
  std::string version = "gemm";
  RETURN_IF_ERROR(reader.Read("version", Need::kOptional, &version));
  if (absl::AsciiStrToLower(version) != "gemm") {
    return refuse("version", absl::StrCat("'", version, "' is not supported (supported: gemm)"));
  }
  config->torch_dtype = "Q4_1";
  return absl::OkStatus();
}

}  // namespace

namespace {

// Parameters of the model when each sparse layer has `experts` experts.
uint64_t CountParameters(const ModelConfig& c, uint64_t experts) {
  const uint64_t hidden = c.hidden_size;
  const uint64_t q_width = static_cast<uint64_t>(c.num_attention_heads) * c.head_dim;
  const uint64_t kv_width = static_cast<uint64_t>(c.num_kv_heads) * c.head_dim;
  uint64_t attention = hidden * q_width + 2 * hidden * kv_width + q_width * hidden;
  if (c.qkv_bias) attention += q_width + 2 * kv_width;
  if (c.o_bias) attention += hidden;
  if (c.qk_norm) attention += 2 * static_cast<uint64_t>(c.head_dim);
  const uint64_t norms = 2 * hidden;  // Before attention and before the MLP.
  uint64_t layers = 0;
  for (int i = 0; i < c.num_layers; ++i) {
    layers += attention + norms;
    if (c.IsSparseLayer(i)) {  // Router, then gate, up and down of each expert.
      layers += c.num_experts * hidden + experts * 3 * hidden * c.moe_intermediate_size;
    } else {
      layers += 3 * hidden * c.intermediate_size;
    }
  }
  const uint64_t embedding = static_cast<uint64_t>(c.vocab_size) * hidden;
  const uint64_t lm_head = c.tie_word_embeddings ? 0 : embedding;
  return embedding + layers + hidden + lm_head;
}

}  // namespace

uint64_t ModelConfig::NumParameters() const { return CountParameters(*this, num_experts); }

uint64_t ModelConfig::NumActiveParameters() const {
  return CountParameters(*this, experts_per_token);
}

std::string SupportedModelTypes() { return absl::StrJoin(kModelTypes, ", "); }

absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source) {
  const nlohmann::json json =
      nlohmann::json::parse(json_text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded() || !json.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(source), ": not a JSON object"));
  }
  const ConfigReader reader(json, source, "");
  ModelConfig config;

  RETURN_IF_ERROR(reader.Read("model_type", Need::kRequired, &config.model_type));
  if (absl::c_find(kModelTypes, config.model_type) == std::end(kModelTypes)) {
    return reader.Error(
        "model_type", absl::StrCat("'", config.model_type,
                                   "' is not supported (supported: ", SupportedModelTypes(), ")"));
  }
  const bool qwen3 = config.model_type == "qwen3" || config.model_type == "qwen3_moe";
  if (reader.Has("architectures")) {
    const nlohmann::json& list = json["architectures"];
    if (!list.is_array() || list.empty() || !list[0].is_string()) {
      return reader.Error("architectures", "must be a non-empty list of strings");
    }
    config.architecture = list[0].get<std::string>();
  }

  RETURN_IF_ERROR(reader.Read("vocab_size", Need::kRequired, &config.vocab_size));
  RETURN_IF_ERROR(reader.Read("hidden_size", Need::kRequired, &config.hidden_size));
  RETURN_IF_ERROR(reader.Read("intermediate_size", Need::kRequired, &config.intermediate_size));
  RETURN_IF_ERROR(reader.Read("num_hidden_layers", Need::kRequired, &config.num_layers));
  RETURN_IF_ERROR(reader.Read("num_attention_heads", Need::kRequired, &config.num_attention_heads));
  RETURN_IF_ERROR(
      reader.Read("max_position_embeddings", Need::kRequired, &config.max_context_tokens));
  for (const auto& [key, value] : {std::pair<std::string, int>{"vocab_size", config.vocab_size},
                                   {"hidden_size", config.hidden_size},
                                   {"intermediate_size", config.intermediate_size},
                                   {"num_hidden_layers", config.num_layers},
                                   {"num_attention_heads", config.num_attention_heads},
                                   {"max_position_embeddings", config.max_context_tokens}}) {
    RETURN_IF_ERROR(RequirePositive(reader, key, value));
  }

  config.num_kv_heads = config.num_attention_heads;
  RETURN_IF_ERROR(reader.Read("num_key_value_heads", Need::kOptional, &config.num_kv_heads));
  RETURN_IF_ERROR(RequirePositive(reader, "num_key_value_heads", config.num_kv_heads));
  if (config.num_attention_heads % config.num_kv_heads != 0) {
    return reader.Error("num_key_value_heads",
                        absl::StrCat(config.num_kv_heads, " does not divide num_attention_heads ",
                                     config.num_attention_heads));
  }
  if (reader.Has("head_dim")) {
    RETURN_IF_ERROR(reader.Read("head_dim", Need::kRequired, &config.head_dim));
    RETURN_IF_ERROR(RequirePositive(reader, "head_dim", config.head_dim));
  } else if (config.model_type == "qwen3") {
    config.head_dim = 128;  // Qwen3Config's default, whatever the hidden size.
  } else if (config.hidden_size % config.num_attention_heads != 0) {
    return reader.Error(
        "hidden_size",
        absl::StrCat(config.hidden_size, " is not a multiple of num_attention_heads ",
                     config.num_attention_heads, " and no head_dim is given"));
  } else {
    config.head_dim = config.hidden_size / config.num_attention_heads;
  }
  // RoPE rotates the two halves of a head against each other.
  if (config.head_dim % 2 != 0) {
    return reader.Error("head_dim", absl::StrCat("must be even, got ", config.head_dim));
  }
  if (reader.Has("hidden_act")) {
    std::string act;
    RETURN_IF_ERROR(reader.Read("hidden_act", Need::kRequired, &act));
    if (act != "silu") {
      return reader.Error("hidden_act", absl::StrCat("'", act, "' is not supported (silu)"));
    }
  }

  RETURN_IF_ERROR(reader.Read("rms_norm_eps", Need::kOptional, &config.rms_norm_eps));
  RETURN_IF_ERROR(RequirePositive(reader, "rms_norm_eps", config.rms_norm_eps));
  RETURN_IF_ERROR(reader.Read("rope_theta", Need::kOptional, &config.rope_theta));
  RETURN_IF_ERROR(RequirePositive(reader, "rope_theta", config.rope_theta));
  if (reader.Has("rope_scaling")) {
    if (!json["rope_scaling"].is_object()) {
      return reader.Error("rope_scaling", "must be an object or null");
    }
    RETURN_IF_ERROR(ParseRopeScaling(json["rope_scaling"], source, config.max_context_tokens,
                                     &config.rope_scaling));
  }
  RETURN_IF_ERROR(reader.Read("tie_word_embeddings", Need::kOptional, &config.tie_word_embeddings));
  RETURN_IF_ERROR(reader.Read("torch_dtype", Need::kOptional, &config.torch_dtype));

  const std::string& type = config.model_type;
  if (type == "qwen2") {
    config.qkv_bias = true;
  } else if (type == "llama" || qwen3) {
    bool attention_bias = false;
    RETURN_IF_ERROR(reader.Read("attention_bias", Need::kOptional, &attention_bias));
    config.qkv_bias = config.o_bias = attention_bias;
  }
  config.qk_norm = qwen3;
  // Full attention is exact only inside a sliding window, so the window caps the context.
  // Mistral and Mixtral slide when sliding_window is set; Qwen only with use_sliding_window.
  bool slides = type == "mistral" || type == "mixtral";
  if (type == "qwen2" || qwen3) {
    RETURN_IF_ERROR(reader.Read("use_sliding_window", Need::kOptional, &slides));
  }
  if (slides && reader.Has("sliding_window")) {
    int sliding_window = 0;
    RETURN_IF_ERROR(reader.Read("sliding_window", Need::kRequired, &sliding_window));
    RETURN_IF_ERROR(RequirePositive(reader, "sliding_window", sliding_window));
    config.max_context_tokens = std::min(config.max_context_tokens, sliding_window);
  }
  if (type == "qwen3_moe" || type == "mixtral") RETURN_IF_ERROR(ParseExperts(reader, &config));
  if (reader.Has("quantization_config")) {
    if (!json["quantization_config"].is_object()) {
      return reader.Error("quantization_config", "must be an object or null");
    }
    RETURN_IF_ERROR(ParseQuantization(json["quantization_config"], source, &config));
  }

  if (reader.Has("bos_token_id")) {
    RETURN_IF_ERROR(reader.Read("bos_token_id", Need::kRequired, &config.bos_token_id));
    RETURN_IF_ERROR(CheckTokenId(reader, "bos_token_id", config.bos_token_id, config.vocab_size));
  }
  RETURN_IF_ERROR(reader.ReadIntList("eos_token_id", &config.eos_token_ids));
  for (int id : config.eos_token_ids) {
    RETURN_IF_ERROR(CheckTokenId(reader, "eos_token_id", id, config.vocab_size));
  }
  return config;
}

absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir) {
  const std::string path = (std::filesystem::path(model_dir) / "config.json").string();
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(path));
  return ParseModelConfig(text, path);
}

absl::StatusOr<ModelConfig> ModelShapePreset(std::string_view name) {
  ModelConfig c;
  c.architecture = "LlamaForCausalLM";
  c.model_type = "llama";
  c.rms_norm_eps = 1e-5f;
  c.torch_dtype = "bfloat16";
  if (name == "llama3-8b") {
    c.vocab_size = 128256;
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_attention_heads = 32;
    c.num_kv_heads = 8;
    c.head_dim = 128;
    c.max_context_tokens = 8192;
    c.rope_theta = 500000.0f;
  } else if (name == "small" || name == "qwen3-moe-small") {
    c.vocab_size = 8192;
    c.hidden_size = 768;
    c.intermediate_size = 2048;
    c.num_layers = 12;
    c.num_attention_heads = 12;
    c.num_kv_heads = 4;
    c.head_dim = 64;
    c.max_context_tokens = 4096;
    c.rope_theta = 500000.0f;
    if (name == "qwen3-moe-small") {
      c.architecture = "Qwen3MoeForCausalLM";
      c.model_type = "qwen3_moe";
      c.qk_norm = true;
      c.num_experts = 128;
      c.experts_per_token = 8;
      c.moe_intermediate_size = c.intermediate_size / c.experts_per_token;
      c.sparse_layers.assign(c.num_layers, true);
    }
  } else if (name == "demo") {  // demo/model's shape (5.5M parameters, tied embeddings).
    c.vocab_size = 4096;
    c.hidden_size = 256;
    c.intermediate_size = 704;
    c.num_layers = 6;
    c.num_attention_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 64;
    c.max_context_tokens = 512;
    c.rope_theta = 10000.0f;
    c.tie_word_embeddings = true;
  } else if (name == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 160;
    c.num_layers = 2;
    c.num_attention_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.max_context_tokens = 2048;
    c.torch_dtype = "float32";
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("no model shape \"", std::string(name),
                     "\"; use llama3-8b, small, qwen3-moe-small, demo or tiny"));
  }
  return c;
}

}  // namespace conveyor
