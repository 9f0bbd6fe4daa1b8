// Linear layers on the GPU: y[n, out] = x[n, in] · Wᵀ (+ bias), operands and result in
// the 16-bit compute dtype, float32 accumulation. Runs through cuBLASLt with the bias
// fused into its epilogue; when cuBLASLt offers no algorithm for a shape it falls back
// to cublasGemmEx and a separate bias kernel. Plans (descriptors and the chosen
// algorithm) are cached per shape, so the heuristic runs once per batch size.
//
// Not batch invariant: cuBLASLt may pick a different algorithm for each row count.
// Not thread-safe: one CudaGemm per backend, called from one thread.
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <map>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/cuda/kernels.h"

namespace conveyor::kernels::cuda {

class CudaGemm {
 public:
  // Creates the cuBLAS handles and a `workspace_bytes` workspace on the current device.
  static absl::StatusOr<std::unique_ptr<CudaGemm>> Create(size_t workspace_bytes);
  ~CudaGemm();
  CudaGemm(const CudaGemm&) = delete;
  CudaGemm& operator=(const CudaGemm&) = delete;

  // Queues y[n, out] = x[n, in] · weight[out, in]ᵀ (+ bias[out] if not null) on
  // `stream`. All row-major, all in `dtype`; x and weight contiguous, y's rows `ldy`
  // (>= out) elements apart (a column slice of a wider output when larger).
  absl::Status Linear(const void* x, int n, const void* weight, int out, int in, const void* bias,
                      void* y, int ldy, DType dtype, cudaStream_t stream);

 private:
  // What a plan depends on: the shape, y's row stride, the dtype, the bias and the
  // pointers' alignment (cuBLASLt kernels may require 16-byte or wider alignment).
  struct PlanKey {
    int n, out, in, ldy;
    DType dtype;
    bool has_bias;
    int align_x, align_w, align_y, align_bias;
    bool operator<(const PlanKey& o) const {
      return std::tie(n, out, in, ldy, dtype, has_bias, align_x, align_w, align_y, align_bias) <
             std::tie(o.n, o.out, o.in, o.ldy, o.dtype, o.has_bias, o.align_x, o.align_w, o.align_y,
                      o.align_bias);
    }
  };
  struct Plan {
    bool use_lt = false;      // false: cublasGemmEx.
    bool fused_bias = false;  // The epilogue adds the bias.
    cublasLtMatmulDesc_t desc = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  CudaGemm() = default;
  absl::StatusOr<const Plan*> GetPlan(const PlanKey& key, const void* bias);
  // Fills `plan` with a cuBLASLt algorithm (epilogue `epilogue`) if there is one.
  absl::StatusOr<bool> TryLtPlan(const PlanKey& key, cublasLtEpilogue_t epilogue, const void* bias,
                                 Plan* plan);
  static void DestroyPlan(Plan* plan);

  cublasLtHandle_t lt_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  void* workspace_ = nullptr;
  size_t workspace_bytes_ = 0;
  std::map<PlanKey, Plan> plans_;
};

}  // namespace conveyor::kernels::cuda
