// A Hugging Face checkpoint directory: `model.safetensors`, or shards
// `model-0000N-of-0000M.safetensors` listed in `model.safetensors.index.json`.
// Tensors are read converted to float32, whole or as a slice (for tensor-parallel shards).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/safetensors.h"

namespace conveyor {

class Checkpoint {
 public:
  // Opens every safetensors file of the checkpoint in `model_dir`. A missing file, a
  // shard that the index names but that does not exist, or a tensor that the index maps
  // to a file that lacks it is an error naming the file.
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& model_dir);

  bool Contains(const std::string& name) const;

  // Returns the tensor's metadata and mapped bytes, or NOT_FOUND naming the tensor and dir.
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

  const std::string& dir() const { return dir_; }
  // Total bytes of tensor data across all files.
  uint64_t TotalTensorBytes() const;

 private:
  Checkpoint() = default;

  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::unordered_map<std::string, const SafetensorsFile*> tensor_to_file_;
};

}  // namespace conveyor
