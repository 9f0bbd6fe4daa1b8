// Helpers the CUDA kernel tests share (kernel_test.cc, quant_linear_test.cc): the compute
// dtypes with their tolerances, rounding to them on the host as the device rounds, error
// measures, the "[ METRIC ]" lines tests/gpu/run.sh tabulates, and buffers on a backend.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <ostream>
#include <string>
#include <vector>

#include "kernels/backend.h"
#include "kernels/cuda/cuda_backend.h"

namespace conveyor::kernels {

struct DtypeParam {
  CudaComputeDtype dtype;
  const char* name;
  double tolerance;      // For ||out - ref|| / ||ref||.
  double row_tolerance;  // For RowMaxError: a few roundings of the largest element.
};

// Names the parameter in test listings (and so in ctest's test names).
inline void PrintTo(const DtypeParam& param, std::ostream* os) { *os << param.name; }

inline const DtypeParam kBf16{CudaComputeDtype::kBf16, "bf16", 1e-2, 2e-2};
inline const DtypeParam kFp16{CudaComputeDtype::kFp16, "fp16", 2e-3, 4e-3};

// Round to nearest even, as the device conversions do.
inline float RoundToBf16(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7f800000u) == 0x7f800000u) return x;  // Inf and NaN stay.
  bits += 0x7fffu + ((bits >> 16) & 1u);
  bits &= 0xffff0000u;
  float rounded;
  std::memcpy(&rounded, &bits, sizeof(rounded));
  return rounded;
}
// The nearest binary16 value (ties to even), as __float2half_rn rounds: 11 significant
// bits for normal halves, a quantum of 2^-24 below them, infinity from 65520 (halfway
// between the largest half, 65504, and 2^16) up. Spelled out rather than through
// _Float16, which not every compiler here supports on x86-64.
inline float RoundToFp16(float x) {
  if (!std::isfinite(x) || x == 0.0f) return x;
  const float a = std::fabs(x);
  if (a >= 65520.0f) return std::copysign(INFINITY, x);
  int exponent = 0;
  std::frexp(a, &exponent);  // a = m * 2^exponent, m in [0.5, 1).
  const float quantum = std::ldexp(1.0f, std::max(exponent - 11, -24));
  return std::copysign(std::nearbyint(a / quantum) * quantum, x);
}

// ||out - ref|| / ||ref||; infinity when `out` holds a NaN or an infinity (an unwritten
// or broken element), or the sizes differ.
inline double RelativeError(const std::vector<float>& out, const std::vector<float>& ref) {
  if (out.size() != ref.size()) return INFINITY;
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!std::isfinite(out[i])) return INFINITY;
    diff += (static_cast<double>(out[i]) - ref[i]) * (static_cast<double>(out[i]) - ref[i]);
    norm += static_cast<double>(ref[i]) * ref[i];
  }
  return norm == 0.0 ? std::sqrt(diff) : std::sqrt(diff / norm);
}

// The worst row's max |out - ref| over that row's max |ref| (the absolute difference
// where a row's reference is all zeros), for rows of `width` elements; infinity when
// `out` holds a NaN or an infinity, or the sizes differ. One wrong element, which
// ||out - ref|| / ||ref|| over a large output averages away, shows here.
inline double RowMaxError(const std::vector<float>& out, const std::vector<float>& ref,
                          size_t width) {
  if (out.size() != ref.size() || width == 0 || out.size() % width != 0) return INFINITY;
  double worst = 0.0;
  for (size_t begin = 0; begin < out.size(); begin += width) {
    double diff = 0.0, scale = 0.0;
    for (size_t i = begin; i < begin + width; ++i) {
      if (!std::isfinite(out[i])) return INFINITY;
      diff = std::max(diff, std::fabs(static_cast<double>(out[i]) - ref[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(ref[i])));
    }
    worst = std::max(worst, scale == 0.0 ? diff : diff / scale);
  }
  return worst;
}

// Elements that differ in bits, treating NaN as equal to NaN (poison left in both).
inline size_t Mismatches(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return std::max(a.size(), b.size());
  size_t count = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const bool both_nan = std::isnan(a[i]) && std::isnan(b[i]);
    if (!both_nan && std::bit_cast<uint32_t>(a[i]) != std::bit_cast<uint32_t>(b[i])) ++count;
  }
  return count;
}

inline void ReportMetric(const std::string& check, const char* dtype, double error,
                         double tolerance) {
  std::printf("[ METRIC   ] %-40s %-5s rel_err=%.3e tol=%.1e %s\n", check.c_str(), dtype, error,
              tolerance, error <= tolerance ? "ok" : "FAIL");
}
// With the worst row's error (RowMaxError) and its tolerance as well.
inline void ReportMetric(const std::string& check, const char* dtype, double error,
                         double tolerance, double row_error, double row_tolerance) {
  const bool ok = error <= tolerance && row_error <= row_tolerance;
  std::printf("[ METRIC   ] %-40s %-5s rel_err=%.3e tol=%.1e row_err=%.3e row_tol=%.1e %s\n",
              check.c_str(), dtype, error, tolerance, row_error, row_tolerance, ok ? "ok" : "FAIL");
}

// Buffers on one backend, freed (before the backend) when this goes out of scope.
class Buffers {
 public:
  explicit Buffers(Backend* backend) : backend_(backend) {}
  Backend& backend() { return *backend_; }

  // Activations in the compute dtype.
  void* Acts(const std::vector<float>& host) {
    return Own(backend_->UploadCompute(host.data(), host.size()).value());
  }
  void* F32(const std::vector<float>& host) {
    return Own(backend_->UploadF32(host.data(), host.size()).value());
  }
  void* Ints(const std::vector<int32_t>& host) {
    void* ptr = Own(backend_->Allocate(std::max<size_t>(1, host.size()) * sizeof(int32_t)).value());
    backend_->CopyToBackend(ptr, host.data(), host.size() * sizeof(int32_t));
    return ptr;
  }
  // `elements` activations of all-ones bits: NaN in float32, bf16 and fp16 alike.
  void* Poisoned(size_t elements) {
    const size_t bytes = std::max<size_t>(1, elements) * backend_->activation_bytes();
    void* ptr = Own(backend_->Allocate(bytes).value());
    const std::vector<unsigned char> poison(bytes, 0xff);
    backend_->CopyToBackend(ptr, poison.data(), bytes);
    return ptr;
  }
  std::vector<float> Read(const void* ptr, size_t count) {
    std::vector<float> host(count);
    backend_->CopyActivationsToHost(host.data(), ptr, count);
    EXPECT_TRUE(backend_->Synchronize().ok());
    return host;
  }

 private:
  void* Own(void* ptr) {
    owned_.emplace_back(ptr, BackendDeleter{backend_});
    return ptr;
  }
  Backend* backend_;
  std::vector<BackendBuffer> owned_;
};

}  // namespace conveyor::kernels
