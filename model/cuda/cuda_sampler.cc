// The CUDA DeviceSampler: builds each row's parameters and distinct-token penalty list
// on the host (the engine has the sequences there), uploads them through pinned memory,
// queues the three sampling stages (kernels/cuda/sampling_kernels.cu) on the backend's
// stream, and reads back one small result per row.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_status.h"
#include "kernels/cuda/kernels.h"
#include "model/cuda/cuda_device.h"

namespace conveyor::model {
namespace {

namespace cuda = kernels::cuda;
using kernels::cuda::CudaStatus;

// Pinned host memory that grows; the stream must be idle when it does.
class PinnedBuffer {
 public:
  ~PinnedBuffer() { cudaFreeHost(data_); }
  absl::Status Reserve(size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    cudaFreeHost(data_);
    data_ = nullptr;
    const size_t grown = std::max(bytes, 2 * size_);
    size_ = 0;
    RETURN_IF_ERROR(CudaStatus(cudaMallocHost(&data_, grown), "cudaMallocHost (sampler)"));
    size_ = grown;
    return absl::OkStatus();
  }
  void* data() const { return data_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

// Backend (device) memory that grows; likewise.
class DeviceBuffer {
 public:
  absl::Status Reserve(kernels::Backend* backend, size_t bytes) {
    if (bytes <= size_) return absl::OkStatus();
    const size_t grown = std::max(bytes, 2 * size_);
    buffer_.reset();  // Freed first: the old and new sizes need not fit together.
    size_ = 0;
    ASSIGN_OR_RETURN(buffer_, kernels::AllocateBuffer(backend, grown));
    size_ = grown;
    return absl::OkStatus();
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(buffer_.get());
  }

 private:
  kernels::BackendBuffer buffer_;
  size_t size_ = 0;
};

class CudaSampler final : public DeviceSampler {
 public:
  CudaSampler(kernels::CudaBackend* backend, int vocab_size, int max_rows)
      : backend_(backend),
        stream_(static_cast<cudaStream_t>(backend->stream())),
        dtype_(backend->dtype() == kernels::CudaComputeDtype::kFp16 ? cuda::DType::kFp16
                                                                    : cuda::DType::kBf16),
        vocab_(vocab_size),
        max_rows_(max_rows),
        entry_of_(vocab_size, -1) {}

  absl::Status Init() {
    const size_t cells = static_cast<size_t>(max_rows_) * vocab_;
    RETURN_IF_ERROR(work_.Reserve(backend_, cells * sizeof(float)));
    RETURN_IF_ERROR(sorted_.Reserve(backend_, cells * sizeof(float)));
    RETURN_IF_ERROR(ids_.Reserve(backend_, cells * sizeof(int32_t)));
    RETURN_IF_ERROR(sorted_ids_.Reserve(backend_, cells * sizeof(int32_t)));
    RETURN_IF_ERROR(lse_.Reserve(backend_, max_rows_ * sizeof(float)));
    RETURN_IF_ERROR(results_.Reserve(backend_, max_rows_ * sizeof(cuda::SampleRowResult)));
    RETURN_IF_ERROR(host_results_.Reserve(max_rows_ * sizeof(cuda::SampleRowResult)));
    // Sort scratch for the largest call; Sample grows it should a smaller one want more.
    size_t temp = 0;
    RETURN_IF_ERROR(CudaStatus(
        cuda::SortRowsDescending(nullptr, &temp, nullptr, nullptr, nullptr, nullptr,
                                 static_cast<int64_t>(cells), max_rows_, nullptr, nullptr, stream_),
        "sampler sort (scratch size)"));
    RETURN_IF_ERROR(sort_temp_.Reserve(backend_, temp));
    sort_temp_bytes_ = temp;
    return absl::OkStatus();
  }

  int max_rows() const override { return max_rows_; }

  absl::Status Sample(const DeviceLogits& logits, std::span<const RowToSample> rows,
                      std::vector<SampleResult>* results) override {
    const int n = static_cast<int>(rows.size());
    results->clear();
    if (n == 0) return absl::OkStatus();
    // The calling thread may not be the one that made the backend.
    RETURN_IF_ERROR(CudaStatus(cudaSetDevice(backend_->device()), "cudaSetDevice"));
    if (n != logits.rows || n > max_rows_ || logits.layout_rows < n ||
        logits.vocab_size != vocab_) {
      return absl::InternalError(absl::StrCat("device sampler given ", n, " rows of ", logits.rows,
                                              " (at most ", max_rows_, "), vocab ",
                                              logits.vocab_size, " of ", vocab_));
    }
    // Host side: parameters, distinct-token penalty lists, the drawing rows' segments.
    params_.resize(n);
    entries_.clear();
    draw_rows_.clear();
    segment_begin_.clear();
    segment_end_.clear();
    for (int i = 0; i < n; ++i) {
      const RowToSample& row = rows[i];
      const SamplingParams& s = *row.params;
      cuda::SampleRowParams& p = params_[i];
      p = cuda::SampleRowParams();
      p.temperature = s.temperature;
      p.top_k = s.top_k;
      p.top_p = s.top_p;
      p.min_p = s.min_p;
      p.repetition_penalty = s.repetition_penalty;
      p.presence_penalty = s.presence_penalty;
      p.frequency_penalty = s.frequency_penalty;
      p.num_logprobs = std::min(s.num_logprobs, cuda::kMaxSampleLogprobs);
      p.want_logprob = row.want_logprob ? 1 : 0;
      p.seed = s.seed;
      p.draw_index = row.draw_index;
      p.penalty_begin = static_cast<int>(entries_.size());
      AddPenaltyEntries(s, row.prompt_tokens, row.output_tokens);
      p.penalty_end = static_cast<int>(entries_.size());
      if (!s.is_greedy()) {
        draw_rows_.push_back(i);
        segment_begin_.push_back(i * vocab_);
        segment_end_.push_back((i + 1) * vocab_);
      }
    }
    const int num_draw = static_cast<int>(draw_rows_.size());

    // One pinned upload: params, entries, draw rows, segment offsets.
    const size_t params_bytes = n * sizeof(cuda::SampleRowParams);
    const size_t entries_bytes = entries_.size() * sizeof(cuda::PenaltyEntry);
    const size_t ints_bytes = 3 * num_draw * sizeof(int32_t);
    auto aligned = [](size_t b) { return (b + 15) & ~size_t{15}; };
    const size_t upload_bytes = aligned(params_bytes) + aligned(entries_bytes) + ints_bytes;
    // The previous call synchronised, so nothing still reads the staging buffers.
    RETURN_IF_ERROR(upload_host_.Reserve(upload_bytes));
    RETURN_IF_ERROR(upload_.Reserve(backend_, upload_bytes));
    char* host = static_cast<char*>(upload_host_.data());
    std::memcpy(host, params_.data(), params_bytes);
    std::memcpy(host + aligned(params_bytes), entries_.data(), entries_bytes);
    int32_t* host_ints =
        reinterpret_cast<int32_t*>(host + aligned(params_bytes) + aligned(entries_bytes));
    std::copy(draw_rows_.begin(), draw_rows_.end(), host_ints);
    std::copy(segment_begin_.begin(), segment_begin_.end(), host_ints + num_draw);
    std::copy(segment_end_.begin(), segment_end_.end(), host_ints + 2 * num_draw);
    char* device = upload_.as<char>();
    const auto* d_params = reinterpret_cast<const cuda::SampleRowParams*>(device);
    const auto* d_entries =
        reinterpret_cast<const cuda::PenaltyEntry*>(device + aligned(params_bytes));
    const auto* d_ints =
        reinterpret_cast<const int32_t*>(device + aligned(params_bytes) + aligned(entries_bytes));
    RETURN_IF_ERROR(
        CudaStatus(cudaMemcpyAsync(device, host, upload_bytes, cudaMemcpyHostToDevice, stream_),
                   "sampler upload"));

    RETURN_IF_ERROR(
        CudaStatus(cuda::LaunchSamplePrepare(logits.data, n, logits.layout_rows, logits.shard,
                                             vocab_, d_params, d_entries, work_.as<float>(),
                                             ids_.as<int32_t>(), lse_.as<float>(),
                                             results_.as<cuda::SampleRowResult>(), dtype_, stream_),
                   "sampler prepare launch"));
    if (num_draw > 0) {
      const int64_t cells = static_cast<int64_t>(n) * vocab_;
      size_t temp = 0;
      RETURN_IF_ERROR(
          CudaStatus(cuda::SortRowsDescending(nullptr, &temp, nullptr, nullptr, nullptr, nullptr,
                                              cells, num_draw, nullptr, nullptr, stream_),
                     "sampler sort (scratch size)"));
      if (temp > sort_temp_bytes_) {
        RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "sampler sync"));
        RETURN_IF_ERROR(sort_temp_.Reserve(backend_, temp));
        sort_temp_bytes_ = temp;
      }
      RETURN_IF_ERROR(
          CudaStatus(cuda::SortRowsDescending(sort_temp_.as<void>(), &temp, work_.as<float>(),
                                              sorted_.as<float>(), ids_.as<int32_t>(),
                                              sorted_ids_.as<int32_t>(), cells, num_draw,
                                              d_ints + num_draw, d_ints + 2 * num_draw, stream_),
                     "sampler sort"));
      RETURN_IF_ERROR(
          CudaStatus(cuda::LaunchSampleDraw(logits.data, logits.layout_rows, logits.shard, vocab_,
                                            d_params, d_ints, num_draw, sorted_.as<float>(),
                                            sorted_ids_.as<int32_t>(), lse_.as<float>(),
                                            results_.as<cuda::SampleRowResult>(), dtype_, stream_),
                     "sampler draw launch"));
    }
    RETURN_IF_ERROR(CudaStatus(
        cudaMemcpyAsync(host_results_.data(), results_.as<void>(),
                        n * sizeof(cuda::SampleRowResult), cudaMemcpyDeviceToHost, stream_),
        "sampler results copy"));
    RETURN_IF_ERROR(CudaStatus(cudaStreamSynchronize(stream_), "sampler sync"));
    RETURN_IF_ERROR(backend_->last_error());

    const auto* out = static_cast<const cuda::SampleRowResult*>(host_results_.data());
    results->resize(n);
    for (int i = 0; i < n; ++i) {
      SampleResult& r = (*results)[i];
      r.token_id = out[i].token_id;
      r.logprob = out[i].logprob;
      r.top_logprobs.clear();
      for (int k = 0; k < out[i].num_top; ++k) {
        r.top_logprobs.push_back({out[i].top_ids[k], out[i].top_logprobs[k]});
      }
    }
    return absl::OkStatus();
  }

