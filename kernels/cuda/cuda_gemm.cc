#include "kernels/cuda/cuda_gemm.h"

#include <cstdint>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_status.h"

namespace conveyor::kernels::cuda {
namespace {

// Plans kept before the cache is dropped and rebuilt (shapes vary with the batch).
constexpr size_t kMaxPlans = 8192;

// The largest power of two (at most 256) that divides the address.
int AlignmentOf(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  int alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

cudaDataType_t CudaType(DType dtype) { return dtype == DType::kBf16 ? CUDA_R_16BF : CUDA_R_16F; }

}  // namespace

absl::StatusOr<std::unique_ptr<CudaGemm>> CudaGemm::Create(size_t workspace_bytes) {
  std::unique_ptr<CudaGemm> gemm(new CudaGemm());
  RETURN_IF_ERROR(CublasStatus(cublasLtCreate(&gemm->lt_), "cublasLtCreate"));
  RETURN_IF_ERROR(CublasStatus(cublasCreate(&gemm->blas_), "cublasCreate"));
  if (workspace_bytes > 0) {
    RETURN_IF_ERROR(CudaStatus(cudaMalloc(&gemm->workspace_, workspace_bytes),
                               "cudaMalloc(cuBLASLt workspace)"));
    gemm->workspace_bytes_ = workspace_bytes;
  }
  return gemm;
}

CudaGemm::~CudaGemm() {
  for (auto& [key, plan] : plans_) DestroyPlan(&plan);
  if (workspace_ != nullptr) cudaFree(workspace_);
  if (blas_ != nullptr) cublasDestroy(blas_);
  if (lt_ != nullptr) cublasLtDestroy(lt_);
}

void CudaGemm::DestroyPlan(Plan* plan) {
  if (plan->a != nullptr) cublasLtMatrixLayoutDestroy(plan->a);
  if (plan->b != nullptr) cublasLtMatrixLayoutDestroy(plan->b);
  if (plan->c != nullptr) cublasLtMatrixLayoutDestroy(plan->c);
  if (plan->desc != nullptr) cublasLtMatmulDescDestroy(plan->desc);
  *plan = Plan();
}

absl::StatusOr<bool> CudaGemm::TryLtPlan(const PlanKey& key, cublasLtEpilogue_t epilogue,
                                         const void* bias, Plan* plan) {
  // Row-major y[n, out] = x[n, in] · Wᵀ is column-major yᵀ[out, n] = W[out, in] · xᵀ:
  // A = W, stored column-major as [in, out] (so op(A) = Aᵀ), B = xᵀ as [in, n], C = D = yᵀ
  // (leading dimension ldy).
  const cudaDataType_t type = CudaType(key.dtype);
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescCreate(&plan->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
                   "cublasLtMatmulDescCreate"));
  const cublasOperation_t transpose = CUBLAS_OP_T, no_transpose = CUBLAS_OP_N;
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA,
                                                  &transpose, sizeof(transpose)),
                   "cublasLtMatmulDescSetAttribute(TRANSA)"));
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB,
                                                  &no_transpose, sizeof(no_transpose)),
                   "cublasLtMatmulDescSetAttribute(TRANSB)"));
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                  &epilogue, sizeof(epilogue)),
                   "cublasLtMatmulDescSetAttribute(EPILOGUE)"));
  if (epilogue == CUBLASLT_EPILOGUE_BIAS) {
    // The bias has D's type (the documented default); the heuristic reads the pointer's
    // alignment from this attribute.
    RETURN_IF_ERROR(
        CublasStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof(bias)),
                     "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
  }
  RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->a, type, key.in, key.out, key.in),
                               "cublasLtMatrixLayoutCreate(A)"));
  RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->b, type, key.in, key.n, key.in),
                               "cublasLtMatrixLayoutCreate(B)"));
  RETURN_IF_ERROR(CublasStatus(cublasLtMatrixLayoutCreate(&plan->c, type, key.out, key.n, key.ldy),
                               "cublasLtMatrixLayoutCreate(C)"));

  cublasLtMatmulPreference_t preference = nullptr;
  RETURN_IF_ERROR(
      CublasStatus(cublasLtMatmulPreferenceCreate(&preference), "cublasLtMatmulPreferenceCreate"));
  const uint64_t workspace = workspace_bytes_;
  const uint32_t align_a = key.align_w, align_b = key.align_x, align_c = key.align_y;
  cublasStatus_t status = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace));
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof(align_a));
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof(align_b));
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof(align_c));
  }
  if (status == CUBLAS_STATUS_SUCCESS) {
    status = cublasLtMatmulPreferenceSetAttribute(
        preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_c, sizeof(align_c));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  if (status == CUBLAS_STATUS_SUCCESS) {
    // "No algorithm" comes back as NOT_SUPPORTED or as zero results: both mean fall back.
    const cublasStatus_t heuristic = cublasLtMatmulAlgoGetHeuristic(
        lt_, plan->desc, plan->a, plan->b, plan->c, plan->c, preference, 1, &result, &found);
    if (heuristic != CUBLAS_STATUS_SUCCESS) found = 0;
  }
  cublasLtMatmulPreferenceDestroy(preference);
  RETURN_IF_ERROR(CublasStatus(status, "cublasLtMatmulPreferenceSetAttribute"));
  if (found == 0) return false;
  plan->algo = result.algo;
  plan->use_lt = true;
  plan->fused_bias = epilogue == CUBLASLT_EPILOGUE_BIAS;
  return true;
}

