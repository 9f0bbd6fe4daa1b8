#include "kernels/cpu/bf16_arithmetic.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kernels/cpu/gemm.h"  // kGemmPanelWidth

namespace conveyor::kernels::internal {
namespace {

// 64-byte aligned memory, as packed panels are (the vector kernels load them aligned).
// gemm.cc has its own: gemm_kernels.h is also compiled into the ISA files, so it holds
// no inline functions (see ToBf16Strided).
std::unique_ptr<void, decltype(&std::free)> AlignedBuffer(size_t bytes) {
  return {std::aligned_alloc(64, (bytes + 63) / 64 * 64), std::free};
}

}  // namespace

int Bf16KernelMismatches(GemmPanelKernel kernel, Bf16Activations layout, int* checked) {
  constexpr int kK = 300, kRows = kGemmMaxRows, kCols = kGemmPanelWidth;
  uint32_t state = 2024;
  const auto next = [&state] {  // In [-1, 1).
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 23) - 1.0f;
  };
  const auto panel_buffer = AlignedBuffer(size_t{kK} * kCols * sizeof(uint16_t));
  if (checked != nullptr) *checked = 0;
  if (!panel_buffer) return 0;  // Out of memory: nothing checked.
  const std::span<uint16_t> panel(static_cast<uint16_t*>(panel_buffer.get()), size_t{kK} * kCols);
  std::vector<float> x(static_cast<size_t>(kRows) * kK), bias(kCols);
  // Either layout's rounded activations fit in kRows × kK floats.
  std::vector<float> spec_x(x.size()), kernel_x(x.size());
  std::vector<float> want(static_cast<size_t>(kRows) * kCols), got(want.size());
  int wrong = 0, compared = 0;
  for (const float magnitude : {1.0f, 3e-20f}) {
    // The panel's dwords are (w[2j], w[2j+1]) pairs: any bf16 values in any order do.
    for (uint16_t& w : panel) w = ToBf16(next() * magnitude);
    for (float& v : x) v = next() * magnitude;
    for (float& v : bias) v = next() * magnitude * magnitude;
    RoundBf16Activations(x.data(), kK, kRows, kK, Bf16Activations::kChainOrder, spec_x.data());
    RoundBf16Activations(x.data(), kK, kRows, kK, layout, kernel_x.data());
    GemmPanelBf16Portable(spec_x.data(), kK, kRows, panel.data(), nullptr, kK, bias.data(),
                          want.data(), kCols, kCols, nullptr, 0);
    kernel(kernel_x.data(), layout == Bf16Activations::kPairs ? kK / 2 : kK, kRows, panel.data(),
           nullptr, kK, bias.data(), got.data(), kCols, kCols, nullptr, 0);
    for (size_t i = 0; i < want.size(); ++i) {
      wrong += std::bit_cast<uint32_t>(want[i]) != std::bit_cast<uint32_t>(got[i]);
    }
    compared += static_cast<int>(want.size());
  }
  if (checked != nullptr) *checked = compared;
  return wrong;
}

namespace {

// The two bf16 kernels of the AVX512-BF16 level timed against each other on this core: a
// 12-row tile against one panel of k = 1024 (64 KiB, so both run from L2 at their
// arithmetic rate), each kernel's best of 9 rounds of 8 calls, the rounds alternating so
// that a slow moment of the machine hits both. About a millisecond, once per process.
// vdpbf16ps is kept unless the FMAs are at least 10% faster: the instruction reads no
// widened copy of the activations and leaves the FMA ports to the other kernels.
Bf16Choice TimeBf16Arithmetic() {
  constexpr int kK = 1024, kRows = kGemmMaxRows, kCalls = 8, kRounds = 9;
  auto panel = AlignedBuffer(size_t{kK} * kGemmPanelWidth * sizeof(uint16_t));
  auto pairs = AlignedBuffer(size_t{kRows} * kK * sizeof(uint16_t));
  auto chain = AlignedBuffer(size_t{kRows} * kK * sizeof(float));
  auto y = AlignedBuffer(size_t{kRows} * kGemmPanelWidth * sizeof(float));
  if (!panel || !pairs || !chain || !y) return {Bf16Arithmetic::kVdpbf16ps, "not timed"};
  uint32_t state = 12345;  // Values in [-1, 1): their size does not change the speed.
  const auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / static_cast<float>(1 << 23) - 1.0f;
  };
  auto* w = static_cast<uint16_t*>(panel.get());
  for (int i = 0; i < kK * kGemmPanelWidth; ++i) w[i] = ToBf16(next());
  std::vector<float> x(static_cast<size_t>(kRows) * kK);
  for (float& v : x) v = next();
  RoundBf16Activations(x.data(), kK, kRows, kK, Bf16Activations::kPairs, pairs.get());
  RoundBf16Activations(x.data(), kK, kRows, kK, Bf16Activations::kChainOrder, chain.get());
  struct Candidate {
    GemmPanelKernel kernel;
    const float* x;
    int ldx;
    double best = 1e30;
  };
  Candidate fma{GemmPanelBf16Avx512, static_cast<const float*>(chain.get()), kK};
  Candidate dp{GemmPanelBf16Avx512Bf16, static_cast<const float*>(pairs.get()), kK / 2};
  auto* out = static_cast<float*>(y.get());
  for (int round = 0; round <= kRounds; ++round) {  // Round 0 warms up.
    for (Candidate* c : {&fma, &dp}) {
      const auto start = std::chrono::steady_clock::now();
      for (int call = 0; call < kCalls; ++call) {
        c->kernel(c->x, c->ldx, kRows, w, nullptr, kK, nullptr, out, kGemmPanelWidth,
                  kGemmPanelWidth, nullptr, 0);
      }
      const double seconds =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (round > 0) c->best = std::min(c->best, seconds);
    }
  }
  const double ratio = fma.best / dp.best;  // > 1: vdpbf16ps is faster.
  const Bf16Arithmetic choice =
      ratio < 1.0 / 1.1 ? Bf16Arithmetic::kFma : Bf16Arithmetic::kVdpbf16ps;
  return {choice, absl::StrFormat("timed: vdpbf16ps at %.2fx the FMAs' speed", ratio)};
}

}  // namespace

Bf16Choice ChooseBf16Arithmetic(CpuIsa level) {
  if (level < CpuIsa::kAvx512Bf16) {
    return {Bf16Arithmetic::kFma,
            absl::StrCat("the ", CpuIsaName(level), " level has no vdpbf16ps")};
  }
  if (const std::optional<Bf16Arithmetic> requested = RequestedBf16Arithmetic()) {
    return {*requested, "CONVEYOR_BF16_GEMM"};
  }
  // The instruction is used only where it computes the specification's bits: a CPU (or
  // an emulating hypervisor) that rounds or flushes otherwise would give tokens no other
  // machine gives. Every CPU measured so far agrees; this costs 1-2 ms once per process.
  int checked = 0;
  if (const int wrong =
          Bf16KernelMismatches(GemmPanelBf16Avx512Bf16, Bf16Activations::kPairs, &checked);
      wrong > 0) {
    return {Bf16Arithmetic::kFma,
            absl::StrFormat("vdpbf16ps differs from the bf16 specification in %d of %d outputs "
                            "checked on this CPU; the bf16 GEMM runs on the FMAs",
                            wrong, checked)};
  }
  Bf16Choice choice = TimeBf16Arithmetic();
  absl::StrAppend(&choice.reason, "; its bits checked on ", checked, " outputs");
  return choice;
}

}  // namespace conveyor::kernels::internal
