#include "checkpoint/model_config.h"

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>

#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kSource[] = "/models/test/config.json";

// meta-llama/Llama-2-7b-hf.
nlohmann::json Llama2Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "model_type": "llama",
    "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096,
    "initializer_range": 0.02, "intermediate_size": 11008, "max_position_embeddings": 4096,
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 32,
    "pretraining_tp": 1, "rms_norm_eps": 1e-05, "rope_scaling": null,
    "tie_word_embeddings": false, "torch_dtype": "float16", "vocab_size": 32000})");
}

// meta-llama/Llama-3.1-8B-Instruct.
nlohmann::json Llama31Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu",
    "hidden_size": 4096, "intermediate_size": 14336, "max_position_embeddings": 131072,
    "mlp_bias": false, "model_type": "llama", "num_attention_heads": 32,
    "num_hidden_layers": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
}

// Qwen/Qwen2-0.5B.
nlohmann::json Qwen2Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 131072, "max_window_layers": 24, "model_type": "qwen2",
    "num_attention_heads": 14, "num_hidden_layers": 24, "num_key_value_heads": 2,
    "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "sliding_window": 131072,
    "tie_word_embeddings": true, "torch_dtype": "bfloat16", "use_sliding_window": false,
    "vocab_size": 151936})");
}

// mistralai/Mistral-7B-v0.1.
nlohmann::json MistralConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "vocab_size": 32000})");
}

// Qwen/Qwen3-8B.
nlohmann::json Qwen3Config() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": false, "attention_dropout": 0.0,
    "bos_token_id": 151643, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 4096, "initializer_range": 0.02, "intermediate_size": 12288,
    "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000, "sliding_window": null,
    "tie_word_embeddings": false, "torch_dtype": "bfloat16", "use_cache": true,
    "use_sliding_window": false, "vocab_size": 151936})");
}

// Qwen/Qwen3-30B-A3B.
nlohmann::json Qwen3MoeConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": false, "bos_token_id": 151643,
    "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
    "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": true, "num_attention_heads": 32,
    "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
    "num_key_value_heads": 4, "output_router_logits": false, "rms_norm_eps": 1e-06,
    "rope_scaling": null, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "use_sliding_window": false, "vocab_size": 151936})");
}

// mistralai/Mixtral-8x7B-v0.1.
nlohmann::json MixtralConfig() {
  return nlohmann::json::parse(R"({
    "architectures": ["MixtralForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 1,
    "eos_token_id": 2, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mixtral",
    "num_attention_heads": 32, "num_experts_per_tok": 2, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "num_local_experts": 8, "output_router_logits": false,
    "rms_norm_eps": 1e-05, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.02,
    "sliding_window": null, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "use_cache": true, "vocab_size": 32000})");
}

ModelConfig ParseOrDie(const nlohmann::json& json) {
  absl::StatusOr<ModelConfig> config = ParseModelConfig(json.dump(), kSource);
  EXPECT_TRUE(config.ok()) << config.status();
  return config.ok() ? *config : ModelConfig();
}

TEST(ModelConfigTest, ParsesLlama2) {
  const ModelConfig config = ParseOrDie(Llama2Config());
  EXPECT_EQ(config.architecture, "LlamaForCausalLM");
  EXPECT_EQ(config.model_type, "llama");
  EXPECT_EQ(config.vocab_size, 32000);
  EXPECT_EQ(config.hidden_size, 4096);
  EXPECT_EQ(config.intermediate_size, 11008);
  EXPECT_EQ(config.num_layers, 32);
  EXPECT_EQ(config.num_attention_heads, 32);
  EXPECT_EQ(config.num_kv_heads, 32);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.max_context_tokens, 4096);
  EXPECT_FLOAT_EQ(config.rms_norm_eps, 1e-5f);
  EXPECT_FLOAT_EQ(config.rope_theta, 10000.0f);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_EQ(config.bos_token_id, 1);
  EXPECT_THAT(config.eos_token_ids, ElementsAre(2));
  EXPECT_EQ(config.torch_dtype, "float16");
  EXPECT_EQ(config.NumParameters(), 6738415616u);
}

