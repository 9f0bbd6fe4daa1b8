// The CUDA backend (cuda_backend.h): owns the stream, device scratch, a pinned staging
// ring for host-to-device metadata copies and the cuBLASLt GEMM; dispatches every
// operation to the launchers in kernels.h and records the first error.
//
// Plain C++ (no device code), so it compiles with the host compiler; the kernels live
// in the .cu files beside it.
#include "kernels/cuda/cuda_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_gemm.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernels.h"
#include "kernels/cuda/quant_layout.h"

namespace conveyor::kernels {
namespace {

using cuda::CudaStatus;
using cuda::DType;

// Smallest scratch that still holds a useful conversion chunk.
constexpr size_t kMinScratchBytes = size_t{1} << 20;
// Host staging slices are padded to this, keeping each copy's source aligned.
constexpr size_t kStagingAlignment = 256;

class CudaLinearWeight final : public LinearWeight {
 public:
  CudaLinearWeight(int device, int out, int in, size_t element_bytes, void* weight, void* bias)
      : device_(device),
        out_(out),
        in_(in),
        element_bytes_(element_bytes),
        weight_(weight),
        bias_(bias) {}
  ~CudaLinearWeight() override {
    cudaSetDevice(device_);
    cudaFree(weight_);
    if (bias_ != nullptr) cudaFree(bias_);
  }
  CudaLinearWeight(const CudaLinearWeight&) = delete;
  CudaLinearWeight& operator=(const CudaLinearWeight&) = delete;

  int out_features() const override { return out_; }
  int in_features() const override { return in_; }
  size_t size_bytes() const override {
    return (static_cast<size_t>(out_) * in_ + (bias_ != nullptr ? out_ : 0)) * element_bytes_;
  }
  const void* weight() const { return weight_; }
  const void* bias() const { return bias_; }  // Null when the layer has none.

 private:
  int device_;
  int out_;
  int in_;
  size_t element_bytes_;
  void* weight_;  // [out, in], compute dtype.
  void* bias_;    // [out], compute dtype (cuBLASLt's epilogue wants D's type).
};

// A GGUF block-quantized weight in the layout of quant_layout.h: one device allocation
// holding each part's codes, scales and mins, and the bias in the compute dtype.
class CudaQuantLinearWeight final : public LinearWeight {
 public:
  // A part's rows [row_begin, row_begin + kernel.rows) of the weight.
  struct Part {
    int row_begin = 0;
    cuda::QuantLinearPart kernel;
  };

  CudaQuantLinearWeight(int device, int out, int in, void* memory, size_t memory_bytes,
                        std::vector<Part> parts, void* bias, size_t bias_bytes)
      : device_(device),
        out_(out),
        in_(in),
        memory_(memory),
        bytes_(memory_bytes + bias_bytes),
        parts_(std::move(parts)),
        bias_(bias) {}
  ~CudaQuantLinearWeight() override {
    cudaSetDevice(device_);
    cudaFree(memory_);
    if (bias_ != nullptr) cudaFree(bias_);
  }
  CudaQuantLinearWeight(const CudaQuantLinearWeight&) = delete;
  CudaQuantLinearWeight& operator=(const CudaQuantLinearWeight&) = delete;

  int out_features() const override { return out_; }
  int in_features() const override { return in_; }
  size_t size_bytes() const override { return bytes_; }
  const std::vector<Part>& parts() const { return parts_; }
  const void* bias() const { return bias_; }  // Null when the layer has none.

 private:
  int device_;
  int out_;
  int in_;
  void* memory_;
  size_t bytes_;
  std::vector<Part> parts_;  // Pointers into memory_.
  void* bias_;               // [out], compute dtype.
};

class CudaBackendImpl final : public CudaBackend {
 public:
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(int device,
                                                             const CudaBackendOptions& options);
  ~CudaBackendImpl() override;
  CudaBackendImpl(const CudaBackendImpl&) = delete;
  CudaBackendImpl& operator=(const CudaBackendImpl&) = delete;

