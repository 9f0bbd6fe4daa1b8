// A Hugging Face checkpoint directory: `model.safetensors`, or shards
// `model-0000N-of-0000M.safetensors` listed in `model.safetensors.index.json`.
// Tensors are read converted to float32, whole or as a slice (for tensor-parallel shards).
// In a GPTQ or AWQ checkpoint each quantized linear layer's `<layer>.qweight`, `.qzeros`,
// `.scales` (and `.g_idx`) stand for `<layer>.weight`, which reads dequantized, or as the
// ggml blocks it maps to (ReadBlocks; checkpoint/quantized_linear.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/model_config.h"
#include "checkpoint/quantized_linear.h"
#include "checkpoint/safetensors.h"

namespace conveyor {

class Checkpoint {
 public:
  // Opens every safetensors file of the checkpoint in `model_dir`. A missing file, a
  // shard that the index names but that does not exist, or a tensor that the index maps
  // to a file that lacks it is an error naming the file.
  // `quantization` (config.json's quantization_config, ModelConfig::quantization) says how
  // `*.qweight` layers are packed, or that `*.weight` tensors with a `*.weight_scale_inv`
  // are FP8; each is checked now (QuantizedLinear::Make's and MakeFp8's errors).
  // Without one a `*.qweight` tensor is INVALID_ARGUMENT naming it.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(
      const std::string& model_dir, const WeightQuantization& quantization = {});

  // Whether the checkpoint holds tensor `name`: as stored, or a quantized layer's
  // `<layer>.weight`.
  bool Contains(const std::string& name) const;

  // Returns the tensor's metadata and mapped bytes, or NOT_FOUND naming the tensor and dir
  // (a quantized layer's `<layer>.weight` too: it is no float tensor).
  absl::StatusOr<TensorView> Find(const std::string& name) const;

  // Copies tensor `name`, converted to float32, into `out` (row-major). Its shape must
  // equal `expected_shape`, else INVALID_ARGUMENT naming the tensor, its file, and both
  // shapes.
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                       float* out) const;

  // Like ReadF32 but copies only indices [begin, end) along dimension `dim` (0 or 1 for a
  // matrix, 0 for a vector) into `out`, densely packed. For tensor-parallel shards.
  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& expected_shape,
                            int dim, int64_t begin, int64_t end, float* out) const;

  // The ggml block type quantized layer weight `name` ("<layer>.weight") maps to;
  // NOT_FOUND where `name` is not a quantized layer's weight.
  absl::StatusOr<GgmlType> QuantizedTypeOf(const std::string& name) const;
  // Rows [row_begin, row_end) and columns [col_begin, col_end) of quantized layer weight
  // `name` (shape `expected_shape`, [out, in]) as QuantizedTypeOf's blocks, each row's from
  // the one holding col_begin, appended to `out`. INVALID_ARGUMENT for another shape or
  // columns off the 32-weight block boundaries, OUT_OF_RANGE for ranges outside it.
  absl::Status ReadBlocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                          int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                          std::vector<std::byte>* out) const;

  const std::string& dir() const { return dir_; }
  // Total bytes of tensor data across all files.
  uint64_t TotalTensorBytes() const;

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const SafetensorsFile*> tensor_to_file_;
  // Quantized layers by `<layer>.weight`, and the file holding each one's qweight.
  struct Quantized {
    QuantizedLinear linear;
    const SafetensorsFile* file;
  };
  std::unordered_map<std::string, Quantized> quantized_;

  // The quantized layer `name` with its shape checked against `expected_shape`, or null
  // where `name` is not one.
  absl::StatusOr<const Quantized*> FindQuantized(const std::string& name,
                                                 const std::vector<int64_t>& expected_shape) const;
  // Finds and checks every `*.qweight` layer, or with FP8 every `*.weight_scale_inv` one
  // (Open).
  absl::Status OpenQuantized(const WeightQuantization& quantization);
  absl::Status OpenFp8(const WeightQuantization& quantization);
};

}  // namespace conveyor