TEST(ModelConfigTest, ParsesLlama31WithLlama3RopeScaling) {
  const ModelConfig config = ParseOrDie(Llama31Config());
  EXPECT_EQ(config.num_kv_heads, 8);
  EXPECT_EQ(config.max_context_tokens, 131072);
  EXPECT_FLOAT_EQ(config.rope_theta, 500000.0f);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kLlama3);
  EXPECT_FLOAT_EQ(config.rope_scaling.factor, 8.0f);
  EXPECT_FLOAT_EQ(config.rope_scaling.low_freq_factor, 1.0f);
  EXPECT_FLOAT_EQ(config.rope_scaling.high_freq_factor, 4.0f);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(config.bos_token_id, 128000);
  EXPECT_THAT(config.eos_token_ids, ElementsAre(128001, 128008, 128009));
  EXPECT_EQ(config.NumParameters(), 8030261248u);
}

TEST(ModelConfigTest, ParsesQwen2WithBiasAndTiedEmbeddings) {
  const ModelConfig config = ParseOrDie(Qwen2Config());
  EXPECT_EQ(config.model_type, "qwen2");
  EXPECT_EQ(config.head_dim, 64);
  EXPECT_EQ(config.num_kv_heads, 2);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_TRUE(config.tie_word_embeddings);
  EXPECT_EQ(config.max_context_tokens, 131072);
  EXPECT_EQ(config.NumParameters(), 494032768u);
}

TEST(ModelConfigTest, ParsesQwen3WithPerHeadNorms) {
  const ModelConfig config = ParseOrDie(Qwen3Config());
  EXPECT_EQ(config.model_type, "qwen3");
  EXPECT_TRUE(config.qk_norm);
  EXPECT_FALSE(config.qkv_bias);
  EXPECT_FALSE(config.o_bias);
  EXPECT_FALSE(config.HasExperts());
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.max_context_tokens, 40960);
  // Published as 8.2B.
  EXPECT_NEAR(config.NumParameters() / 1e9, 8.19, 0.01);
  EXPECT_EQ(config.NumActiveParameters(), config.NumParameters());
}

TEST(ModelConfigTest, Qwen3HeadDimDefaultsTo128AndAttentionBiasSetsBothBiases) {
  nlohmann::json json = Qwen3Config();
  json.erase("head_dim");
  json["hidden_size"] = 1024;  // Qwen3-0.6B: 16 heads of 128 over a hidden size of 1024.
  json["num_attention_heads"] = 16;
  json["attention_bias"] = true;
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_TRUE(config.o_bias);
}

TEST(ModelConfigTest, ParsesQwen3MoeExperts) {
  const ModelConfig config = ParseOrDie(Qwen3MoeConfig());
  EXPECT_EQ(config.model_type, "qwen3_moe");
  EXPECT_TRUE(config.qk_norm);
  EXPECT_EQ(config.num_experts, 128);
  EXPECT_EQ(config.experts_per_token, 8);
  EXPECT_EQ(config.moe_intermediate_size, 768);
  EXPECT_TRUE(config.norm_topk_prob);
  EXPECT_EQ(config.moe_naming, MoeNaming::kQwen3);
  for (int i = 0; i < config.num_layers; ++i) EXPECT_TRUE(config.IsSparseLayer(i)) << i;
  // Published as 30.5B parameters, 3.3B active.
  EXPECT_NEAR(config.NumParameters() / 1e9, 30.53, 0.01);
  EXPECT_NEAR(config.NumActiveParameters() / 1e9, 3.35, 0.01);
}

TEST(ModelConfigTest, Qwen3MoeSparseLayersFollowStepAndMlpOnlyLayersAsTransformersDoes) {
  nlohmann::json json = Qwen3MoeConfig();
  json["num_hidden_layers"] = 6;
  json["decoder_sparse_step"] = 2;  // Layers 1, 3, 5 (the (i+1)-th divisible by 2)...
  json["mlp_only_layers"] = {3};    // ...less layer 3.
  json.erase("norm_topk_prob");     // transformers' default: false.
  const ModelConfig config = ParseOrDie(json);
  EXPECT_THAT(config.sparse_layers, ElementsAre(false, true, false, false, false, true));
  EXPECT_FALSE(config.norm_topk_prob);
  EXPECT_EQ(config.head_dim, 128);
}

