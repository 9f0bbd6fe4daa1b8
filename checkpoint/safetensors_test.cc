#include "checkpoint/safetensors.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/safetensors_test_util.h"
#include "common/test_temp_dir.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace conveyor {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  // Writes `bytes` as `name` in the temp dir and opens it.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenBytes(const std::string& bytes,
                                                             const std::string& name = "t.st") {
    path_ = dir_.WriteFile(name, bytes);
    return SafetensorsFile::Open(path_);
  }

  TestTempDir dir_;
  std::string path_;
};

TEST_F(SafetensorsTest, OpensAndFindsTensors) {
  auto file = OpenBytes(
      SafetensorsBytes({F32Tensor("a", {2, 2}, {1, 2, 3, 4}), F32Tensor("b", {3}, {5, 6, 7})}));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path_);
  EXPECT_THAT((*file)->TensorNames(), ElementsAre("a", "b"));
  EXPECT_TRUE((*file)->Contains("a"));
  EXPECT_FALSE((*file)->Contains("c"));

  auto b = (*file)->Find("b");
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(b->name, "b");
  EXPECT_EQ(b->dtype, DType::kF32);
  EXPECT_THAT(b->shape, ElementsAre(3));
  EXPECT_EQ(b->NumElements(), 3);
  EXPECT_EQ(b->size_bytes, 12u);
  std::vector<float> values(3);
  ConvertToF32(b->dtype, b->data, 3, values.data());
  EXPECT_THAT(values, ElementsAre(5, 6, 7));
}

TEST_F(SafetensorsTest, AcceptsScalarsEmptyTensorsAndMetadata) {
  const std::string header = R"({"__metadata__": {"format": "pt"},
      "scalar": {"dtype": "F32", "shape": [], "data_offsets": [0, 4]},
      "empty": {"dtype": "F16", "shape": [0, 5], "data_offsets": [4, 4]}})";
  auto file = OpenBytes(AssembleSafetensors(header, FloatBytes({2.5f})));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_THAT((*file)->TensorNames(), ElementsAre("empty", "scalar"));
  auto scalar = (*file)->Find("scalar");
  ASSERT_TRUE(scalar.ok()) << scalar.status();
  EXPECT_EQ(scalar->NumElements(), 1);
  auto empty = (*file)->Find("empty");
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->NumElements(), 0);
  EXPECT_EQ(empty->size_bytes, 0u);
}

TEST_F(SafetensorsTest, ParsesAnImageInMemoryAsOpenDoes) {
  const std::string bytes =
      SafetensorsBytes({F32Tensor("a", {2, 2}, {1, 2, 3, 4}), F32Tensor("b", {3}, {5, 6, 7})});
  auto file = SafetensorsFile::Parse(
      "in-memory", std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), "in-memory");
  EXPECT_THAT((*file)->TensorNames(), ElementsAre("a", "b"));
  auto b = (*file)->Find("b");
  ASSERT_TRUE(b.ok()) << b.status();
  // The tensor points into the caller's bytes: nothing is copied.
  EXPECT_GE(b->data, reinterpret_cast<const std::byte*>(bytes.data()));
  EXPECT_LE(b->data + b->size_bytes,
            reinterpret_cast<const std::byte*>(bytes.data()) + bytes.size());
  std::vector<float> values(3);
  ConvertToF32(b->dtype, b->data, 3, values.data());
  EXPECT_THAT(values, ElementsAre(5, 6, 7));

  const std::string truncated = bytes.substr(0, bytes.size() - 4);
  auto cut = SafetensorsFile::Parse(
      "in-memory",
      std::span(reinterpret_cast<const std::byte*>(truncated.data()), truncated.size()));
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(), HasSubstr("in-memory: tensor 'b'"));
  EXPECT_EQ(SafetensorsFile::Parse("in-memory", {}).status().code(), absl::StatusCode::kDataLoss);
}