  std::string name() const override { return name_; }
  size_t activation_bytes() const override { return cuda::DTypeBytes(dtype_); }
  absl::Status last_error() const override {
    if (error_.ok() && reported_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(reported_mu_);
      return reported_error_;
    }
    return error_;
  }
  void ReportFailure(absl::Status status) override {
    if (status.ok()) return;
    std::lock_guard<std::mutex> lock(reported_mu_);
    if (reported_.load(std::memory_order_relaxed)) return;
    reported_error_ = std::move(status);
    reported_.store(true, std::memory_order_release);
  }
  int device() const override { return device_; }
  CudaComputeDtype dtype() const override {
    return dtype_ == DType::kBf16 ? CudaComputeDtype::kBf16 : CudaComputeDtype::kFp16;
  }
  void* stream() const override { return stream_; }

  absl::StatusOr<void*> Allocate(size_t bytes) override;
  void Free(void* ptr) override;
  void CopyToBackend(void* dst, const void* host_src, size_t bytes) override;
  void CopyActivationsToHost(float* host_dst, const void* src, size_t count) override;
  absl::Status Synchronize() override;

  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinear(const float* weight, int out_features,
                                                           int in_features,
                                                           const float* bias) override;
  absl::StatusOr<std::unique_ptr<LinearWeight>> PackLinearQuantized(
      std::span<const QuantizedRows> parts, int in_features, const float* bias) override;
  absl::StatusOr<void*> UploadCompute(const float* host, size_t count) override;
  absl::StatusOr<void*> UploadF32(const float* host, size_t count) override;

  void Embedding(const void* table, int hidden, const int32_t* ids, int n, void* out) override;
  void RmsNorm(const void* x, const void* weight, int n, int hidden, float eps, void* out) override;
  void AddRmsNorm(void* residual, const void* x, const void* weight, int n, int hidden, float eps,
                  void* out) override;
  void Linear(const void* x, int n, const LinearWeight& weight, void* out) override;
  void Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
            const void* rope_table, int max_positions, const AttentionShape& shape) override;
  void WriteKv(const void* k, const void* v, int n, int row_stride, const int32_t* slot_mapping,
               const AttentionShape& shape, KvLayer layer) override;
  void PagedAttention(const void* q, int q_row_stride, const AttentionBatch& batch,
                      const AttentionShape& shape, KvLayer layer, void* out) override;
  void SiluMul(const void* gate_up, int n, int ffn, void* out) override;
  void GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows, void* out) override;
  void HeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim, const void* weight,
                   float eps) override;
  void WeightedRowSum(const void* rows, int width, const int32_t* sources, const float* weights,
                      int n, int k, void* out) override;

  bool supports_graphs() const override { return true; }
  absl::Status BeginCapture() override;
  absl::StatusOr<int> EndCapture() override;
  void Replay(int graph) override;
  void DropGraphs() override;

 private:
  CudaBackendImpl(int device, DType dtype) : device_(device), dtype_(dtype) {}

  // Keeps the first error; later ones are usually its consequences.
  void Record(absl::Status status) {
    if (!status.ok() && error_.ok()) error_ = std::move(status);
  }
  void RecordCuda(cudaError_t err, const char* what) {
    if (err != cudaSuccess) Record(CudaStatus(err, what));
  }
  // Makes this backend's device current on the calling thread.
  void Activate() { RecordCuda(cudaSetDevice(device_), "cudaSetDevice"); }
  // Allocates `count` compute-dtype elements and fills them from float32 `host`.
  absl::StatusOr<void*> UploadConverted(const float* host, size_t count);
  // Linear on a block-quantized weight: the fused GEMV for up to kMaxQuantGemvTokens
  // rows, else tiles of the weight dequantized into the scratch, each through the GEMM.
  void LinearQuantized(const void* x, int n, const CudaQuantLinearWeight& weight, void* out);
  // Rows of a dequantized weight tile that fit the scratch (0: not one).
  int QuantTileRows(int out_features, int in_features) const;

  const int device_;
  const DType dtype_;
  std::string name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<cuda::CudaGemm> gemm_;
  float* scratch_ = nullptr;  // Device; attention partials and conversion staging.
  size_t scratch_bytes_ = 0;
  char* staging_ = nullptr;  // Pinned host ring for CopyToBackend.
  size_t staging_bytes_ = 0;
  size_t staging_used_ = 0;  // Bytes of the ring in use since the last synchronization.
  absl::Status error_;
  // ReportFailure's, kept apart from error_ (which only the calling thread touches).
  mutable std::mutex reported_mu_;
  std::atomic<bool> reported_{false};
  absl::Status reported_error_;          // Guarded by reported_mu_.
  std::vector<cudaGraphExec_t> graphs_;  // Replay(id) runs graphs_[id].
  bool capturing_ = false;
};

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackendImpl::Create(
    int device, const CudaBackendOptions& options) {
  const int count = CudaDeviceCount();
  if (count == 0) {
    return absl::UnavailableError("no usable CUDA device (no GPU, or no or too old a driver)");
  }
  if (device < 0 || device >= count) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist (", count, " present)"));
  }
  if (options.scratch_bytes < kMinScratchBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackendOptions::scratch_bytes must be at least ", kMinScratchBytes));
  }
  const DType dtype = options.dtype == CudaComputeDtype::kFp16 ? DType::kFp16 : DType::kBf16;
  std::unique_ptr<CudaBackendImpl> backend(new CudaBackendImpl(device, dtype));
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  cudaDeviceProp prop{};
  RETURN_IF_ERROR(CudaStatus(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties"));
  backend->name_ =
      absl::StrCat("cuda(", prop.name, ", ", dtype == DType::kBf16 ? "bf16" : "fp16", ")");
  // Non-blocking: the legacy default stream must not serialize with our work.
  RETURN_IF_ERROR(CudaStatus(cudaStreamCreateWithFlags(&backend->stream_, cudaStreamNonBlocking),
                             "cudaStreamCreateWithFlags"));
  ASSIGN_OR_RETURN(backend->gemm_, cuda::CudaGemm::Create(options.gemm_workspace_bytes));
  void* scratch = nullptr;
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&scratch, options.scratch_bytes), "cudaMalloc(scratch)"));
  backend->scratch_ = static_cast<float*>(scratch);
  backend->scratch_bytes_ = options.scratch_bytes;
  if (options.pinned_staging_bytes > 0) {
    void* staging = nullptr;
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&staging, options.pinned_staging_bytes),
                               "cudaMallocHost(staging)"));
    backend->staging_ = static_cast<char*>(staging);
    backend->staging_bytes_ = options.pinned_staging_bytes;
  }
  return backend;
}