absl::StatusOr<const CudaGemm::Plan*> CudaGemm::GetPlan(const PlanKey& key, const void* bias) {
  if (auto it = plans_.find(key); it != plans_.end()) return &it->second;
  if (plans_.size() >= kMaxPlans) {
    for (auto& [k, plan] : plans_) DestroyPlan(&plan);
    plans_.clear();
  }
  Plan plan;
  // Prefer the fused bias; then cuBLASLt without it; then cublasGemmEx.
  absl::StatusOr<bool> found = false;
  if (key.has_bias) {
    found = TryLtPlan(key, CUBLASLT_EPILOGUE_BIAS, bias, &plan);
    if (!found.ok() || !*found) DestroyPlan(&plan);
  }
  if (found.ok() && !*found) {
    found = TryLtPlan(key, CUBLASLT_EPILOGUE_DEFAULT, nullptr, &plan);
    if (!found.ok() || !*found) DestroyPlan(&plan);
  }
  if (!found.ok()) return found.status();
  return &plans_.emplace(key, plan).first->second;
}

absl::Status CudaGemm::Linear(const void* x, int n, const void* weight, int out, int in,
                              const void* bias, void* y, int ldy, DType dtype,
                              cudaStream_t stream) {
  if (n <= 0) return absl::OkStatus();
  if (ldy < out) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaGemm::Linear: output row stride ", ldy, " < ", out, " columns"));
  }
  const PlanKey key{n,
                    out,
                    in,
                    ldy,
                    dtype,
                    bias != nullptr,
                    AlignmentOf(x),
                    AlignmentOf(weight),
                    AlignmentOf(y),
                    bias != nullptr ? AlignmentOf(bias) : 0};
  ASSIGN_OR_RETURN(const Plan* plan, GetPlan(key, bias));
  const float alpha = 1.0f, beta = 0.0f;
  if (plan->use_lt) {
    if (plan->fused_bias) {
      // Plans are shared by every weight of this shape: point the epilogue at ours.
      RETURN_IF_ERROR(
          CublasStatus(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                      &bias, sizeof(bias)),
                       "cublasLtMatmulDescSetAttribute(BIAS_POINTER)"));
    }
    RETURN_IF_ERROR(CublasStatus(
        cublasLtMatmul(lt_, plan->desc, &alpha, weight, plan->a, x, plan->b, &beta, y, plan->c, y,
                       plan->c, &plan->algo, workspace_, workspace_bytes_, stream),
        "cublasLtMatmul"));
  } else {
    const cudaDataType_t type = CudaType(dtype);
    RETURN_IF_ERROR(CublasStatus(cublasSetStream(blas_, stream), "cublasSetStream"));
    RETURN_IF_ERROR(CublasStatus(
        cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, weight, type, in, x, type,
                     in, &beta, y, type, ldy, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmEx"));
  }
  if (bias != nullptr && !plan->fused_bias) {
    RETURN_IF_ERROR(
        CudaStatus(LaunchAddBias(y, bias, n, out, ldy, dtype, stream), "AddBias launch"));
  }
  return absl::OkStatus();
}

}  // namespace conveyor::kernels::cuda