TEST_F(SafetensorsTest, MissingFileIsNotFoundNamingPath) {
  auto file = SafetensorsFile::Open(dir_.path() + "/absent.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(file.status().message(), HasSubstr("absent.safetensors"));
}

TEST_F(SafetensorsTest, FileShorterThanLengthFieldIsDataLoss) {
  auto file = OpenBytes(std::string("\x10\x00\x00", 3), "short.safetensors");
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileIsDataLoss) {
  std::string bytes = SafetensorsBytes({F32Tensor("a", {2}, {1, 2})});
  const uint64_t huge_length = 1 << 20;
  std::memcpy(bytes.data(), &huge_length, sizeof(huge_length));
  auto file = OpenBytes(bytes);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("header length"));
}

TEST_F(SafetensorsTest, TruncatedDataIsDataLossNamingTensor) {
  std::string bytes =
      SafetensorsBytes({F32Tensor("first", {2}, {1, 2}), F32Tensor("last", {4}, {1, 2, 3, 4})});
  bytes.resize(bytes.size() - 3);
  auto file = OpenBytes(bytes);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("'last'"));
}

TEST_F(SafetensorsTest, BadJsonIsDataLoss) {
  auto file = OpenBytes(AssembleSafetensors(R"({"a": {"dtype": "F32",)", ""));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("JSON"));
}

TEST_F(SafetensorsTest, HeaderNotAnObjectIsDataLoss) {
  auto file = OpenBytes(AssembleSafetensors("[1, 2]", ""));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
}

TEST_F(SafetensorsTest, MalformedEntriesAreDataLossNamingTensor) {
  for (const std::string entry :
       {R"({"shape": [1], "data_offsets": [0, 4]})",
        R"({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]})",
        R"({"dtype": "F32", "shape": [1], "data_offsets": [0]})",
        R"({"dtype": "F32", "shape": "1", "data_offsets": [0, 4]})", R"("F32")"}) {
    auto file = OpenBytes(AssembleSafetensors(R"({"w": )" + entry + "}", FloatBytes({1})));
    EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss) << entry;
    EXPECT_THAT(file.status().message(), HasSubstr(path_));
    EXPECT_THAT(file.status().message(), HasSubstr("'w'"));
  }
}

TEST_F(SafetensorsTest, OffsetsOutOfRangeAreDataLoss) {
  auto file = OpenBytes(AssembleSafetensors(
      R"({"w": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", FloatBytes({1, 2})));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(file.status().message(), HasSubstr("exceed"));
}

TEST_F(SafetensorsTest, ReversedOffsetsAreDataLoss) {
  auto file = OpenBytes(AssembleSafetensors(
      R"({"w": {"dtype": "F32", "shape": [0], "data_offsets": [8, 4]}})", FloatBytes({1, 2})));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("'w'"));
}

TEST_F(SafetensorsTest, OffsetsInconsistentWithShapeAreDataLoss) {
  auto file = OpenBytes(AssembleSafetensors(
      R"({"w": {"dtype": "F16", "shape": [3], "data_offsets": [0, 8]}})", FloatBytes({1, 2})));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr(path_));
  EXPECT_THAT(file.status().message(), HasSubstr("'w'"));
  EXPECT_THAT(file.status().message(), HasSubstr("need 6"));
}

TEST_F(SafetensorsTest, OverflowingShapeIsDataLoss) {
  auto file = OpenBytes(AssembleSafetensors(
      R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296], "data_offsets": [0, 8]}})",
      FloatBytes({1, 2})));
  EXPECT_EQ(file.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(file.status().message(), HasSubstr("'w'"));
}

TEST_F(SafetensorsTest, MissingTensorIsNotFoundNamingFileAndTensor) {
  auto file = OpenBytes(SafetensorsBytes({F32Tensor("a", {1}, {1})}));
  ASSERT_TRUE(file.ok()) << file.status();
  auto missing = (*file)->Find("lm_head.weight");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(), HasSubstr(path_));
  EXPECT_THAT(missing.status().message(), HasSubstr("lm_head.weight"));
}

