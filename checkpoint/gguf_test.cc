// checkpoint/gguf.h, ggml_types.h and gguf_model.h on files the `gguf` Python package
// writes (tests/gguf_ref/make_gguf.py, with the test venv's Python; its dequantization is
// the reference, compared bit for bit), and on hand-made corrupt files, one per check.
#include "checkpoint/gguf.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/gguf_model.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string SourceRoot() {
  return std::filesystem::path(__FILE__).parent_path().parent_path().string();
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// Runs make_gguf.py into `dir`; false, after a failure saying why, when it cannot: a
// missing reference must never pass silently.
bool MakeReference(const TestTempDir& dir) {
  const char* venv = std::getenv("CONVEYOR_TEST_VENV");
  const std::string python = absl::StrCat(
      venv != nullptr && *venv != '\0' ? venv : "/opt/conveyor-test-venv", "/bin/python");
  if (!std::filesystem::exists(python)) {
    ADD_FAILURE() << "no Python with the gguf package at " << python
                  << "; run scripts/install-deps.sh (or set CONVEYOR_TEST_VENV)";
    return false;
  }
  const std::string log = dir.path() + "/make_gguf.log";
  const std::string command =
      absl::StrCat("'", python, "' '", SourceRoot(), "/tests/gguf_ref/make_gguf.py' --out '",
                   dir.path(), "' > '", log, "' 2>&1");
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << command << " failed:\n" << ReadBytes(log);
    return false;
  }
  return true;
}

class GgufReferenceTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new TestTempDir();
    made_ = MakeReference(*dir_);
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { ASSERT_TRUE(made_) << "no reference files"; }
  static std::string Path(const std::string& name) { return dir_->path() + "/" + name; }

  static TestTempDir* dir_;
  static bool made_;
};
TestTempDir* GgufReferenceTest::dir_ = nullptr;
bool GgufReferenceTest::made_ = false;