CudaBackendImpl::~CudaBackendImpl() {
  cudaSetDevice(device_);
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  DropGraphs();
  gemm_.reset();
  if (scratch_ != nullptr) cudaFree(scratch_);
  if (staging_ != nullptr) cudaFreeHost(staging_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::StatusOr<void*> CudaBackendImpl::Allocate(size_t bytes) {
  Activate();
  void* ptr = nullptr;
  // cudaMalloc aligns to 256 bytes; a zero-byte request still gets a real pointer.
  const cudaError_t err = cudaMalloc(&ptr, std::max<size_t>(bytes, 256));
  if (err != cudaSuccess) {
    cudaGetLastError();  // Out of memory is not sticky: clear it so later calls work.
    return CudaStatus(err, absl::StrCat("cudaMalloc(", bytes, " bytes)").c_str());
  }
  return ptr;
}

void CudaBackendImpl::Free(void* ptr) {
  if (ptr == nullptr) return;
  Activate();
  RecordCuda(cudaFree(ptr), "cudaFree");
}

void CudaBackendImpl::CopyToBackend(void* dst, const void* host_src, size_t bytes) {
  if (bytes == 0) return;
  Activate();
  if (bytes > staging_bytes_) {
    // From pageable memory cudaMemcpyAsync returns once the driver has staged the
    // source, so the caller may reuse it, as with the CPU backend.
    RecordCuda(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, stream_),
               "cudaMemcpyAsync(host to device)");
    return;
  }
  const size_t slice = (bytes + kStagingAlignment - 1) / kStagingAlignment * kStagingAlignment;
  if (staging_used_ + slice > staging_bytes_) {
    // The ring is full of copies that may still be queued: wait for them.
    RecordCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(staging)");
    staging_used_ = 0;
  }
  char* staged = staging_ + staging_used_;
  staging_used_ += slice;
  std::memcpy(staged, host_src, bytes);
  RecordCuda(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream_),
             "cudaMemcpyAsync(staging to device)");
}

