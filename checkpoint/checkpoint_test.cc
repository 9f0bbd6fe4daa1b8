#include "checkpoint/checkpoint.h"

#include <cstdint>
#include <string>
#include <vector>

#include "checkpoint/safetensors_test_util.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

// 0, 1, 2, ... as float32.
std::vector<float> Iota(int count) {
  std::vector<float> values(count);
  for (int i = 0; i < count; ++i) values[i] = static_cast<float>(i);
  return values;
}

class CheckpointTest : public ::testing::Test {
 protected:
  // Writes a single-file checkpoint holding `tensors`.
  void WriteSingleFile(const std::vector<FakeTensor>& tensors) {
    file_path_ = dir_.WriteFile("model.safetensors", SafetensorsBytes(tensors));
  }

  // Writes an index mapping tensor name -> shard file name, returning its path.
  std::string WriteIndex(const nlohmann::json& weight_map) {
    const nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", weight_map}};
    return dir_.WriteFile("model.safetensors.index.json", index.dump());
  }

  std::unique_ptr<Checkpoint> OpenOrDie() {
    auto checkpoint = Checkpoint::Open(dir_.path());
    EXPECT_TRUE(checkpoint.ok()) << checkpoint.status();
    return checkpoint.ok() ? *std::move(checkpoint) : nullptr;
  }

  TestTempDir dir_;
  std::string file_path_;
};

TEST_F(CheckpointTest, ReadsSingleFile) {
  WriteSingleFile({F32Tensor("w", {2, 3}, Iota(6)), F32Tensor("b", {3}, {7, 8, 9})});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  EXPECT_EQ(checkpoint->dir(), dir_.path());
  EXPECT_TRUE(checkpoint->Contains("w"));
  EXPECT_FALSE(checkpoint->Contains("x"));
  EXPECT_EQ(checkpoint->TotalTensorBytes(), 36u);

  std::vector<float> w(6);
  ASSERT_TRUE(checkpoint->ReadF32("w", {2, 3}, w.data()).ok());
  EXPECT_THAT(w, ElementsAreArray(Iota(6)));
  std::vector<float> b(3);
  ASSERT_TRUE(checkpoint->ReadF32("b", {3}, b.data()).ok());
  EXPECT_THAT(b, ElementsAre(7, 8, 9));
  auto view = checkpoint->Find("w");
  ASSERT_TRUE(view.ok()) << view.status();
  EXPECT_THAT(view->shape, ElementsAre(2, 3));
}

TEST_F(CheckpointTest, ConvertsF16AndBF16) {
  WriteSingleFile({{"half", "F16", {3}, RawBytes<uint16_t>({0x3c00, 0xc000, 0x0001})},
                   {"brain", "BF16", {2}, RawBytes<uint16_t>({0x3f80, 0xc040})}});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  std::vector<float> half(3);
  ASSERT_TRUE(checkpoint->ReadF32("half", {3}, half.data()).ok());
  EXPECT_THAT(half, ElementsAre(1.0f, -2.0f, 0x1p-24f));
  std::vector<float> brain(2);
  ASSERT_TRUE(checkpoint->ReadF32("brain", {2}, brain.data()).ok());
  EXPECT_THAT(brain, ElementsAre(1.0f, -3.0f));
}

TEST_F(CheckpointTest, WrongShapeNamesTensorFileAndShapes) {
  WriteSingleFile({F32Tensor("w", {2, 3}, Iota(6))});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  std::vector<float> out(6);
  const absl::Status status = checkpoint->ReadF32("w", {3, 2}, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'w'"));
  EXPECT_THAT(status.message(), HasSubstr(file_path_));
  EXPECT_THAT(status.message(), HasSubstr("[2, 3]"));
  EXPECT_THAT(status.message(), HasSubstr("[3, 2]"));
}

TEST_F(CheckpointTest, MissingTensorIsNotFoundNamingTensorAndDir) {
  WriteSingleFile({F32Tensor("w", {1}, {1})});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  float out;
  const absl::Status status = checkpoint->ReadF32("model.norm.weight", {1}, &out);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(status.message(), HasSubstr("model.norm.weight"));
  EXPECT_THAT(status.message(), HasSubstr(dir_.path()));
}

TEST_F(CheckpointTest, UnsupportedDtypeIsInvalidArgumentAtRead) {
  WriteSingleFile({{"ids", "I32", {2}, RawBytes<int32_t>({1, 2})}, F32Tensor("w", {1}, {1})});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  std::vector<float> out(2);
  const absl::Status status = checkpoint->ReadF32("ids", {2}, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'ids'"));
  EXPECT_THAT(status.message(), HasSubstr(file_path_));
  EXPECT_EQ(checkpoint->TotalTensorBytes(), 4u);  // Only tensors that can be read.
}

TEST_F(CheckpointTest, CorruptFileIsDataLossNamingFile) {
  std::string bytes = SafetensorsBytes({F32Tensor("w", {4}, Iota(4))});
  bytes.resize(bytes.size() - 1);
  file_path_ = dir_.WriteFile("model.safetensors", bytes);
  auto checkpoint = Checkpoint::Open(dir_.path());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(file_path_));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("'w'"));
}

TEST_F(CheckpointTest, EmptyDirIsNotFoundNamingDir) {
  auto checkpoint = Checkpoint::Open(dir_.path());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(dir_.path()));
}