TEST(ModelConfigTest, ParsesMixtral) {
  const ModelConfig config = ParseOrDie(MixtralConfig());
  EXPECT_EQ(config.moe_naming, MoeNaming::kMixtral);
  EXPECT_FALSE(config.qk_norm);
  EXPECT_EQ(config.num_experts, 8);
  EXPECT_EQ(config.experts_per_token, 2);
  EXPECT_EQ(config.moe_intermediate_size, 14336);
  EXPECT_TRUE(config.norm_topk_prob);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.max_context_tokens, 32768);  // sliding_window null: no cap.
  // Published as 46.7B parameters, 12.9B active.
  EXPECT_NEAR(config.NumParameters() / 1e9, 46.70, 0.01);
  EXPECT_NEAR(config.NumActiveParameters() / 1e9, 12.88, 0.01);
}

TEST(ModelConfigTest, YarnRopeScalingWithTransformersDefaults) {
  nlohmann::json json = Qwen3Config();
  json["rope_scaling"] = {
      {"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}};
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_FLOAT_EQ(config.rope_scaling.factor, 4.0f);
  EXPECT_EQ(config.rope_scaling.original_max_position_embeddings, 32768);
  EXPECT_FLOAT_EQ(config.rope_scaling.beta_fast, 32.0f);
  EXPECT_FLOAT_EQ(config.rope_scaling.beta_slow, 1.0f);
  EXPECT_TRUE(config.rope_scaling.truncate);
  EXPECT_FLOAT_EQ(config.rope_scaling.attention_factor, 0.1f * std::log(4.0f) + 1.0f);

  json["rope_scaling"].erase("original_max_position_embeddings");
  json["rope_scaling"]["attention_factor"] = 1.5;
  const ModelConfig defaulted = ParseOrDie(json);
  EXPECT_EQ(defaulted.rope_scaling.original_max_position_embeddings, 40960);
  EXPECT_FLOAT_EQ(defaulted.rope_scaling.attention_factor, 1.5f);
}

TEST(ModelConfigTest, UnsupportedModelTypeNamesTheSupportedOnes) {
  nlohmann::json json = Qwen3Config();
  json["model_type"] = "gemma3";
  const auto config = ParseModelConfig(json.dump(), kSource);
  ASSERT_FALSE(config.ok());
  EXPECT_THAT(config.status().message(), HasSubstr("'gemma3' is not supported"));
  EXPECT_THAT(config.status().message(),
              HasSubstr("llama, mistral, mixtral, qwen2, qwen3, qwen3_moe"));
}

TEST(ModelConfigTest, QwenSlidingWindowDoesNotCapContext) {
  nlohmann::json json = Qwen2Config();
  json["sliding_window"] = 4096;
  EXPECT_EQ(ParseOrDie(json).max_context_tokens, 131072);
}

TEST(ModelConfigTest, MistralSlidingWindowCapsContext) {
  EXPECT_EQ(ParseOrDie(MistralConfig()).max_context_tokens, 4096);

  nlohmann::json json = MistralConfig();
  json["sliding_window"] = nullptr;
  EXPECT_EQ(ParseOrDie(json).max_context_tokens, 32768);
  json["sliding_window"] = 65536;  // Larger than the context: no cap.
  EXPECT_EQ(ParseOrDie(json).max_context_tokens, 32768);
}

TEST(ModelConfigTest, LlamaAttentionBiasSetsBothBiases) {
  nlohmann::json json = Llama2Config();
  json["attention_bias"] = true;
  const ModelConfig config = ParseOrDie(json);
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_TRUE(config.o_bias);
}

TEST(ModelConfigTest, DefaultsForOptionalKeys) {
  nlohmann::json json = Llama2Config();
  for (const char* key : {"num_key_value_heads", "rope_scaling", "tie_word_embeddings",
                          "rms_norm_eps", "bos_token_id", "eos_token_id", "torch_dtype"}) {
    json.erase(key);
  }
  json["architectures"] = nullptr;
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.architecture, "");
  EXPECT_EQ(config.num_kv_heads, 32);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kNone);
  EXPECT_FALSE(config.tie_word_embeddings);
  EXPECT_FLOAT_EQ(config.rms_norm_eps, 1e-6f);
  EXPECT_EQ(config.bos_token_id, -1);
  EXPECT_THAT(config.eos_token_ids, IsEmpty());
}