void CudaBackendImpl::CopyActivationsToHost(float* host_dst, const void* src, size_t count) {
  if (count == 0) return;
  Activate();
  // Converted on the device through the scratch, one scratch-full at a time; stream
  // order keeps a chunk's conversion from overwriting the previous chunk's copy.
  const size_t chunk = scratch_bytes_ / sizeof(float);
  const char* src_bytes = static_cast<const char*>(src);
  for (size_t done = 0; done < count; done += chunk) {
    const size_t m = std::min(chunk, count - done);
    RecordCuda(cuda::LaunchComputeToF32(src_bytes + done * activation_bytes(), scratch_, m, dtype_,
                                        stream_),
               "ComputeToF32 launch");
    RecordCuda(cudaMemcpyAsync(host_dst + done, scratch_, m * sizeof(float), cudaMemcpyDeviceToHost,
                               stream_),
               "cudaMemcpyAsync(device to host)");
  }
}

absl::Status CudaBackendImpl::Synchronize() {
  Activate();
  RecordCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  staging_used_ = 0;
  if (error_.ok() && reported_.load(std::memory_order_acquire)) Record(last_error());
  return error_;
}

absl::StatusOr<void*> CudaBackendImpl::UploadConverted(const float* host, size_t count) {
  ASSIGN_OR_RETURN(void* dst, Allocate(count * activation_bytes()));
  const size_t chunk = scratch_bytes_ / sizeof(float);
  absl::Status status;
  for (size_t done = 0; done < count && status.ok(); done += chunk) {
    const size_t m = std::min(chunk, count - done);
    status = CudaStatus(
        cudaMemcpyAsync(scratch_, host + done, m * sizeof(float), cudaMemcpyHostToDevice, stream_),
        "cudaMemcpyAsync(upload)");
    if (status.ok()) {
      status = CudaStatus(
          cuda::LaunchF32ToCompute(scratch_, static_cast<char*>(dst) + done * activation_bytes(), m,
                                   dtype_, stream_),
          "F32ToCompute launch");
    }
  }
  // Uploads happen at load time: finish here so errors surface as this call's status.
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (!status.ok()) {
    cudaFree(dst);
    return status;
  }
  return dst;
}

absl::StatusOr<std::unique_ptr<LinearWeight>> CudaBackendImpl::PackLinear(const float* weight,
                                                                          int out_features,
                                                                          int in_features,
                                                                          const float* bias) {
  if (out_features <= 0 || in_features <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackLinear: bad shape ", out_features, "x", in_features));
  }
  Activate();
  ASSIGN_OR_RETURN(void* w,
                   UploadConverted(weight, static_cast<size_t>(out_features) * in_features));
  void* b = nullptr;
  if (bias != nullptr) {
    absl::StatusOr<void*> uploaded = UploadConverted(bias, out_features);
    if (!uploaded.ok()) {
      cudaFree(w);
      return uploaded.status();
    }
    b = *uploaded;
  }
  return std::make_unique<CudaLinearWeight>(device_, out_features, in_features, activation_bytes(),
                                            w, b);
}

int CudaBackendImpl::QuantTileRows(int out_features, int in_features) const {
  const size_t fit = scratch_bytes_ / (static_cast<size_t>(in_features) * activation_bytes());
  if (fit >= static_cast<size_t>(out_features)) return out_features;
  // Whole multiples of 64 rows keep every tile's output columns 128-byte aligned.
  return static_cast<int>(fit >= 64 ? fit - fit % 64 : fit);
}

