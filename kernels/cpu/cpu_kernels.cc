// The kernel set of each level, and the one choice among them. Built without any ISA
// flags: it only takes the kernels' addresses, and runs none of them itself (the bf16
// check and timing call the avx512_bf16 kernels only on that level).
#include "kernels/cpu/cpu_kernels.h"

#include <utility>

#include "kernels/cpu/bf16_arithmetic.h"

namespace conveyor::kernels::internal {
namespace {

constexpr CpuKernels kPortableKernels = {
    .isa = CpuIsa::kPortable,
    .gemm = {.f32 = GemmPanelPortable,
             .bf16 = GemmPanelBf16Portable,
             .int8 = GemmPanelInt8Portable},
    .attention_tile = AttentionTilePortable,
    .rows = &kPortableRowKernels,
};

constexpr CpuKernels kAvx2Kernels = {
    .isa = CpuIsa::kAvx2,
    .gemm = {.f32 = GemmPanelAvx2,
             .bf16 = GemmPanelBf16Avx2,
             .int8 = GemmPanelInt8Avx2,
             .f32_pair = GemmPanelPairAvx2,
             .bf16_pair = GemmPanelPairBf16Avx2,
             .int8_pair = GemmPanelPairInt8Avx2,
             .bf16_activations = Bf16Activations::kChainOrder,
             .round_bf16 = RoundBf16ChainOrderAvx2,
             .widen_bf16 = WidenBf16PanelAvx2},
    .attention_tile = AttentionTileAvx2,
    .rows = &kAvx2RowKernels,
};

// AVX-512F implies AVX2: its bf16 activations round as AVX2's.
constexpr GemmKernels kAvx512Gemm = {.f32 = GemmPanelAvx512,
                                     .bf16 = GemmPanelBf16Avx512,
                                     .int8 = GemmPanelInt8Avx512,
                                     .f32_pair = GemmPanelPairAvx512,
                                     .bf16_pair = GemmPanelPairBf16Avx512,
                                     .int8_pair = GemmPanelPairInt8Avx512,
                                     .bf16_activations = Bf16Activations::kChainOrder,
                                     .round_bf16 = RoundBf16ChainOrderAvx2};

constexpr CpuKernels kAvx512Kernels = {
    .isa = CpuIsa::kAvx512,
    .gemm = kAvx512Gemm,
    .attention_tile = AttentionTileAvx512,
    .rows = &kAvx512RowKernels,
};

// The avx512_bf16 level: the avx512 level's kernels (no bf16 arithmetic in attention or
// the row kernels), and for bf16 weights vdpbf16ps on bf16 pairs...
constexpr CpuKernels kAvx512Bf16Kernels = {
    .isa = CpuIsa::kAvx512Bf16,
    .bf16_arithmetic = Bf16Arithmetic::kVdpbf16ps,
    .gemm = {.f32 = GemmPanelAvx512,
             .bf16 = GemmPanelBf16Avx512Bf16,
             .int8 = GemmPanelInt8Avx512,
             .f32_pair = GemmPanelPairAvx512,
             .bf16_pair = GemmPanelPairBf16Avx512Bf16,
             .int8_pair = GemmPanelPairInt8Avx512,
             .bf16_activations = Bf16Activations::kPairs,
             .round_bf16 = RoundBf16PairsAvx512Bf16},
    .attention_tile = AttentionTileAvx512,
    .rows = &kAvx512RowKernels,
};

// ...or, where they are faster (bf16_arithmetic.h), the avx512 level's FMAs.
constexpr CpuKernels kAvx512Bf16FmaKernels = {
    .isa = CpuIsa::kAvx512Bf16,
    .bf16_arithmetic = Bf16Arithmetic::kFma,
    .gemm = kAvx512Gemm,
    .attention_tile = AttentionTileAvx512,
    .rows = &kAvx512RowKernels,
};

// The active set and why its bf16 GEMM multiplies as it does.
struct ActiveChoice {
  const CpuKernels* kernels;
  std::string bf16_reason;
};

const ActiveChoice& Active() {
  static const ActiveChoice active = [] {
    const CpuIsa isa = ActiveCpuIsa();
    Bf16Choice bf16 = ChooseBf16Arithmetic(isa);
    return ActiveChoice{&CpuKernelsFor(isa, bf16.arithmetic), std::move(bf16.reason)};
  }();
  return active;
}

}  // namespace

const CpuKernels& CpuKernelsFor(CpuIsa isa, Bf16Arithmetic bf16) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return bf16 == Bf16Arithmetic::kVdpbf16ps ? kAvx512Bf16Kernels : kAvx512Bf16FmaKernels;
    case CpuIsa::kAvx512:
      return kAvx512Kernels;
    case CpuIsa::kAvx2:
      return kAvx2Kernels;
    case CpuIsa::kPortable:
    default:
      return kPortableKernels;
  }
}

const CpuKernels& ActiveCpuKernels() { return *Active().kernels; }

const std::string& ActiveBf16ArithmeticReason() { return Active().bf16_reason; }

}  // namespace conveyor::kernels::internal
