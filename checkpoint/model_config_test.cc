#include "checkpoint/model_config.h"

#include <filesystem>
#include <functional>
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
                             BrokenConfig{"StringRopeTheta", "'rope_theta'",
                                          [](nlohmann::json& j) { j["rope_theta"] = "500000"; }},
                             BrokenConfig{"RopeScalingNotObject", "'rope_scaling'",
                                          [](nlohmann::json& j) { j["rope_scaling"] = 8; }},
                             BrokenConfig{"UnknownRopeType", "'rope_scaling.rope_type'",
                                          [](nlohmann::json& j) {
                                            j["rope_scaling"]["rope_type"] = "yarn";
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