absl::StatusOr<std::unique_ptr<LinearWeight>> CudaBackendImpl::PackLinearQuantized(
    std::span<const QuantizedRows> parts, int in_features, const float* bias) {
  if (parts.empty()) return absl::InvalidArgumentError("PackLinearQuantized: no parts");
  // Where each part's arrays go in one allocation, each at a 256-byte boundary; checked
  // (RepackQuantizedRows below checks the rest) before anything is allocated.
  constexpr size_t kAlign = 256;
  auto aligned = [](size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; };
  struct Sections {
    size_t codes, scales, mins;
  };
  std::vector<Sections> offsets;
  size_t total = 0;
  int64_t out = 0;
  for (const QuantizedRows& part : parts) {
    if (part.rows <= 0 || in_features <= 0 || in_features % QuantBlockElements(part.type) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "PackLinearQuantized: a part of ", part.rows, " rows of ", QuantBlockTypeName(part.type),
          " blocks ", in_features, " weights wide (rows must be whole blocks)"));
    }
    const cuda::GpuQuantFormat f = cuda::GpuQuantFormatOf(part.type);
    const size_t rows = static_cast<size_t>(part.rows);
    const size_t scale_bytes = rows * (in_features / f.group) * sizeof(float);
    Sections s;
    s.codes = total;
    total += aligned(rows * cuda::GpuQuantCodeBytesPerRow(f, in_features));
    s.scales = total;
    total += aligned(scale_bytes);
    s.mins = total;
    if (f.has_min) total += aligned(scale_bytes);
    offsets.push_back(s);
    out += part.rows;
  }
  if (out > std::numeric_limits<int>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("PackLinearQuantized: ", out, " output features is too many"));
  }
  if (QuantTileRows(static_cast<int>(out), in_features) == 0) {
    return absl::InvalidArgumentError(absl::StrCat("PackLinearQuantized: one row of ", in_features,
                                                   " weights does not fit the ", scratch_bytes_,
                                                   "-byte scratch it is dequantized into; raise "
                                                   "CudaBackendOptions::scratch_bytes"));
  }
  Activate();
  ASSIGN_OR_RETURN(void* memory, Allocate(total));
  auto* base = static_cast<char*>(memory);
  absl::Cleanup free_memory = [memory] { cudaFree(memory); };
  std::vector<CudaQuantLinearWeight::Part> packed;
  int row = 0;
  // Part by part, so the host holds one part's repacked copy at a time.
  for (size_t i = 0; i < parts.size(); ++i) {
    ASSIGN_OR_RETURN(cuda::GpuQuantRows rows, cuda::RepackQuantizedRows(parts[i], in_features));
    auto upload = [&](size_t offset, const void* host, size_t bytes) {
      return CudaStatus(
          cudaMemcpyAsync(base + offset, host, bytes, cudaMemcpyHostToDevice, stream_),
          "cudaMemcpyAsync(quantized weight)");
    };
    RETURN_IF_ERROR(upload(offsets[i].codes, rows.codes.data(), rows.codes.size()));
    RETURN_IF_ERROR(
        upload(offsets[i].scales, rows.scales.data(), rows.scales.size() * sizeof(float)));
    if (rows.format.has_min) {
      RETURN_IF_ERROR(upload(offsets[i].mins, rows.mins.data(), rows.mins.size() * sizeof(float)));
    }
    // The host arrays must outlive the copies.
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"));
    CudaQuantLinearWeight::Part part;
    part.row_begin = row;
    part.kernel.codes = reinterpret_cast<const uint8_t*>(base + offsets[i].codes);
    part.kernel.scales = reinterpret_cast<const float*>(base + offsets[i].scales);
    part.kernel.mins =
        rows.format.has_min ? reinterpret_cast<const float*>(base + offsets[i].mins) : nullptr;
    part.kernel.rows = rows.rows;
    part.kernel.in = in_features;
    part.kernel.bits = rows.format.bits;
    part.kernel.group = rows.format.group;
    part.kernel.zero = rows.format.zero;
    if (const char* why = cuda::CheckQuantLinearPart(part.kernel); why != nullptr) {
      return absl::InternalError(absl::StrCat("PackLinearQuantized: ", why));
    }
    packed.push_back(part);
    row += rows.rows;
  }
  void* device_bias = nullptr;
  if (bias != nullptr) {
    ASSIGN_OR_RETURN(device_bias, UploadConverted(bias, out));
  }
  std::move(free_memory).Cancel();
  return std::make_unique<CudaQuantLinearWeight>(device_, static_cast<int>(out), in_features,
                                                 memory, total, std::move(packed), device_bias,
                                                 bias != nullptr ? out * activation_bytes() : 0);
}

