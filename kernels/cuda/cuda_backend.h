// The CUDA backend: activations, KV cache and weights in device memory in a 16-bit
// compute dtype (bf16 by default, fp16 on request), float32 accumulation in every
// kernel, GEMMs through cuBLASLt, everything else in this folder's own kernels. All
// work is queued on one stream the backend owns.
//
// Errors as kernels/backend.h describes: the first failure of any call (a bad launch, an
// unsupported shape, a cuBLAS error, a fault seen at Synchronize) is kept and returned by
// Synchronize() and last_error().
//
// Copies. CopyToBackend's source may be reused as soon as it returns (small copies are
// staged through a pinned ring, large ones copied by the driver from pageable memory;
// a pinned source of the caller's own must stay untouched until Synchronize()).
// CopyActivationsToHost's destination is complete after Synchronize(). Uploads and
// PackLinear finish before they return.
//
// Batch invariance: every kernel here computes a token's result in an order that
// depends only on that token's data (attention always splits a context into fixed
// 512-position partitions and merges them in order). The GEMMs are cuBLASLt's, whose
// algorithm, and so rounding, may change with the number of rows: the CUDA backend
// as a whole is NOT batch invariant.
//
// This header needs no CUDA headers, so plain C++ code (the worker, tests) can use it.
#pragma once

#include <cstddef>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/backend.h"

namespace conveyor::kernels {

enum class CudaComputeDtype { kBf16, kFp16 };

struct CudaBackendOptions {
  CudaComputeDtype dtype = CudaComputeDtype::kBf16;
  // Device scratch, allocated once: split-KV attention partials and float32 staging for
  // conversions. Larger lets more tokens share one attention launch.
  size_t scratch_bytes = size_t{128} << 20;
  // cuBLASLt workspace (NVIDIA suggests 32 MiB on Hopper).
  size_t gemm_workspace_bytes = size_t{32} << 20;
  // Pinned host ring that CopyToBackend stages through, so metadata copies stay async.
  size_t pinned_staging_bytes = size_t{4} << 20;
};

class CudaBackend : public Backend {
 public:
  // The CUDA device ordinal the backend runs on.
  virtual int device() const = 0;
  virtual CudaComputeDtype dtype() const = 0;
  // The stream every operation is queued on, as a cudaStream_t, for code that queues
  // its own work in order with the backend's (the sampler, NCCL).
  virtual void* stream() const = 0;
  // Fails the backend from outside its own calls, from any thread: a communicator
  // whose peer went away (the collectives it queued will never complete as asked). The
  // first such failure is returned by the next Synchronize() and by last_error() from
  // then on, unless the backend had already failed by itself.
  virtual void ReportFailure(absl::Status status) = 0;
};

// Makes a backend on CUDA device `device`. Fails (never crashes) when there is no
// usable driver or device, or when the device's memory cannot hold the scratch.
absl::StatusOr<std::unique_ptr<CudaBackend>> MakeCudaBackend(
    int device, const CudaBackendOptions& options = CudaBackendOptions());

// Number of usable CUDA devices; 0 (not an error) without a driver or a GPU.
int CudaDeviceCount();

// The device's memory bandwidth as a large device-to-device copy achieves it: bytes read
// plus bytes written per second, the median of `reps` copies of `bytes` (after one
// warm-up copy), timed with events. Copies random-looking data, never zeros.
absl::StatusOr<double> MeasureCopyBandwidth(int device, size_t bytes, int reps);

// Free memory on `device` in bytes, for sizing the KV cache after the weights are
// loaded. Makes `device` current on the calling thread.
absl::StatusOr<size_t> FreeDeviceMemoryBytes(int device = 0);

}  // namespace conveyor::kernels
