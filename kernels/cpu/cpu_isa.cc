#include "kernels/cpu/cpu_isa.h"

#include <cpuid.h>

#include <cstdlib>

#include "absl/strings/str_cat.h"

namespace conveyor::kernels {
namespace {

struct Feature {
  unsigned leaf, subleaf;
  char reg;  // 'a', 'b', 'c' or 'd': the CPUID output register.
  int bit;
  const char* name;
};

constexpr Feature kAvx512Bf16 = {7, 1, 'a', 5, "avx512_bf16"};
constexpr Feature kAvx512Vl = {7, 0, 'b', 31, "avx512vl"};
constexpr Feature kAvx512Vnni = {7, 0, 'c', 11, "avx512_vnni"};
// Read from CPUID: clang 14's __builtin_cpu_supports does not know "f16c".
constexpr Feature kF16c = {1, 0, 'c', 29, "f16c"};
constexpr Feature kFeatures[] = {
    {7, 0, 'b', 5, "avx2"},
    {1, 0, 'c', 12, "fma"},
    {7, 0, 'b', 16, "avx512f"},
    kAvx512Vl,
    kAvx512Bf16,
    kAvx512Vnni,
    {7, 0, 'd', 23, "avx512_fp16"},
    {7, 1, 'a', 4, "avx_vnni"},
    {7, 0, 'd', 24, "amx_tile"},
    {7, 0, 'd', 22, "amx_bf16"},
    {7, 0, 'd', 25, "amx_int8"},
};

bool Has(const Feature& f) {
  unsigned r[4] = {0, 0, 0, 0};  // eax, ebx, ecx, edx
  if (__get_cpuid_count(f.leaf, f.subleaf, &r[0], &r[1], &r[2], &r[3]) == 0) return false;
  const unsigned reg = f.reg == 'a' ? r[0] : f.reg == 'b' ? r[1] : f.reg == 'c' ? r[2] : r[3];
  return ((reg >> f.bit) & 1u) != 0;
}

// __builtin_cpu_supports checks the OS's register state (XGETBV) as well as CPUID (read
// directly for AVX512-BF16: compilers differ in which names __builtin_cpu_supports knows;
// it needs no register state beyond AVX-512F's).
CpuIsa Detect() {
  if (__builtin_cpu_supports("avx512f")) {
    return __builtin_cpu_supports("avx512bw") && Has(kAvx512Bf16) ? CpuIsa::kAvx512Bf16
                                                                  : CpuIsa::kAvx512;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return CpuIsa::kAvx2;
  return CpuIsa::kPortable;
}

std::optional<CpuIsa> Requested() {
  const char* value = std::getenv("CONVEYOR_CPU_ISA");
  if (value == nullptr || *value == '\0') return std::nullopt;
  return ParseCpuIsa(value);
}

}  // namespace

const char* CpuIsaName(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::kAvx512Bf16:
      return "avx512_bf16";
    case CpuIsa::kAvx512:
      return "avx512";
    case CpuIsa::kAvx2:
      return "avx2";
    case CpuIsa::kPortable:
    default:
      return "portable";
  }
}

std::optional<CpuIsa> ParseCpuIsa(std::string_view name) {
  for (CpuIsa isa : {CpuIsa::kPortable, CpuIsa::kAvx2, CpuIsa::kAvx512, CpuIsa::kAvx512Bf16}) {
    if (name == CpuIsaName(isa)) return isa;
  }
  return std::nullopt;
}

CpuIsa DetectedCpuIsa() {
  static const CpuIsa detected = Detect();
  return detected;
}

CpuIsa ActiveCpuIsa() {
  static const CpuIsa active = [] {
    const std::optional<CpuIsa> requested = Requested();
    return requested.has_value() && *requested <= DetectedCpuIsa() ? *requested : DetectedCpuIsa();
  }();
  return active;
}

const char* Bf16ArithmeticName(Bf16Arithmetic a) {
  return a == Bf16Arithmetic::kVdpbf16ps ? "vdpbf16ps" : "fma";
}

namespace {

// CONVEYOR_BF16_GEMM's value, and why it cannot be used (empty if it can).
struct Bf16Request {
  std::optional<Bf16Arithmetic> arithmetic;
  std::string error;
};

Bf16Request ReadBf16Request() {
  const char* value = std::getenv("CONVEYOR_BF16_GEMM");
  if (value == nullptr || *value == '\0' || std::string_view(value) == "auto") return {};
  for (Bf16Arithmetic a : {Bf16Arithmetic::kFma, Bf16Arithmetic::kVdpbf16ps}) {
    if (std::string_view(value) != Bf16ArithmeticName(a)) continue;
    if (a == Bf16Arithmetic::kVdpbf16ps && ActiveCpuIsa() < CpuIsa::kAvx512Bf16) {
      return {std::nullopt,
              absl::StrCat("CONVEYOR_BF16_GEMM=vdpbf16ps needs the avx512_bf16 level; the "
                           "kernels run at ",
                           CpuIsaName(ActiveCpuIsa()))};
    }
    return {a, ""};
  }
  return {std::nullopt,
          absl::StrCat("CONVEYOR_BF16_GEMM must be auto, fma or vdpbf16ps, got \"", value, "\"")};
}

std::string CpuIsaVariableError() {
  const char* value = std::getenv("CONVEYOR_CPU_ISA");
  if (value == nullptr || *value == '\0') return "";
  const std::optional<CpuIsa> requested = ParseCpuIsa(value);
  if (!requested.has_value()) {
    return absl::StrCat("CONVEYOR_CPU_ISA must be portable, avx2, avx512 or avx512_bf16, got \"",
                        value, "\"");
  }
  if (*requested > DetectedCpuIsa()) {
    return absl::StrCat("CONVEYOR_CPU_ISA=", value, " asks for more than this CPU has (",
                        CpuIsaName(DetectedCpuIsa()), "); it can only lower the level");
  }
  return "";
}

}  // namespace

std::optional<Bf16Arithmetic> RequestedBf16Arithmetic() { return ReadBf16Request().arithmetic; }

std::string CpuIsaEnvironmentError() {
  std::string error = CpuIsaVariableError();
  if (error.empty()) error = ReadBf16Request().error;
  return error;
}

bool CpuHasAvx512Vnni() {
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          Has(kAvx512Vl) && Has(kAvx512Vnni) && Has(kF16c);
  return has;
}

std::string CpuFeatureSummary() {
  std::string out;
  for (const Feature& f : kFeatures) {
    if (Has(f)) absl::StrAppend(&out, out.empty() ? "" : " ", f.name);
  }
  return out.empty() ? "none of avx2/fma/avx512" : out;
}

}  // namespace conveyor::kernels