void CudaBackendImpl::LinearQuantized(const void* x, int n, const CudaQuantLinearWeight& weight,
                                      void* out) {
  if (n <= 0) return;
  const int out_features = weight.out_features(), in = weight.in_features();
  const size_t e = activation_bytes();
  const char* bias = static_cast<const char*>(weight.bias());
  char* y = static_cast<char*>(out);
  if (n <= cuda::kMaxQuantGemvTokens) {
    for (const CudaQuantLinearWeight::Part& part : weight.parts()) {
      RecordCuda(cuda::LaunchQuantGemv(part.kernel, x, n,
                                       bias != nullptr ? bias + part.row_begin * e : nullptr,
                                       y + part.row_begin * e, out_features, dtype_, stream_),
                 "QuantGemv launch");
    }
    return;
  }
  // Stream order keeps a tile's dequantization from overwriting the previous tile before
  // its GEMM has read it.
  const int tile = QuantTileRows(out_features, in);  // > 0: PackLinearQuantized checked.
  for (int begin = 0; begin < out_features; begin += tile) {
    const int end = std::min(out_features, begin + tile);
    for (const CudaQuantLinearWeight::Part& part : weight.parts()) {
      const int from = std::max(begin, part.row_begin);
      const int to = std::min(end, part.row_begin + part.kernel.rows);
      if (from >= to) continue;
      RecordCuda(cuda::LaunchQuantDequantize(
                     part.kernel, from - part.row_begin, to - from,
                     reinterpret_cast<char*>(scratch_) + static_cast<size_t>(from - begin) * in * e,
                     dtype_, stream_),
                 "QuantDequantize launch");
    }
    Record(gemm_->Linear(x, n, scratch_, end - begin, in,
                         bias != nullptr ? bias + static_cast<size_t>(begin) * e : nullptr,
                         y + static_cast<size_t>(begin) * e, out_features, dtype_, stream_));
  }
}

absl::StatusOr<void*> CudaBackendImpl::UploadCompute(const float* host, size_t count) {
  Activate();
  return UploadConverted(host, count);
}

absl::StatusOr<void*> CudaBackendImpl::UploadF32(const float* host, size_t count) {
  ASSIGN_OR_RETURN(void* dst, Allocate(count * sizeof(float)));
  absl::Status status =
      CudaStatus(cudaMemcpyAsync(dst, host, count * sizeof(float), cudaMemcpyHostToDevice, stream_),
                 "cudaMemcpyAsync(upload f32)");
  if (status.ok()) status = CudaStatus(cudaStreamSynchronize(stream_), "cudaStreamSynchronize");
  if (!status.ok()) {
    cudaFree(dst);
    return status;
  }
  return dst;
}

void CudaBackendImpl::Embedding(const void* table, int hidden, const int32_t* ids, int n,
                                void* out) {
  Activate();
  RecordCuda(cuda::LaunchGatherRows(table, hidden, ids, n, out, dtype_, stream_),
             "Embedding launch");
}

void CudaBackendImpl::RmsNorm(const void* x, const void* weight, int n, int hidden, float eps,
                              void* out) {
  Activate();
  RecordCuda(cuda::LaunchRmsNorm(x, static_cast<const float*>(weight), n, hidden, eps, out, dtype_,
                                 stream_),
             "RmsNorm launch");
}

void CudaBackendImpl::AddRmsNorm(void* residual, const void* x, const void* weight, int n,
                                 int hidden, float eps, void* out) {
  Activate();
  RecordCuda(cuda::LaunchAddRmsNorm(residual, x, static_cast<const float*>(weight), n, hidden, eps,
                                    out, dtype_, stream_),
             "AddRmsNorm launch");
}

void CudaBackendImpl::Linear(const void* x, int n, const LinearWeight& weight, void* out) {
  Activate();
  if (const auto* quantized = dynamic_cast<const CudaQuantLinearWeight*>(&weight)) {
    LinearQuantized(x, n, *quantized, out);
    return;
  }
  const auto& w = static_cast<const CudaLinearWeight&>(weight);
  Record(gemm_->Linear(x, n, w.weight(), w.out_features(), w.in_features(), w.bias(), out,
                       w.out_features(), dtype_, stream_));
}

void CudaBackendImpl::Rope(void* q, void* k, int n, int row_stride, const int32_t* positions,
                           const void* rope_table, int max_positions, const AttentionShape& shape) {
  if (shape.head_dim % 2 != 0) {
    Record(absl::InvalidArgumentError(absl::StrCat("Rope: odd head_dim ", shape.head_dim)));
    return;
  }
  Activate();
  RecordCuda(cuda::LaunchRope(q, k, n, row_stride, positions, static_cast<const float*>(rope_table),
                              max_positions, shape.num_heads, shape.num_kv_heads, shape.head_dim,
                              dtype_, stream_),
             "Rope launch");
}

void CudaBackendImpl::WriteKv(const void* k, const void* v, int n, int row_stride,
                              const int32_t* slot_mapping, const AttentionShape& shape,
                              KvLayer layer) {
  Activate();
  RecordCuda(cuda::LaunchWriteKv(k, v, n, row_stride, shape.num_kv_heads * shape.head_dim,
                                 slot_mapping, layer.k, layer.v, dtype_, stream_),
             "WriteKv launch");
}