TEST(ModelConfigTest, NullBosAndNullKvHeadsUseDefaults) {
  nlohmann::json json = Llama2Config();
  json["bos_token_id"] = nullptr;
  json["num_key_value_heads"] = nullptr;
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.bos_token_id, -1);
  EXPECT_EQ(config.num_kv_heads, 32);
}

TEST(ModelConfigTest, ExplicitHeadDimNeedNotDivideHidden) {
  // mistralai/Mistral-Nemo-Base-2407: 32 heads of 128 over a hidden size of 5120.
  nlohmann::json json = MistralConfig();
  json["hidden_size"] = 5120;
  json["head_dim"] = 128;
  json["sliding_window"] = nullptr;
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.head_dim, 128);
  EXPECT_EQ(config.hidden_size, 5120);
}

TEST(ModelConfigTest, LinearRopeScalingAcceptsLegacyTypeKey) {
  nlohmann::json json = Llama2Config();
  json["rope_scaling"] = {{"type", "linear"}, {"factor", 2.0}};
  const ModelConfig config = ParseOrDie(json);
  EXPECT_EQ(config.rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_FLOAT_EQ(config.rope_scaling.factor, 2.0f);

  json["rope_scaling"] = {{"rope_type", "linear"}, {"factor", 4}};
  EXPECT_FLOAT_EQ(ParseOrDie(json).rope_scaling.factor, 4.0f);
}

TEST(ModelConfigTest, DefaultRopeTypeMeansNoScaling) {
  nlohmann::json json = Llama2Config();
  json["rope_scaling"] = {{"rope_type", "default"}};
  EXPECT_EQ(ParseOrDie(json).rope_scaling.type, RopeScaling::Type::kNone);
}

// The `demo` shape preset (for the step benchmark) is demo/model's config.json.
TEST(ModelConfigTest, DemoPresetIsTheDemoModelsShape) {
  const std::filesystem::path file =
      std::filesystem::path(__FILE__).parent_path().parent_path() / "demo/model/config.json";
  std::ifstream in(file);
  ASSERT_TRUE(in) << file;
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const ModelConfig demo = ParseOrDie(nlohmann::json::parse(text));
  const absl::StatusOr<ModelConfig> preset = ModelShapePreset("demo");
  ASSERT_TRUE(preset.ok()) << preset.status();
  EXPECT_EQ(preset->vocab_size, demo.vocab_size);
  EXPECT_EQ(preset->hidden_size, demo.hidden_size);
  EXPECT_EQ(preset->intermediate_size, demo.intermediate_size);
  EXPECT_EQ(preset->num_layers, demo.num_layers);
  EXPECT_EQ(preset->num_attention_heads, demo.num_attention_heads);
  EXPECT_EQ(preset->num_kv_heads, demo.num_kv_heads);
  EXPECT_EQ(preset->head_dim, demo.head_dim);
  EXPECT_EQ(preset->max_context_tokens, demo.max_context_tokens);
  EXPECT_EQ(preset->rope_theta, demo.rope_theta);
  EXPECT_EQ(preset->tie_word_embeddings, demo.tie_word_embeddings);
  EXPECT_EQ(preset->NumParameters(), demo.NumParameters());
}

TEST(ModelConfigTest, BadJsonIsInvalidArgumentNamingSource) {
  for (const char* text : {"{\"model_type\": ", "[1, 2]", ""}) {
    auto config = ParseModelConfig(text, kSource);
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(config.status().message(), HasSubstr(kSource));
  }
}

// One way to break a valid config, and the key the error must name.
struct BrokenConfig {
  std::string test_name;
  std::string key;
  std::function<void(nlohmann::json&)> mutate;
};

class BrokenConfigTest : public ::testing::TestWithParam<BrokenConfig> {};

TEST_P(BrokenConfigTest, IsInvalidArgumentNamingSourceAndKey) {
  nlohmann::json json = Llama31Config();
  GetParam().mutate(json);
  auto config = ParseModelConfig(json.dump(), kSource);
  ASSERT_FALSE(config.ok());
  EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(config.status().message(), HasSubstr(kSource));
  EXPECT_THAT(config.status().message(), HasSubstr(GetParam().key));
}

INSTANTIATE_TEST_SUITE_P(AllKeys, BrokenConfigTest,
                         ::testing::Values(
                             BrokenConfig{"MissingHiddenSize", "'hidden_size'",
                                          [](nlohmann::json& j) { j.erase("hidden_size"); }},
                             BrokenConfig{"MissingModelType", "'model_type'",
                                          [](nlohmann::json& j) { j.erase("model_type"); }},
                             BrokenConfig{"UnsupportedModelType", "'model_type'",
                                          [](nlohmann::json& j) { j["model_type"] = "gpt2"; }},
                             BrokenConfig{"GeluActivation", "'hidden_act'",
                                          [](nlohmann::json& j) { j["hidden_act"] = "gelu"; }},
                             BrokenConfig{"OddHeadDim", "'head_dim'",
                                          [](nlohmann::json& j) { j["head_dim"] = 33; }},
                             BrokenConfig{"MoreExpertsPerTokenThanExperts", "'num_experts_per_tok'",
                                          [](nlohmann::json& j) {
                                            j = Qwen3MoeConfig();
                                            j["num_experts_per_tok"] = 129;
                                          }},
                             BrokenConfig{"ZeroExperts", "'num_local_experts'",
                                          [](nlohmann::json& j) {
                                            j = MixtralConfig();
                                            j["num_local_experts"] = 0;
                                          }},
                             BrokenConfig{"MlpOnlyLayerOutOfRange", "'mlp_only_layers'",
                                          [](nlohmann::json& j) {
                                            j = Qwen3MoeConfig();
                                            j["mlp_only_layers"] = {48};
                                          }},
                             BrokenConfig{"ZeroSparseStep", "'decoder_sparse_step'",
                                          [](nlohmann::json& j) {
                                            j = Qwen3MoeConfig();
                                            j["decoder_sparse_step"] = 0;
                                          }},
                             BrokenConfig{"YarnWithoutFactor", "'rope_scaling.factor'",
                                          [](nlohmann::json& j) {
                                            j["rope_scaling"] = {{"rope_type", "yarn"}};
                                          }},
                             BrokenConfig{"StringVocabSize", "'vocab_size'",
                                          [](nlohmann::json& j) { j["vocab_size"] = "128256"; }},
                             BrokenConfig{"FractionalLayers", "'num_hidden_layers'",
                                          [](nlohmann::json& j) { j["num_hidden_layers"] = 32.5; }},
                             BrokenConfig{
                                 "HugeIntermediateSize", "'intermediate_size'",
                                 [](nlohmann::json& j) { j["intermediate_size"] = 1LL << 40; }},
                             BrokenConfig{"ZeroLayers", "'num_hidden_layers'",
                                          [](nlohmann::json& j) { j["num_hidden_layers"] = 0; }},
                             BrokenConfig{
                                 "NegativeHeads", "'num_attention_heads'",
                                 [](nlohmann::json& j) { j["num_attention_heads"] = -32; }},
                             BrokenConfig{
                                 "ZeroMaxPositions", "'max_position_embeddings'",
                                 [](nlohmann::json& j) { j["max_position_embeddings"] = 0; }},
                             BrokenConfig{"ZeroKvHeads", "'num_key_value_heads'",
                                          [](nlohmann::json& j) { j["num_key_value_heads"] = 0; }},
                             BrokenConfig{"KvHeadsNotDividingHeads", "'num_key_value_heads'",
                                          [](nlohmann::json& j) { j["num_key_value_heads"] = 5; }},
                             BrokenConfig{"HiddenNotMultipleOfHeads", "'hidden_size'",
                                          [](nlohmann::json& j) { j["hidden_size"] = 4100; }},
                             BrokenConfig{"ZeroHeadDim", "'head_dim'",
                                          [](nlohmann::json& j) { j["head_dim"] = 0; }},
                             BrokenConfig{"NegativeRmsNormEps", "'rms_norm_eps'",
                                          [](nlohmann::json& j) { j["rms_norm_eps"] = -1e-5; }},
                             BrokenConfig{
                                 "StringRopeTheta", "'rope_theta'",
                                 [](nlohmann::json& j) { j["rope_theta"] = "500000"; }},
                             BrokenConfig{"RopeScalingNotObject", "'rope_scaling'",
                                          [](nlohmann::json& j) { j["rope_scaling"] = 8; }},
                             BrokenConfig{"UnknownRopeType", "'rope_scaling.rope_type'",
                                          [](nlohmann::json& j) {
                                            j["rope_scaling"]["rope_type"] = "longrope";
                                          }},
                             BrokenConfig{
                                 "UnknownLegacyRopeType", "'rope_scaling.type'",
                                 [](nlohmann::json& j) {
                                   j["rope_scaling"] = {{"type", "dynamic"}, {"factor", 2.0}};
                                 }},
                             BrokenConfig{
                                 "RopeScalingWithoutType", "'rope_scaling.type'",
                                 [](nlohmann::json& j) { j["rope_scaling"].erase("rope_type"); }},
                             BrokenConfig{
                                 "RopeScalingWithoutFactor", "'rope_scaling.factor'",
                                 [](nlohmann::json& j) { j["rope_scaling"].erase("factor"); }},
                             BrokenConfig{
                                 "ZeroRopeFactor", "'rope_scaling.factor'",
                                 [](nlohmann::json& j) { j["rope_scaling"]["factor"] = 0; }},
                             BrokenConfig{
                                 "InvertedLlama3FreqFactors", "'rope_scaling.high_freq_factor'",
                                 [](nlohmann::json& j) {
                                   j["rope_scaling"]["high_freq_factor"] = 0.5;
                                 }},
                             BrokenConfig{"ZeroOriginalMaxPositions",
                                          "'rope_scaling.original_max_position_embeddings'",
                                          [](nlohmann::json& j) {
                                            j["rope_scaling"]["original_max_position_embeddings"] =
                                                0;
                                          }},
                             BrokenConfig{
                                 "StringTieWordEmbeddings", "'tie_word_embeddings'",
                                 [](nlohmann::json& j) { j["tie_word_embeddings"] = "false"; }},
                             BrokenConfig{"StringAttentionBias", "'attention_bias'",
                                          [](nlohmann::json& j) { j["attention_bias"] = 1; }},
                             BrokenConfig{"EosListWithString", "'eos_token_id'",
                                          [](nlohmann::json& j) {
                                            j["eos_token_id"] = {128001, "x"};
                                          }},
                             BrokenConfig{"EosOutsideVocab", "'eos_token_id'",
                                          [](nlohmann::json& j) { j["eos_token_id"] = 128256; }},
                             BrokenConfig{"NegativeBos", "'bos_token_id'",
                                          [](nlohmann::json& j) { j["bos_token_id"] = -1; }},
                             BrokenConfig{"ArchitecturesNotList", "'architectures'",
                                          [](nlohmann::json& j) {
                                            j["architectures"] = "LlamaForCausalLM";
                                          }},
                             BrokenConfig{"MistralZeroSlidingWindow", "'sliding_window'",
                                          [](nlohmann::json& j) {
                                            j["model_type"] = "mistral";
                                            j["sliding_window"] = 0;
                                          }}),
                         [](const ::testing::TestParamInfo<BrokenConfig>& info) {
                           return info.param.test_name;
                         });

TEST(LoadModelConfigTest, ReadsConfigJsonFromDir) {
  TestTempDir dir;
  dir.WriteFile("config.json", Qwen2Config().dump());
  auto config = LoadModelConfig(dir.path());
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "qwen2");
}

TEST(LoadModelConfigTest, ErrorsNameTheFile) {
  TestTempDir dir;
  auto missing = LoadModelConfig(dir.path());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(dir.path() + "/config.json"));

  nlohmann::json json = Llama2Config();
  json.erase("vocab_size");
  const std::string path = dir.WriteFile("config.json", json.dump());
  auto broken = LoadModelConfig(dir.path());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(broken.status().message(), HasSubstr(path));
  EXPECT_THAT(broken.status().message(), HasSubstr("'vocab_size'"));
}

// Found by the step fuzzer through a worker's Init: a config.json that is a directory, or
// a model path with a NUL byte (which the C library cuts at, here to "/"), made
// std::ifstream throw on the read and took the worker down.
TEST(LoadModelConfigTest, ADirectoryOrANulInThePathIsAnErrorNotACrash) {
  TestTempDir dir;
  std::filesystem::create_directory(dir.path() + "/config.json");
  EXPECT_EQ(LoadModelConfig(dir.path()).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadModelConfig(std::string("/\0models", 8)).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace conveyor
