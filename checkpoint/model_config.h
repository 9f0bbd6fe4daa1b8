// The model's shape and numerics, parsed from a Hugging Face `config.json`: the
// Llama-family decoders (Llama, Mistral, Qwen2, Qwen3) and their mixture-of-experts
// relatives (Qwen3-MoE, Mixtral). docs/models.md lists what each supports.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

// How RoPE frequencies are rescaled for long contexts (`rope_scaling` in config.json).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3, kYarn };
  Type type = Type::kNone;
  float factor = 1.0f;
  // Llama-3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  // Llama-3 and YaRN (YaRN's default: max_position_embeddings).
  int original_max_position_embeddings = 8192;
  // YaRN only: the rotation counts bounding the interpolation ramp, whether its ends are
  // rounded to whole dimensions, and the factor scaling cos and sin (transformers'
  // attention_factor: given, or 0.1 ln(factor) + 1, or from mscale / mscale_all_dim).
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  bool truncate = true;
  float attention_factor = 1.0f;
  // Per-frequency divisors, head_dim / 2 of them, applied after the scaling above: GGUF's
  // `rope_freqs.weight` (how llama.cpp's converter writes Llama 3.1's rope_scaling).
  // Empty: none.
  std::vector<float> frequency_factors;
};

// Which tensor names a mixture-of-experts layer's router and experts have.
enum class MoeNaming {
  kQwen3,    // mlp.gate, mlp.experts.E.{gate,up,down}_proj.
  kMixtral,  // block_sparse_moe.gate, block_sparse_moe.experts.E.{w1,w3,w2}.
};

// How a GPTQ, AWQ or FP8 checkpoint's linear layers are stored (`quantization_config` in
// config.json), for checkpoint/quantized_linear.h. GPTQ and AWQ are parsed only where the
// layout maps to ggml blocks, FP8 where it is transformers' block-wise e4m3
// (docs/cpu-weights.md): anything else is refused when the config is parsed.
struct WeightQuantization {
  enum class Method { kNone, kGptq, kAwq, kFp8 };
  Method method = Method::kNone;
  int bits = 0;        // 4 or 8 (GPTQ); 4 (AWQ).
  int group_size = 0;  // Input weights per scale and zero point (a multiple of 32), or -1: a row.
  bool sym = true;     // GPTQ: symmetric (every zero point 2^(bits-1)).
  // GPTQ's act-order: loads only where each layer's g_idx is the identity (checked per
  // tensor at load).
  bool desc_act = false;
  // What to add to a stored zero point: 1 for GPTQ's v1 checkpoint_format ("gptq", which
  // AutoGPTQ and transformers write: zeros minus one), 0 for "gptq_v2" and AWQ.
  int zero_offset = 0;
  // FP8: weights per scale, [rows, columns] (weight_block_size; transformers' default
  // 128 × 128).
  int fp8_block_rows = 0, fp8_block_cols = 0;
  // The quant_method as written, for messages.
  std::string method_name;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM".
  std::string model_type;    // One of SupportedModelTypes().
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;  // Of the dense MLP layers (Mixtral has none).
  int num_layers = 0;
  int num_attention_heads = 0;
  int num_kv_heads = 0;  // == num_attention_heads without GQA.
  int head_dim = 0;      // hidden_size / num_attention_heads unless given.
  // Longest sequence the model accepts (max_position_embeddings, capped by a Mistral
  // sliding_window since full attention is exact only inside the window).
  int max_context_tokens = 0;
  float rms_norm_eps = 1e-6f;
  float rope_theta = 10000.0f;
  RopeScaling rope_scaling;
  bool tie_word_embeddings = false;
  // Bias on the q/k/v projections (Qwen2; Llama's `attention_bias`).
  bool qkv_bias = false;
  // Bias on the output projection (Llama's and Qwen3's `attention_bias`).
  bool o_bias = false;
  // Qwen3: an RMSNorm over each head of q and of k (weights [head_dim]) before RoPE.
  bool qk_norm = false;

  // Mixture of experts (num_experts > 0): in the sparse layers the MLP is
  // num_experts experts of moe_intermediate_size, a token's hidden state going through
  // the experts_per_token with the highest router probability (softmax over the
  // router's logits), their outputs summed weighted by those probabilities,
  // renormalised to sum to 1 when norm_topk_prob.
  int num_experts = 0;
  int experts_per_token = 0;
  int moe_intermediate_size = 0;
  bool norm_topk_prob = false;
  MoeNaming moe_naming = MoeNaming::kQwen3;
  // Per layer: whether its MLP is the sparse one ([num_layers]; empty when dense).
  std::vector<bool> sparse_layers;

  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  // As declared; for a GGUF file its layers' weight type (WeightDtypeOfGguf: "Q4_K", ...),
  // for a GPTQ/AWQ checkpoint the ggml block its layers map to ("Q4_0" for symmetric
  // 4-bit GPTQ, "Q4_1" for other 4-bit, "Q8_0" for 8-bit). Picks the CPU weight storage
  // under --cpu_weight_dtype=auto.
  std::string torch_dtype;
  // GPTQ/AWQ packing of the linear layers (kNone for a float checkpoint).
  WeightQuantization quantization;

  bool IsSparseLayer(int layer) const {
    return layer < static_cast<int>(sparse_layers.size()) && sparse_layers[layer];
  }
  bool HasExperts() const { return num_experts > 0; }

  // Total parameter count implied by the shapes above.
  uint64_t NumParameters() const;
  // Parameters one token's forward pass reads: NumParameters less the experts it does
  // not use (equal to it for a dense model).
  uint64_t NumActiveParameters() const;
};

// The model_type values ParseModelConfig accepts, for messages: "llama, mistral, ...".
std::string SupportedModelTypes();

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source);

// Reads and parses `<model_dir>/config.json`.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Shapes for random-weight models (benchmarks, cross-backend tests): "llama3-8b"
// (Llama-3-8B's), "small" and "tiny" (tests/model_gen's presets) and "qwen3-moe-small":
// Qwen3-30B-A3B's routing (128 experts, top 8, experts a third of the width) at the
// width and depth of "small", whose dense MLP has exactly the active parameters of its
// eight experts. INVALID_ARGUMENT naming the choices for any other name.
absl::StatusOr<ModelConfig> ModelShapePreset(std::string_view name);

}  // namespace conveyor