void CudaBackendImpl::PagedAttention(const void* q, int q_row_stride, const AttentionBatch& batch,
                                     const AttentionShape& shape, KvLayer layer, void* out) {
  if (batch.num_tokens <= 0) return;
  cuda::PagedAttentionArgs args;
  args.q = q;
  args.q_row_stride = q_row_stride;
  args.k_cache = layer.k;
  args.v_cache = layer.v;
  args.out = out;
  args.token_seq = batch.token_seq;
  args.token_pos = batch.token_pos;
  args.block_tables = batch.block_tables;
  args.num_tokens = batch.num_tokens;
  args.max_blocks_per_seq = batch.max_blocks_per_seq;
  args.block_size = batch.block_size;
  args.num_heads = shape.num_heads;
  args.num_kv_heads = shape.num_kv_heads;
  args.head_dim = shape.head_dim;
  args.scale = shape.scale;
  if (const char* why = cuda::CheckPagedAttentionShape(args, dtype_); why != nullptr) {
    Record(absl::InvalidArgumentError(absl::StrCat("PagedAttention: ", why)));
    return;
  }
  // Split-KV partials go to the scratch; when they do not fit for the whole batch the
  // tokens are processed in several launches (same math, so the same bits).
  int tokens_per_launch = batch.num_tokens;
  if (const size_t per_token = cuda::PagedAttentionScratchBytesPerToken(args); per_token > 0) {
    const size_t fit = scratch_bytes_ / per_token;
    if (fit == 0) {
      Record(absl::ResourceExhaustedError(
          absl::StrCat("PagedAttention: one token's split-KV partials need ", per_token,
                       " bytes but the scratch has ", scratch_bytes_,
                       "; raise CudaBackendOptions::scratch_bytes")));
      return;
    }
    tokens_per_launch = static_cast<int>(std::min<size_t>(fit, batch.num_tokens));
  }
  Activate();
  RecordCuda(cuda::LaunchPagedAttention(args, scratch_, tokens_per_launch, dtype_, stream_),
             "PagedAttention launch");
}

void CudaBackendImpl::SiluMul(const void* gate_up, int n, int ffn, void* out) {
  Activate();
  RecordCuda(cuda::LaunchSiluMul(gate_up, n, ffn, out, dtype_, stream_), "SiluMul launch");
}

void CudaBackendImpl::GatherRows(const void* x, int hidden, const int32_t* rows, int n_rows,
                                 void* out) {
  Activate();
  RecordCuda(cuda::LaunchGatherRows(x, hidden, rows, n_rows, out, dtype_, stream_),
             "GatherRows launch");
}

void CudaBackendImpl::HeadRmsNorm(void* x, int n, int row_stride, int num_heads, int head_dim,
                                  const void* weight, float eps) {
  Activate();
  RecordCuda(cuda::LaunchHeadRmsNorm(x, n, row_stride, num_heads, head_dim,
                                     static_cast<const float*>(weight), eps, dtype_, stream_),
             "HeadRmsNorm launch");
}

void CudaBackendImpl::WeightedRowSum(const void* rows, int width, const int32_t* sources,
                                     const float* weights, int n, int k, void* out) {
  Activate();
  RecordCuda(cuda::LaunchWeightedRowSum(rows, width, sources, weights, n, k, out, dtype_, stream_),
             "WeightedRowSum launch");
}

absl::Status CudaBackendImpl::BeginCapture() {
  RETURN_IF_ERROR(error_);
  if (capturing_) return absl::FailedPreconditionError("a capture is already under way");
  Activate();
  // Thread-local: other threads' unrelated CUDA calls (a metrics scrape asking for free
  // memory) must not invalidate the capture.
  RETURN_IF_ERROR(CudaStatus(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal),
                             "cudaStreamBeginCapture"));
  capturing_ = true;
  return absl::OkStatus();
}

