// A model's weights read from one GGUF file under their Hugging Face names, as the
// safetensors Checkpoint serves them: each HF tensor maps to a GGUF tensor (or one
// expert's slice of a merged `*_exps` tensor) through checkpoint/gguf_model.h's name map,
// rows come back in HF order (llama.cpp's Q/K row permutation undone), dequantized to
// float32 with checkpoint/ggml_types.h. docs/gguf.md describes the mapping.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/gguf.h"
#include "checkpoint/model_config.h"

namespace conveyor {

class GgufWeights {
 public:
  // Opens the GGUF file at `path` and reads its config (ModelConfigFromGguf). Every
  // tensor the model uses must be of a supported type: otherwise UNIMPLEMENTED naming
  // the file, the tensor and its type, now rather than when the tensor is read.
  static absl::StatusOr<std::unique_ptr<GgufWeights>> Open(const std::string& path);

  GgufWeights(const GgufWeights&) = delete;
  GgufWeights& operator=(const GgufWeights&) = delete;

  const ModelConfig& config() const { return config_; }
  const std::string& path() const { return file_->path(); }

  // Whether the file holds the HF tensor `name`.
  bool Contains(const std::string& name) const;
  // Copies HF tensor `name`, dequantized to float32, into `out` (row-major, HF row
  // order). Its HF shape must equal `expected_shape`, else INVALID_ARGUMENT naming the
  // tensor (both names), the file and both shapes; NOT_FOUND naming the tensor and file
  // when absent.
  absl::Status ReadF32(const std::string& name, const std::vector<int64_t>& expected_shape,
                       float* out) const;
  // Like ReadF32 but only indices [begin, end) of dimension `dim` (0 or 1 of a matrix, 0
  // of a vector), densely packed.
  absl::Status ReadF32Slice(const std::string& name, const std::vector<int64_t>& expected_shape,
                            int dim, int64_t begin, int64_t end, float* out) const;

  // The GGUF type HF tensor `name` is stored in (NOT_FOUND when absent).
  absl::StatusOr<GgmlType> TypeOf(const std::string& name) const;
  // Copies rows [row_begin, row_end) and columns [col_begin, col_end) of HF matrix `name`
  // as stored, in their blocks: HF row order (the Q/K permutation of whole rows undone),
  // each row's blocks from the one holding col_begin, appended to `out`. The shape is
  // checked as ReadF32 does; INVALID_ARGUMENT when the columns do not start and end on
  // block boundaries, or the tensor is not a matrix.
  absl::Status ReadBlocks(const std::string& name, const std::vector<int64_t>& expected_shape,
                          int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                          std::vector<std::byte>* out) const;

 private:
  // Where one HF tensor lives in the file.
  struct Source {
    const GgufTensorInfo* tensor = nullptr;
    int64_t expert = -1;            // The slice of a merged [experts, rows, cols] tensor.
    int rope_permuted_heads = 0;    // Rows permuted by convert_hf_to_gguf (llama Q/K).
    std::vector<int64_t> hf_shape;  // Row-major, without the expert dimension.
  };

  GgufWeights(std::unique_ptr<GgufFile> file, ModelConfig config)
      : file_(std::move(file)), config_(std::move(config)) {}
  absl::StatusOr<const Source*> Find(const std::string& name) const;

  std::unique_ptr<GgufFile> file_;
  ModelConfig config_;
  std::map<std::string, Source, std::less<>> sources_;
};

}  // namespace conveyor
