// How --cpu_weight_dtype and --cpu_kv_dtype resolve for each kind of checkpoint: what a
// user gets from `auto`, and that GGUF blocks are kept only when asked for.
#include "model/cpu/cpu_device.h"

#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant_gemm.h"

namespace conveyor::model {
namespace {

using kernels::CpuKvDtype;
using kernels::CpuWeightDtype;
using ::testing::HasSubstr;

TEST(CpuWeightChoiceTest, ParsesEveryNameAndRefusesOthersListingThem) {
  EXPECT_EQ(*ParseCpuWeightChoice("auto"), CpuWeightChoice::kAuto);
  EXPECT_EQ(*ParseCpuWeightChoice("f32"), CpuWeightChoice::kF32);
  EXPECT_EQ(*ParseCpuWeightChoice("bf16"), CpuWeightChoice::kBf16);
  EXPECT_EQ(*ParseCpuWeightChoice("int8"), CpuWeightChoice::kInt8);
  EXPECT_EQ(*ParseCpuWeightChoice("gguf"), CpuWeightChoice::kGguf);
  const auto bad = ParseCpuWeightChoice("q4_k");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), HasSubstr("auto, f32, bf16, int8 or gguf"));
  EXPECT_THAT(bad.status().message(), HasSubstr("\"q4_k\""));
}

TEST(CpuWeightChoiceTest, AutoStoresABlockQuantizedFileAsInt8AndGgufKeepsItsBlocks) {
  for (const std::string type : {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"}) {
    EXPECT_EQ(ResolveCpuWeightDtype(CpuWeightChoice::kAuto, type), CpuWeightDtype::kInt8) << type;
    EXPECT_EQ(KeepsQuantizedWeights(CpuWeightChoice::kAuto, type), kernels::QuantGemmBeatsInt8())
        << type;
    EXPECT_TRUE(KeepsQuantizedWeights(CpuWeightChoice::kGguf, type)) << type;
    // The tensors kept out of the blocks (embeddings, routers) stay float32 under gguf.
    EXPECT_EQ(ResolveCpuWeightDtype(CpuWeightChoice::kGguf, type), CpuWeightDtype::kF32) << type;
    for (CpuWeightChoice explicit_choice :
         {CpuWeightChoice::kF32, CpuWeightChoice::kBf16, CpuWeightChoice::kInt8}) {
      EXPECT_FALSE(KeepsQuantizedWeights(explicit_choice, type)) << type;
    }
  }
  // Nothing to keep in a float checkpoint, whatever the choice.
  for (const std::string type : {"float32", "bfloat16", "float16", ""}) {
    EXPECT_FALSE(KeepsQuantizedWeights(CpuWeightChoice::kGguf, type)) << type;
  }
}

TEST(CpuWeightChoiceTest, AutoOnFloatCheckpointsIsUnchanged) {
  const bool bf16_cpu = kernels::ActiveCpuIsa() >= kernels::CpuIsa::kAvx512Bf16;
  EXPECT_EQ(ResolveCpuWeightDtype(CpuWeightChoice::kAuto, "float32"), CpuWeightDtype::kF32);
  EXPECT_EQ(ResolveCpuWeightDtype(CpuWeightChoice::kAuto, "bfloat16"),
            bf16_cpu ? CpuWeightDtype::kBf16 : CpuWeightDtype::kF32);
  EXPECT_EQ(ResolveCpuWeightDtype(CpuWeightChoice::kInt8, "float32"), CpuWeightDtype::kInt8);
}

TEST(CpuKvChoiceTest, AutoIsBf16NextToNarrowOrKeptWeights) {
  EXPECT_EQ(ResolveCpuKvDtype(CpuKvChoice::kAuto, CpuWeightDtype::kF32), CpuKvDtype::kF32);
  EXPECT_EQ(ResolveCpuKvDtype(CpuKvChoice::kAuto, CpuWeightDtype::kF32, /*quantized_weights=*/true),
            CpuKvDtype::kBf16);
  EXPECT_EQ(ResolveCpuKvDtype(CpuKvChoice::kAuto, CpuWeightDtype::kInt8), CpuKvDtype::kBf16);
  EXPECT_EQ(ResolveCpuKvDtype(CpuKvChoice::kF32, CpuWeightDtype::kInt8), CpuKvDtype::kF32);
}

}  // namespace
}  // namespace conveyor::model