absl::StatusOr<int> CudaBackendImpl::EndCapture() {
  if (!capturing_) return absl::FailedPreconditionError("no capture is under way");
  capturing_ = false;
  Activate();
  cudaGraph_t graph = nullptr;
  // Ends the capture even when an operation failed during it, so the stream works again.
  const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
  absl::Cleanup destroy = [graph] {
    if (graph != nullptr) cudaGraphDestroy(graph);
  };
  RETURN_IF_ERROR(error_);
  RETURN_IF_ERROR(CudaStatus(end, "cudaStreamEndCapture"));
  cudaGraphExec_t exec = nullptr;
  RETURN_IF_ERROR(
      CudaStatus(cudaGraphInstantiate(&exec, graph, /*flags=*/0), "cudaGraphInstantiate"));
  graphs_.push_back(exec);
  return static_cast<int>(graphs_.size()) - 1;
}

void CudaBackendImpl::Replay(int graph) {
  if (graph < 0 || graph >= static_cast<int>(graphs_.size())) {
    Record(absl::InvalidArgumentError(absl::StrCat("Replay: no graph ", graph)));
    return;
  }
  Activate();
  RecordCuda(cudaGraphLaunch(graphs_[graph], stream_), "cudaGraphLaunch");
}

void CudaBackendImpl::DropGraphs() {
  if (graphs_.empty()) return;
  Activate();
  // A graph may still be running.
  RecordCuda(cudaStreamSynchronize(stream_), "cudaStreamSynchronize(graphs)");
  for (cudaGraphExec_t exec : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaBackend>> MakeCudaBackend(int device,
                                                             const CudaBackendOptions& options) {
  return CudaBackendImpl::Create(device, options);
}

int CudaDeviceCount() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();  // E.g. error 35, no driver: not an error for the caller.
    return 0;
  }
  return count;
}

absl::StatusOr<double> MeasureCopyBandwidth(int device, size_t bytes, int reps) {
  if (CudaDeviceCount() == 0) return absl::UnavailableError("no usable CUDA device");
  if (reps < 1 || bytes < 4) return absl::InvalidArgumentError("reps >= 1 and bytes >= 4");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  bytes &= ~size_t{3};
  void* src = nullptr;
  void* dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  absl::Cleanup release = [&] {
    cudaFree(src);
    cudaFree(dst);
    if (start != nullptr) cudaEventDestroy(start);
    if (stop != nullptr) cudaEventDestroy(stop);
  };
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&src, bytes), "cudaMalloc (bandwidth source)"));
  RETURN_IF_ERROR(CudaStatus(cudaMalloc(&dst, bytes), "cudaMalloc (bandwidth destination)"));
  {
    // Non-zero data: a pattern written from the host in 64 MiB pieces.
    std::vector<uint32_t> pattern((size_t{64} << 20) / 4);
    uint32_t x = 0x9E3779B9u;
    for (uint32_t& v : pattern) v = (x = x * 1664525u + 1013904223u);
    for (size_t off = 0; off < bytes; off += pattern.size() * 4) {
      const size_t n = std::min(bytes - off, pattern.size() * 4);
      RETURN_IF_ERROR(CudaStatus(
          cudaMemcpy(static_cast<char*>(src) + off, pattern.data(), n, cudaMemcpyHostToDevice),
          "cudaMemcpy (bandwidth pattern)"));
    }
  }
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&start), "cudaEventCreate"));
  RETURN_IF_ERROR(CudaStatus(cudaEventCreate(&stop), "cudaEventCreate"));
  std::vector<float> ms;
  for (int r = 0; r <= reps; ++r) {
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start), "cudaEventRecord"));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice), "cudaMemcpyAsync"));
    RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop), "cudaEventRecord"));
    RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop), "cudaEventSynchronize"));
    float t = 0.0f;
    RETURN_IF_ERROR(CudaStatus(cudaEventElapsedTime(&t, start, stop), "cudaEventElapsedTime"));
    if (r > 0) ms.push_back(t);  // The first copy warms up.
  }
  std::sort(ms.begin(), ms.end());
  return 2.0 * static_cast<double>(bytes) / (ms[ms.size() / 2] * 1e-3);
}

absl::StatusOr<size_t> FreeDeviceMemoryBytes(int device) {
  if (CudaDeviceCount() == 0) return absl::UnavailableError("no usable CUDA device");
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(device), "cudaSetDevice"));
  size_t free_bytes = 0, total_bytes = 0;
  RETURN_IF_ERROR(CudaStatus(cudaMemGetInfo(&free_bytes, &total_bytes), "cudaMemGetInfo"));
  return free_bytes;
}

}  // namespace conveyor::kernels