TEST_F(GgufReferenceTest, ReadsEveryValueType) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(Path("types.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const GgufFile& f = **file;
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  EXPECT_EQ(f.data_offset() % 32, 0u);
  EXPECT_EQ(*f.GetString("general.architecture"), "llama");
  EXPECT_EQ(std::get<uint8_t>(f.FindMetadata("test.u8")->value), 200);
  EXPECT_EQ(std::get<int8_t>(f.FindMetadata("test.i8")->value), -100);
  EXPECT_EQ(std::get<uint16_t>(f.FindMetadata("test.u16")->value), 60000);
  EXPECT_EQ(std::get<int16_t>(f.FindMetadata("test.i16")->value), -30000);
  EXPECT_EQ(*f.GetInt("test.u32"), 4000000000);
  EXPECT_EQ(*f.GetInt("test.i32"), -2000000000);
  EXPECT_EQ(*f.GetFloat("test.f32"), 0.125);
  EXPECT_TRUE(std::get<bool>(f.FindMetadata("test.bool")->value));
  EXPECT_EQ(*f.GetString("test.string"), "h\xc3\xa9llo");
  EXPECT_EQ(std::get<uint64_t>(f.FindMetadata("test.u64")->value), (uint64_t{1} << 63) + 5);
  EXPECT_EQ(f.GetInt("test.u64").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(*f.GetInt("test.i64"), -(int64_t{1} << 40));
  EXPECT_EQ(*f.GetFloat("test.f64"), 1e300);
  EXPECT_EQ(f.GetString("test.u8").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(f.GetInt("test.absent").status().code(), absl::StatusCode::kNotFound);

  const GgufArray* strings = f.FindMetadata("test.strings")->AsArray();
  ASSERT_NE(strings, nullptr);
  EXPECT_EQ(strings->element_type, GgufValueType::kString);
  ASSERT_EQ(strings->elements.size(), 3u);
  EXPECT_EQ(*strings->elements[2].AsString(), "ccc");
  const GgufArray* floats = f.FindMetadata("test.floats")->AsArray();
  EXPECT_EQ(floats->element_type, GgufValueType::kFloat32);
  EXPECT_EQ(*floats->elements[1].AsDouble(), -2.5);
  const GgufArray* nested = f.FindMetadata("test.nested")->AsArray();
  ASSERT_EQ(nested->element_type, GgufValueType::kArray);
  ASSERT_EQ(nested->elements.size(), 2u);
  EXPECT_EQ(*nested->elements[0].AsArray()->elements[1].AsInt(), 2);
  EXPECT_EQ(nested->elements[1].AsArray()->elements.size(), 1u);
  const GgufArray* nested_strings = f.FindMetadata("test.nested_strings")->AsArray();
  EXPECT_EQ(*nested_strings->elements[1].AsArray()->elements[1].AsString(), "z");
}

// Every supported type, dequantized, equals gguf.quants.dequantize of the same bytes.
TEST_F(GgufReferenceTest, DequantizesBitForBitLikeGguf) {
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(Path("types.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  const std::pair<const char*, GgmlType> kTensors[] = {
      {"f32", GgmlType::kF32},   {"f16", GgmlType::kF16},   {"bf16", GgmlType::kBF16},
      {"q8_0", GgmlType::kQ8_0}, {"q4_0", GgmlType::kQ4_0}, {"q4_1", GgmlType::kQ4_1},
      {"q4_k", GgmlType::kQ4_K}, {"q5_k", GgmlType::kQ5_K}, {"q6_k", GgmlType::kQ6_K}};
  for (const auto& [name, type] : kTensors) {
    SCOPED_TRACE(name);
    const GgufTensorInfo* tensor = (*file)->FindTensor(name);
    ASSERT_NE(tensor, nullptr);
    EXPECT_EQ(tensor->type, type);
    EXPECT_THAT(tensor->Shape(), ElementsAre(4, 512));
    const GgmlTypeTraits traits = TraitsOf(type);
    EXPECT_EQ(tensor->size_bytes, 4u * 512 / traits.block_elements * traits.block_bytes);
    absl::StatusOr<std::vector<float>> values = (*file)->DequantizeTensor(*tensor);
    ASSERT_TRUE(values.ok()) << values.status();
    const std::string expected = ReadBytes(Path(absl::StrCat(name, ".f32")));
    ASSERT_EQ(expected.size(), values->size() * sizeof(float));
    int mismatches = 0;
    for (size_t i = 0; i < values->size(); ++i) {
      uint32_t want;
      std::memcpy(&want, expected.data() + i * 4, 4);
      const uint32_t got = std::bit_cast<uint32_t>((*values)[i]);
      if (got != want && ++mismatches <= 5) {
        ADD_FAILURE() << name << "[" << i << "]: " << (*values)[i] << " (0x" << std::hex << got
                      << "), gguf says " << std::bit_cast<float>(want) << " (0x" << want << ")";
      }
    }
    EXPECT_EQ(mismatches, 0);
  }
}

// Version 2 has the layout of version 3 (which only added big-endian files).
TEST_F(GgufReferenceTest, ReadsVersion2) {
  std::string bytes = ReadBytes(Path("types.gguf"));
  bytes[4] = 2;
  auto file = GgufFile::Parse("v2.gguf", std::as_bytes(std::span(bytes)));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->version(), 2u);
  EXPECT_EQ((*file)->tensors().size(), 9u);
}

// Every prefix of a valid file that cuts into its tensors is an error (DATA_LOSS), never
// a crash (the writer pads the file past the last tensor's end).
TEST_F(GgufReferenceTest, EveryTruncationIsAnError) {
  const std::string bytes = ReadBytes(Path("types.gguf"));
  auto whole = GgufFile::Parse("whole.gguf", std::as_bytes(std::span(bytes)));
  ASSERT_TRUE(whole.ok()) << whole.status();
  uint64_t end = 0;
  for (const GgufTensorInfo& tensor : (*whole)->tensors()) {
    end = std::max(end, (*whole)->data_offset() + tensor.offset + tensor.size_bytes);
  }
  ASSERT_LE(end, bytes.size());
  for (size_t size = 0; size < end; ++size) {
    auto file = GgufFile::Parse("cut.gguf", std::as_bytes(std::span(bytes.data(), size)));
    ASSERT_FALSE(file.ok()) << size;
    ASSERT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << size << file.status();
  }
}

TEST_F(GgufReferenceTest, LlamaConfigAndNames) {
  auto file = GgufFile::Open(Path("llama.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "llama");
  EXPECT_EQ(config->architecture, "LlamaForCausalLM");
  EXPECT_EQ(config->num_layers, 2);
  EXPECT_EQ(config->hidden_size, 64);
  EXPECT_EQ(config->intermediate_size, 128);
  EXPECT_EQ(config->num_attention_heads, 4);
  EXPECT_EQ(config->num_kv_heads, 2);
  EXPECT_EQ(config->head_dim, 32);
  EXPECT_EQ(config->vocab_size, 96);
  EXPECT_EQ(config->max_context_tokens, 4096);
  EXPECT_FLOAT_EQ(config->rms_norm_eps, 1e-6f);
  EXPECT_FLOAT_EQ(config->rope_theta, 1e6f);
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kYarn);
  EXPECT_FLOAT_EQ(config->rope_scaling.factor, 4.0f);
  EXPECT_EQ(config->rope_scaling.original_max_position_embeddings, 1024);
  EXPECT_FALSE(config->tie_word_embeddings);
  EXPECT_FALSE(config->qkv_bias);
  EXPECT_FALSE(config->qk_norm);
  EXPECT_FALSE(config->HasExperts());
  EXPECT_EQ(config->bos_token_id, 1);
  EXPECT_THAT(config->eos_token_ids, ElementsAre(2));

  // Every tensor of the file has an HF name; Q and K are marked permuted.
  for (const GgufTensorInfo& tensor : (*file)->tensors()) {
    EXPECT_TRUE(HfNameOfGgufTensor(tensor.name, *config).has_value()) << tensor.name;
  }
  auto q = HfNameOfGgufTensor("blk.1.attn_q.weight", *config);
  EXPECT_EQ(q->name, "model.layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(q->rope_permuted_heads, 4);
  auto k = HfNameOfGgufTensor("blk.0.attn_k.weight", *config);
  EXPECT_EQ(k->name, "model.layers.0.self_attn.k_proj.weight");
  EXPECT_EQ(k->rope_permuted_heads, 2);
  EXPECT_EQ(HfNameOfGgufTensor("blk.0.attn_v.weight", *config)->rope_permuted_heads, 0);
  EXPECT_EQ(HfNameOfGgufTensor("token_embd.weight", *config)->name, "model.embed_tokens.weight");
  EXPECT_EQ(HfNameOfGgufTensor("output.weight", *config)->name, "lm_head.weight");
  EXPECT_EQ(HfNameOfGgufTensor("output_norm.weight", *config)->name, "model.norm.weight");
  EXPECT_EQ(HfNameOfGgufTensor("blk.0.ffn_norm.weight", *config)->name,
            "model.layers.0.post_attention_layernorm.weight");
  EXPECT_EQ(HfNameOfGgufTensor("blk.1.ffn_down.weight", *config)->name,
            "model.layers.1.mlp.down_proj.weight");
  EXPECT_FALSE(HfNameOfGgufTensor("blk.2.ffn_down.weight", *config).has_value());
  EXPECT_FALSE(HfNameOfGgufTensor("rope_freqs.weight", *config).has_value());
}

TEST_F(GgufReferenceTest, Qwen3MoeConfigAndNames) {
  auto file = GgufFile::Open(Path("qwen3moe.gguf"));
  ASSERT_TRUE(file.ok()) << file.status();
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(**file);
  ASSERT_TRUE(config.ok()) << config.status();
  EXPECT_EQ(config->model_type, "qwen3_moe");
  EXPECT_TRUE(config->qk_norm);
  EXPECT_TRUE(config->tie_word_embeddings);
  EXPECT_EQ(config->num_experts, 4);
  EXPECT_EQ(config->experts_per_token, 2);
  EXPECT_EQ(config->moe_intermediate_size, 48);
  EXPECT_TRUE(config->norm_topk_prob);
  EXPECT_THAT(config->sparse_layers, ElementsAre(false, true));
  EXPECT_EQ(config->rope_scaling.type, RopeScaling::Type::kNone);
  for (const GgufTensorInfo& tensor : (*file)->tensors()) {
    auto name = HfNameOfGgufTensor(tensor.name, *config);
    ASSERT_TRUE(name.has_value()) << tensor.name;
    EXPECT_EQ(name->rope_permuted_heads, 0) << tensor.name;  // Qwen is not permuted.
  }
  auto gate = HfNameOfGgufTensor("blk.1.ffn_gate_exps.weight", *config);
  EXPECT_EQ(gate->name, "model.layers.1.mlp.experts.{expert}.gate_proj.weight");
  EXPECT_TRUE(gate->experts_merged);
  EXPECT_THAT((*file)->FindTensor("blk.1.ffn_gate_exps.weight")->Shape(), ElementsAre(4, 48, 64));
  EXPECT_EQ(HfNameOfGgufTensor("blk.1.ffn_gate_inp.weight", *config)->name,
            "model.layers.1.mlp.gate.weight");
  EXPECT_EQ(HfNameOfGgufTensor("blk.0.attn_q_norm.weight", *config)->name,
            "model.layers.0.self_attn.q_norm.weight");
}

TEST(GgufNamesTest, MixtralPerExpertNames) {
  ModelConfig config;
  config.model_type = "mixtral";
  config.num_layers = 2;
  config.num_experts = 8;
  config.moe_naming = MoeNaming::kMixtral;
  EXPECT_EQ(HfNameOfGgufTensor("blk.1.ffn_gate.3.weight", config)->name,
            "model.layers.1.block_sparse_moe.experts.3.w1.weight");
  EXPECT_EQ(HfNameOfGgufTensor("blk.1.ffn_down_exps.weight", config)->name,
            "model.layers.1.block_sparse_moe.experts.{expert}.w2.weight");
  EXPECT_EQ(HfNameOfGgufTensor("blk.0.ffn_gate_inp.weight", config)->name,
            "model.layers.0.block_sparse_moe.gate.weight");
  EXPECT_FALSE(HfNameOfGgufTensor("blk.1.ffn_gate.8.weight", config).has_value());
}

// HfRowOfPermutedRow inverts convert_hf_to_gguf's LlamaModel.permute:
//   w.reshape(n_head, 2, D/2, cols).swapaxes(1, 2).reshape(w.shape)
TEST(GgufNamesTest, UndoesTheLlamaQkPermutation) {
  const int64_t heads = 3, head_rows = 8;
  std::vector<int64_t> hf_rows(heads * head_rows);
  for (int64_t r = 0; r < heads * head_rows; ++r) hf_rows[r] = r;
  // The permuted array at [h, i, j] (i < D/2, j < 2) is the original at [h, j, i].
  std::vector<int64_t> gguf_rows(hf_rows.size());
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t i = 0; i < head_rows / 2; ++i) {
      for (int64_t j = 0; j < 2; ++j) {
        gguf_rows[h * head_rows + i * 2 + j] = hf_rows[h * head_rows + j * (head_rows / 2) + i];
      }
    }
  }
  for (int64_t r = 0; r < heads * head_rows; ++r) {
    EXPECT_EQ(HfRowOfPermutedRow(r, head_rows), gguf_rows[r]) << r;
  }
}

// Little-endian bytes of `value`.
template <typename T>
std::string Le(T value) {
  std::string bytes(sizeof(T), '\0');
  std::memcpy(bytes.data(), &value, sizeof(T));
  return bytes;
}
std::string Str(const std::string& s) { return Le<uint64_t>(s.size()) + s; }

// A GGUF image assembled field by field, to corrupt one thing at a time.
struct GgufBuilder {
  uint32_t version = 3;
  std::vector<std::string> kvs;      // Key, type, value bytes.
  std::vector<std::string> tensors;  // Tensor infos.
  uint64_t alignment = 32;
  uint64_t data_bytes = 0;
  uint64_t tensor_count_override = 0;
  uint64_t kv_count_override = 0;

  GgufBuilder& Kv(const std::string& key, uint32_t type, const std::string& value) {
    kvs.push_back(Str(key) + Le(type) + value);
    return *this;
  }
  GgufBuilder& Tensor(const std::string& name, const std::vector<int64_t>& dims, uint32_t type,
                      uint64_t offset) {
    std::string info = Str(name) + Le<uint32_t>(dims.size());
    for (int64_t dim : dims) info += Le(dim);
    tensors.push_back(info + Le(type) + Le(offset));
    return *this;
  }
  std::string Build() const {
    std::string image =
        "GGUF" + Le(version) +
        Le<uint64_t>(tensor_count_override ? tensor_count_override : tensors.size()) +
        Le<uint64_t>(kv_count_override ? kv_count_override : kvs.size());
    for (const std::string& kv : kvs) image += kv;
    for (const std::string& info : tensors) image += info;
    image.resize((image.size() + alignment - 1) / alignment * alignment, '\0');
    image.append(data_bytes, '\0');
    return image;
  }
};

constexpr uint32_t kU32 = 4, kString = 8, kArray = 9, kBool = 7;
constexpr uint32_t kF32 = 0, kQ4_0 = 2, kQ5_0 = 6;

absl::Status ParseStatus(const std::string& image) {
  return GgufFile::Parse("test.gguf", std::as_bytes(std::span(image))).status();
}

void ExpectError(const std::string& image, absl::StatusCode code, const std::string& text) {
  const absl::Status status = ParseStatus(image);
  EXPECT_EQ(status.code(), code) << status;
  EXPECT_THAT(status.message(), HasSubstr("test.gguf"));
  EXPECT_THAT(status.message(), HasSubstr(text));
}

TEST(GgufErrorsTest, AValidHandMadeFileParses) {
  GgufBuilder b;
  b.Kv("general.architecture", kString, Str("llama"));
  b.Tensor("a", {8, 2}, kF32, 0).Tensor("b", {32}, kQ4_0, 64);
  b.data_bytes = 64 + 18;
  const std::string image = b.Build();
  auto kept = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ((*kept)->FindTensor("b")->size_bytes, 18u);
  EXPECT_THAT((*kept)->FindTensor("a")->Shape(), ElementsAre(2, 8));
}

TEST(GgufErrorsTest, HeaderErrors) {
  ExpectError("GGU", absl::StatusCode::kDataLoss, "too short");
  std::string image = GgufBuilder().Build();
  image[0] = 'X';
  ExpectError(image, absl::StatusCode::kDataLoss, "bad magic");
  GgufBuilder v1;
  v1.version = 1;
  ExpectError(v1.Build(), absl::StatusCode::kInvalidArgument, "version 1 is not supported");
  GgufBuilder v9;
  v9.version = 9;
  ExpectError(v9.Build(), absl::StatusCode::kInvalidArgument, "version 9 is not supported");
  GgufBuilder big_endian;
  big_endian.version = 0x03000000;
  ExpectError(big_endian.Build(), absl::StatusCode::kInvalidArgument, "big-endian");
}

TEST(GgufErrorsTest, AbsurdCounts) {
  GgufBuilder tensors;
  tensors.tensor_count_override = uint64_t{1} << 40;
  ExpectError(tensors.Build(), absl::StatusCode::kDataLoss, "tensor count 1099511627776");
  GgufBuilder kvs;
  kvs.kv_count_override = ~uint64_t{0};
  ExpectError(kvs.Build(), absl::StatusCode::kDataLoss, "metadata count");
  GgufBuilder array;
  array.Kv("big", kArray, Le(kU32) + Le<uint64_t>(uint64_t{1} << 60));
  ExpectError(array.Build(), absl::StatusCode::kDataLoss, "key 'big'");
}

TEST(GgufErrorsTest, MetadataErrors) {
  ExpectError(GgufBuilder().Kv("k", 13, "").Build(), absl::StatusCode::kDataLoss,
              "key 'k': value: unknown value type 13");
  ExpectError(GgufBuilder().Kv("k", kU32, Le<uint32_t>(1)).Kv("k", kU32, Le<uint32_t>(2)).Build(),
              absl::StatusCode::kDataLoss, "key 'k': appears twice");
  ExpectError(GgufBuilder().Kv("k", kBool, std::string(1, '\x07')).Build(),
              absl::StatusCode::kDataLoss, "neither 0 nor 1");
  ExpectError(GgufBuilder().Kv("k", kString, Le<uint64_t>(1000) + "abc").Build(),
              absl::StatusCode::kDataLoss, "runs past the end");
  ExpectError(GgufBuilder().Kv("k", kArray, Le<uint32_t>(77) + Le<uint64_t>(0)).Build(),
              absl::StatusCode::kDataLoss, "unknown element type 77");
  std::string deep = Le(kU32) + Le<uint64_t>(0);
  for (int i = 0; i < 9; ++i) deep.insert(0, Le(kArray) + Le<uint64_t>(1));
  ExpectError(GgufBuilder().Kv("deep", kArray, deep).Build(), absl::StatusCode::kDataLoss,
              "nest deeper");
  ExpectError(GgufBuilder().Kv("general.alignment", kU32, Le<uint32_t>(24)).Build(),
              absl::StatusCode::kDataLoss, "general.alignment");
  ExpectError(GgufBuilder().Kv("general.alignment", kString, Str("32")).Build(),
              absl::StatusCode::kDataLoss, "general.alignment");
}

TEST(GgufErrorsTest, TensorInfoErrors) {
  auto one = [](const std::vector<int64_t>& dims, uint32_t type, uint64_t offset, uint64_t data) {
    GgufBuilder b;
    b.Tensor("blk.0.attn_q.weight", dims, type, offset);
    b.data_bytes = data;
    return b.Build();
  };
  ExpectError(one({64}, kF32, 0, 100), absl::StatusCode::kDataLoss,
              "tensor 'blk.0.attn_q.weight': bytes [0, +256) exceed the data section");
  ExpectError(one({4}, kF32, 4, 64), absl::StatusCode::kDataLoss,
              "offset 4 is not a multiple of the alignment 32");
  ExpectError(one({4}, 31, 0, 64), absl::StatusCode::kDataLoss, "unknown tensor type 31");
  ExpectError(one({4}, 1000, 0, 64), absl::StatusCode::kDataLoss, "unknown tensor type 1000");
  ExpectError(one({int64_t{1} << 40, int64_t{1} << 40}, kF32, 0, 64), absl::StatusCode::kDataLoss,
              "overflows");
  ExpectError(one({int64_t{1} << 62}, kF32, 0, 64), absl::StatusCode::kDataLoss,
              "size in bytes overflows");
  ExpectError(one({33}, kQ4_0, 0, 64), absl::StatusCode::kDataLoss,
              "rows of 33 elements are not whole Q4_0 blocks of 32");
  ExpectError(one({-4}, kF32, 0, 64), absl::StatusCode::kDataLoss, "negative dimension");
  ExpectError(one({1, 1, 1, 1, 1}, kF32, 0, 64), absl::StatusCode::kDataLoss, "5 dimensions");
  ExpectError(one({4}, kF32, ~uint64_t{0} - 31, 64), absl::StatusCode::kDataLoss,
              "exceed the data section");

  // A file cut inside the padding before the data section: even an empty tensor would
  // point past its end (found by gguf_fuzzer).
  GgufBuilder cut;
  cut.Kv("general.alignment", kU32, Le<uint32_t>(1024));
  cut.alignment = 1024;
  cut.Tensor("empty", {0}, kF32, 0);
  std::string image = cut.Build();
  image.resize(image.size() - 500);
  ExpectError(image, absl::StatusCode::kDataLoss, "past the end of the file");

  GgufBuilder twice;
  twice.Tensor("w", {4}, kF32, 0).Tensor("w", {4}, kF32, 32);
  twice.data_bytes = 64;
  ExpectError(twice.Build(), absl::StatusCode::kDataLoss, "tensor 'w': appears twice");
  GgufBuilder overlap;
  overlap.Tensor("a", {16}, kF32, 0).Tensor("b", {4}, kF32, 32);
  overlap.data_bytes = 64;
  ExpectError(overlap.Build(), absl::StatusCode::kDataLoss, "tensors 'a' and 'b' overlap");
}

TEST(GgufErrorsTest, UnsupportedTypesParseButDoNotDequantize) {
  GgufBuilder b;
  b.Tensor("blk.0.ffn_up.weight", {32}, kQ5_0, 0);
  b.data_bytes = 32;
  const std::string image = b.Build();
  auto file = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  ASSERT_TRUE(file.ok()) << file.status();
  auto values = (*file)->DequantizeTensor((*file)->tensors()[0]);
  EXPECT_EQ(values.status().code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(values.status().message(),
              HasSubstr("test.gguf: tensor 'blk.0.ffn_up.weight': tensor type Q5_0 is not "
                        "supported (supported: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, "
                        "Q6_K)"));
}

TEST(GgufErrorsTest, OpenNamesTheFile) {
  auto file = GgufFile::Open("/nonexistent/model.gguf");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("/nonexistent/model.gguf"));
}

TEST(GgufConfigTest, RefusesUnknownArchitecturesListingTheSupported) {
  GgufBuilder b;
  b.Kv("general.architecture", kString, Str("gpt2"));
  const std::string image = b.Build();
  auto file = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::Status status = ModelConfigFromGguf(**file).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'gpt2' is not supported (supported: llama, qwen2, "
                                          "qwen3, qwen3moe)"));
}

TEST(GgufConfigTest, MissingKeysAreNamed) {
  GgufBuilder b;
  b.Kv("general.architecture", kString, Str("qwen3"))
      .Kv("qwen3.block_count", kU32, Le<uint32_t>(2));
  const std::string image = b.Build();
  auto file = GgufFile::Parse("test.gguf", std::as_bytes(std::span(image)));
  ASSERT_TRUE(file.ok()) << file.status();
  const absl::Status status = ModelConfigFromGguf(**file).status();
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("test.gguf: key 'qwen3.embedding_length' is required"));
}

}  // namespace
}  // namespace conveyor