TEST_F(SafetensorsTest, UnsupportedDtypeFailsOnlyAtFind) {
  const std::string header = R"({"ids": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]},
      "w": {"dtype": "F32", "shape": [1], "data_offsets": [8, 12]}})";
  auto file = OpenBytes(AssembleSafetensors(header, FloatBytes({0, 0, 3})));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->Contains("ids"));
  auto ids = (*file)->Find("ids");
  EXPECT_EQ(ids.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ids.status().message(), HasSubstr(path_));
  EXPECT_THAT(ids.status().message(), HasSubstr("'ids'"));
  EXPECT_THAT(ids.status().message(), HasSubstr("I64"));
  EXPECT_TRUE((*file)->Find("w").ok());
}

TEST(DTypeTest, SizesAndNames) {
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_STREQ(DTypeName(DType::kF32), "F32");
  EXPECT_STREQ(DTypeName(DType::kF16), "F16");
  EXPECT_STREQ(DTypeName(DType::kBF16), "BF16");
}

std::vector<float> Convert(DType dtype, const std::vector<uint16_t>& bits) {
  std::vector<float> out(bits.size());
  ConvertToF32(dtype, reinterpret_cast<const std::byte*>(bits.data()), bits.size(), out.data());
  return out;
}

TEST(ConvertToF32Test, F16NormalValues) {
  EXPECT_THAT(Convert(DType::kF16, {0x3c00, 0xc000, 0x3555, 0x7bff, 0x0400, 0x3800}),
              ElementsAre(1.0f, -2.0f, 0.333251953125f, 65504.0f, 0x1p-14f, 0.5f));
}

TEST(ConvertToF32Test, F16SubnormalsAndZeros) {
  const std::vector<float> out = Convert(DType::kF16, {0x0001, 0x03ff, 0x8001, 0x0000, 0x8000});
  EXPECT_EQ(out[0], 0x1p-24f);
  EXPECT_EQ(out[1], 1023 * 0x1p-24f);
  EXPECT_EQ(out[2], -0x1p-24f);
  EXPECT_EQ(out[3], 0.0f);
  EXPECT_FALSE(std::signbit(out[3]));
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_TRUE(std::signbit(out[4]));
}

TEST(ConvertToF32Test, F16InfinitiesAndNan) {
  const std::vector<float> out = Convert(DType::kF16, {0x7c00, 0xfc00, 0x7e00, 0xfc01});
  EXPECT_EQ(out[0], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[1], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_TRUE(std::isnan(out[3]));
}

TEST(ConvertToF32Test, BF16Values) {
  const std::vector<float> out =
      Convert(DType::kBF16, {0x3f80, 0xc040, 0x3eab, 0x0001, 0x7f80, 0xff80, 0x7fc0, 0x8000});
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], -3.0f);
  EXPECT_EQ(out[2], 0.333984375f);
  EXPECT_EQ(out[3], 0x1p-133f);  // A float32 subnormal.
  EXPECT_EQ(out[4], std::numeric_limits<float>::infinity());
  EXPECT_EQ(out[5], -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(out[6]));
  EXPECT_TRUE(std::signbit(out[7]));
}

TEST(ConvertToF32Test, NoElementsNeedNoBuffers) {
  // An empty tensor (shape [0, 3]) converts into an empty vector, whose data() is null:
  // memcpy must not see that (UBSan's nonnull check; found by tests/fuzz/safetensors_fuzzer).
  std::vector<float> out;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16}) {
    ConvertToF32(dtype, nullptr, 0, out.data());
  }
  EXPECT_TRUE(out.empty());
}

TEST(ConvertToF32Test, F32IsCopied) {
  const std::vector<float> in = {1.5f, -0.0f, 3e38f};
  std::vector<float> out(3);
  ConvertToF32(DType::kF32, reinterpret_cast<const std::byte*>(in.data()), 3, out.data());
  EXPECT_EQ(out, in);
}

}  // namespace
}  // namespace conveyor