TEST_F(CheckpointTest, ReadsShardedCheckpoint) {
  dir_.WriteFile(
      "model-00001-of-00002.safetensors",
      SafetensorsBytes({F32Tensor("embed", {2, 2}, {1, 2, 3, 4}), F32Tensor("norm", {2}, {5, 6})}));
  dir_.WriteFile("model-00002-of-00002.safetensors",
                 SafetensorsBytes({F32Tensor("lm_head", {2, 2}, {7, 8, 9, 10})}));
  WriteIndex({{"embed", "model-00001-of-00002.safetensors"},
              {"norm", "model-00001-of-00002.safetensors"},
              {"lm_head", "model-00002-of-00002.safetensors"}});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  EXPECT_TRUE(checkpoint->Contains("embed"));
  EXPECT_TRUE(checkpoint->Contains("lm_head"));
  EXPECT_EQ(checkpoint->TotalTensorBytes(), 40u);
  std::vector<float> out(4);
  ASSERT_TRUE(checkpoint->ReadF32("lm_head", {2, 2}, out.data()).ok());
  EXPECT_THAT(out, ElementsAre(7, 8, 9, 10));
  ASSERT_TRUE(checkpoint->ReadF32("embed", {2, 2}, out.data()).ok());
  EXPECT_THAT(out, ElementsAre(1, 2, 3, 4));
  // Errors name the shard the tensor lives in.
  const absl::Status status = checkpoint->ReadF32("lm_head", {4}, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointTest, IndexNamingMissingShardIsNotFound) {
  dir_.WriteFile("model-00001-of-00002.safetensors",
                 SafetensorsBytes({F32Tensor("embed", {1}, {1})}));
  const std::string index = WriteIndex({{"embed", "model-00001-of-00002.safetensors"},
                                        {"lm_head", "model-00002-of-00002.safetensors"}});
  auto checkpoint = Checkpoint::Open(dir_.path());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(index));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("model-00002-of-00002.safetensors"));
}

TEST_F(CheckpointTest, IndexMappingTensorToFileLackingItIsDataLoss) {
  const std::string shard = dir_.WriteFile("model-00001-of-00001.safetensors",
                                           SafetensorsBytes({F32Tensor("embed", {1}, {1})}));
  WriteIndex({{"embed", "model-00001-of-00001.safetensors"},
              {"lm_head", "model-00001-of-00001.safetensors"}});
  auto checkpoint = Checkpoint::Open(dir_.path());
  EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(checkpoint.status().message(), HasSubstr("'lm_head'"));
  EXPECT_THAT(checkpoint.status().message(), HasSubstr(shard));
}

TEST_F(CheckpointTest, MalformedIndexIsDataLossNamingIndex) {
  for (const std::string text : {"{not json", R"({"metadata": {}})", R"({"weight_map": [1]})",
                                 R"({"weight_map": {"w": 3}})"}) {
    const std::string index = dir_.WriteFile("model.safetensors.index.json", text);
    auto checkpoint = Checkpoint::Open(dir_.path());
    EXPECT_EQ(checkpoint.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(checkpoint.status().message(), HasSubstr(index));
  }
}

TEST_F(CheckpointTest, SlicesAlongEitherDimension) {
  // A 4x6 matrix holding 0..23 row-major, and a vector of 0..5.
  WriteSingleFile({F32Tensor("m", {4, 6}, Iota(24)), F32Tensor("v", {6}, Iota(6))});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);

  std::vector<float> rows(12);
  ASSERT_TRUE(checkpoint->ReadF32Slice("m", {4, 6}, /*dim=*/0, 1, 3, rows.data()).ok());
  EXPECT_THAT(rows, ElementsAre(6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17));

  std::vector<float> cols(12);
  ASSERT_TRUE(checkpoint->ReadF32Slice("m", {4, 6}, /*dim=*/1, 2, 5, cols.data()).ok());
  EXPECT_THAT(cols, ElementsAre(2, 3, 4, 8, 9, 10, 14, 15, 16, 20, 21, 22));

  std::vector<float> part(2);
  ASSERT_TRUE(checkpoint->ReadF32Slice("v", {6}, /*dim=*/0, 4, 6, part.data()).ok());
  EXPECT_THAT(part, ElementsAre(4, 5));
}

TEST_F(CheckpointTest, SlicesHalfPrecisionColumns) {
  WriteSingleFile({{"h",
                    "F16",
                    {2, 3},
                    RawBytes<uint16_t>({0x3c00, 0x4000, 0x4200,       // 1 2 3
                                        0x4400, 0x4500, 0x4600})}});  // 4 5 6
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  std::vector<float> cols(4);
  ASSERT_TRUE(checkpoint->ReadF32Slice("h", {2, 3}, /*dim=*/1, 1, 3, cols.data()).ok());
  EXPECT_THAT(cols, ElementsAre(2, 3, 5, 6));
}

TEST_F(CheckpointTest, SliceRejectsBadRangesAndDimensions) {
  WriteSingleFile({F32Tensor("m", {4, 6}, Iota(24)), F32Tensor("v", {6}, Iota(6))});
  auto checkpoint = OpenOrDie();
  ASSERT_NE(checkpoint, nullptr);
  std::vector<float> out(24);

  for (auto [begin, end] : {std::pair{-1, 2}, {3, 2}, {0, 5}}) {
    const absl::Status status = checkpoint->ReadF32Slice("m", {4, 6}, 0, begin, end, out.data());
    EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange) << begin << ".." << end;
    EXPECT_THAT(status.message(), HasSubstr("'m'"));
    EXPECT_THAT(status.message(), HasSubstr(file_path_));
  }
  absl::Status status = checkpoint->ReadF32Slice("m", {4, 6}, 1, 0, 7, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kOutOfRange);

  status = checkpoint->ReadF32Slice("v", {6}, /*dim=*/1, 0, 1, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("'v'"));
  status = checkpoint->ReadF32Slice("m", {4, 6}, /*dim=*/2, 0, 1, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);

  status = checkpoint->ReadF32Slice("m", {6, 4}, 0, 0, 1, out.data());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("[4, 6]"));
}

}  // namespace
}  // namespace conveyor
