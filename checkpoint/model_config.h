// The model's shape and numerics, parsed from a Hugging Face `config.json`
// (Llama, Mistral and Qwen2 families).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace conveyor {

// How RoPE frequencies are rescaled for long contexts (`rope_scaling` in config.json).
struct RopeScaling {
  enum class Type { kNone, kLinear, kLlama3 };
  Type type = Type::kNone;
  float factor = 1.0f;
  // Llama-3 only.
  float low_freq_factor = 1.0f;
  float high_freq_factor = 4.0f;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM".
  std::string model_type;    // "llama", "mistral" or "qwen2".
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
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
  // Bias on the output projection (Llama's `attention_bias` only).
  bool o_bias = false;
  int bos_token_id = -1;
  std::vector<int> eos_token_ids;
  std::string torch_dtype;  // As declared; informational.

  // Total parameter count implied by the shapes above.
  uint64_t NumParameters() const;
};

// Parses config.json text. `source` names the file in error messages.
absl::StatusOr<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source);

// Reads and parses `<model_dir>/config.json`.
absl::StatusOr<ModelConfig> LoadModelConfig(const std::string& model_dir);

// Shapes for random-weight models (benchmarks, cross-backend tests): "llama3-8b"
// (Llama-3-8B's), "small" and "tiny" (tests/model_gen's presets). INVALID_ARGUMENT
// naming the choices for any other name.
absl::StatusOr<ModelConfig> ModelShapePreset(std::string_view name);

}  // namespace conveyor