 private:
  // Appends one entry per distinct in-vocabulary token the row's penalties touch.
  void AddPenaltyEntries(const SamplingParams& s, std::span<const int32_t> prompt,
                         std::span<const int32_t> output) {
    const bool repetition = s.repetition_penalty != 1.0f;
    const bool counted = s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f;
    if (!repetition && !counted) return;
    const size_t first = entries_.size();
    auto entry = [&](int32_t token) -> cuda::PenaltyEntry* {
      if (token < 0 || token >= vocab_) return nullptr;  // Client ids are not trusted.
      int& index = entry_of_[token];
      if (index < 0) {
        index = static_cast<int>(entries_.size());
        entries_.push_back({token, 0, 0});
      }
      return &entries_[index];
    };
    if (repetition) {
      for (std::span<const int32_t> part : {prompt, output}) {
        for (int32_t token : part) {
          if (cuda::PenaltyEntry* e = entry(token)) e->in_context = 1;
        }
      }
    }
    if (counted) {
      for (int32_t token : output) {
        if (cuda::PenaltyEntry* e = entry(token)) ++e->output_count;
      }
    }
    for (size_t i = first; i < entries_.size(); ++i) entry_of_[entries_[i].token] = -1;
  }

  kernels::CudaBackend* backend_;
  cudaStream_t stream_;
  cuda::DType dtype_;
  int vocab_;
  int max_rows_;
  std::vector<int> entry_of_;  // Scratch: token -> its entry in the row being built.
  std::vector<cuda::SampleRowParams> params_;
  std::vector<cuda::PenaltyEntry> entries_;
  std::vector<int32_t> draw_rows_, segment_begin_, segment_end_;
  PinnedBuffer upload_host_, host_results_;
  DeviceBuffer upload_, work_, sorted_, ids_, sorted_ids_, lse_, results_, sort_temp_;
  size_t sort_temp_bytes_ = 0;
};

}  // namespace

absl::StatusOr<std::unique_ptr<DeviceSampler>> MakeCudaSampler(kernels::Backend* backend,
                                                               int vocab_size, int max_rows) {
  auto* cuda_backend = dynamic_cast<kernels::CudaBackend*>(backend);
  if (cuda_backend == nullptr) {
    return absl::InvalidArgumentError("the CUDA sampler needs the CUDA backend");
  }
  if (vocab_size < 1 || max_rows < 1 || static_cast<int64_t>(vocab_size) * max_rows > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA sampler: ", max_rows, " rows of ",
                                                   vocab_size, " logits is out of range"));
  }
  RETURN_IF_ERROR(CudaStatus(cudaSetDevice(cuda_backend->device()), "cudaSetDevice"));
  auto sampler = std::make_unique<CudaSampler>(cuda_backend, vocab_size, max_rows);
  RETURN_IF_ERROR(sampler->Init());
  return std::unique_ptr<DeviceSampler>(std::move(sampler));
}

}  // namespace conveyor::model
