#include "checkpoint/gguf_weights.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/gguf_model.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// The inverse of HfRowOfPermutedRow: the GGUF row holding HF row `hf_row` (HF row
// h*D + j*(D/2) + i sits at GGUF row h*D + 2i + j).
int64_t GgufRowOfHfRow(int64_t hf_row, int64_t head_rows) {
  const int64_t half = head_rows / 2;
  const int64_t head = hf_row / head_rows;
  const int64_t within = hf_row % head_rows;  // j*half + i.
  return head * head_rows + 2 * (within % half) + within / half;
}

}  // namespace

absl::StatusOr<std::unique_ptr<GgufWeights>> GgufWeights::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(path));
  ASSIGN_OR_RETURN(ModelConfig config, ModelConfigFromGguf(*file));
  std::unique_ptr<GgufWeights> weights(new GgufWeights(std::move(file), std::move(config)));
  const GgufFile& f = *weights->file_;
  for (const GgufTensorInfo& tensor : f.tensors()) {
    const std::optional<HfTensorName> hf = HfNameOfGgufTensor(tensor.name, weights->config_);
    if (!hf) continue;  // Nothing the model reads.
    const GgmlTypeTraits traits = TraitsOf(tensor.type);
    if (!traits.supported) {
      return absl::UnimplementedError(
          absl::StrCat(f.path(), ": tensor '", tensor.name, "' has type ", traits.name,
                       ", which Conveyor does not load (supported: ", SupportedGgmlTypes(), ")"));
    }
    const std::vector<int64_t> shape = tensor.Shape();
    const size_t want_dims = hf->experts_merged ? 3 : 0;
    if ((want_dims != 0 && shape.size() != want_dims) || (want_dims == 0 && shape.size() > 2)) {
      return absl::InvalidArgumentError(absl::StrCat(
          f.path(), ": tensor '", tensor.name, "' has shape ", ShapeString(shape),
          hf->experts_merged ? ", not [experts, rows, columns]" : ", not a vector or a matrix"));
    }
    auto add = [&](std::string name, Source source) -> absl::Status {
      if (!weights->sources_.emplace(name, std::move(source)).second) {
        return absl::InvalidArgumentError(absl::StrCat(f.path(), ": tensor '", tensor.name,
                                                       "' is a second source of '", name, "'"));
      }
      return absl::OkStatus();
    };
    if (!hf->experts_merged) {
      RETURN_IF_ERROR(add(hf->name, Source{&tensor, -1, hf->rope_permuted_heads, shape}));
      continue;
    }
    for (int64_t e = 0; e < shape[0]; ++e) {
      RETURN_IF_ERROR(add(absl::StrReplaceAll(hf->name, {{"{expert}", absl::StrCat(e)}}),
                          Source{&tensor, e, hf->rope_permuted_heads, {shape[1], shape[2]}}));
    }
  }
  return weights;
}

bool GgufWeights::Contains(const std::string& name) const { return sources_.contains(name); }

absl::StatusOr<const GgufWeights::Source*> GgufWeights::Find(const std::string& name) const {
  auto it = sources_.find(name);
  if (it == sources_.end()) {
    return absl::NotFoundError(absl::StrCat("tensor '", name, "' not found in ", path()));
  }
  return &it->second;
}

absl::Status GgufWeights::ReadF32(const std::string& name,
                                  const std::vector<int64_t>& expected_shape, float* out) const {
  if (expected_shape.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor '", name, "' in ", path(), " read as a scalar"));
  }
  return ReadF32Slice(name, expected_shape, 0, 0, expected_shape[0], out);
}

absl::Status GgufWeights::ReadF32Slice(const std::string& name,
                                       const std::vector<int64_t>& expected_shape, int dim,
                                       int64_t begin, int64_t end, float* out) const {
  ASSIGN_OR_RETURN(const Source* source, Find(name));
  const GgufTensorInfo& tensor = *source->tensor;
  const std::vector<int64_t>& shape = source->hf_shape;
  auto describe = [&] {
    return absl::StrCat("tensor '", name, "' (GGUF '", tensor.name, "') in ", path());
  };
  if (shape != expected_shape) {
    return absl::InvalidArgumentError(absl::StrCat(describe(), " has shape ", ShapeString(shape),
                                                   ", expected ", ShapeString(expected_shape)));
  }
  const int rank = static_cast<int>(shape.size());
  if (rank < 1 || dim < 0 || dim >= rank) {
    return absl::InvalidArgumentError(absl::StrCat(describe(), " with shape ", ShapeString(shape),
                                                   " cannot be sliced along dimension ", dim));
  }
  if (begin < 0 || begin > end || end > shape[dim]) {
    return absl::OutOfRangeError(absl::StrCat("slice [", begin, ", ", end, ") of dimension ", dim,
                                              " of ", describe(), " with shape ",
                                              ShapeString(shape)));
  }
  // Rows in HF order: GGUF row `RowOf(r)` holds HF row r.
  const int64_t rows = shape[0];
  const int heads = source->rope_permuted_heads;
  if (heads > 0 && (rows % heads != 0 || (rows / heads) % 2 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(describe(), " has ", rows,
                                                   " rows, not an even number for each of ", heads,
                                                   " permuted heads"));
  }
  auto row_of = [&](int64_t hf_row) {
    return heads > 0 ? GgufRowOfHfRow(hf_row, rows / heads) : hf_row;
  };
  const GgmlTypeTraits traits = TraitsOf(tensor.type);
  auto error_context = [&](const absl::Status& status) {
    return absl::Status(status.code(), absl::StrCat(describe(), ": ", status.message()));
  };
  if (rank == 1) {  // One ggml row: dequantize it whole, then pick.
    std::vector<float> all(rows);
    if (absl::Status s = DequantizeToF32(tensor.type, tensor.data, rows, all.data()); !s.ok()) {
      return error_context(s);
    }
    for (int64_t i = begin; i < end; ++i) out[i - begin] = all[row_of(i)];
    return absl::OkStatus();
  }
  const int64_t cols = shape[1];
  const int64_t row_bytes = cols / traits.block_elements * traits.block_bytes;
  const std::byte* base =
      tensor.data + (source->expert >= 0 ? source->expert * rows * row_bytes : 0);
  const int64_t first_row = dim == 0 ? begin : 0;
  const int64_t last_row = dim == 0 ? end : rows;
  const int64_t first_col = dim == 1 ? begin : 0;
  const int64_t width = dim == 1 ? end - begin : cols;
  std::vector<float> row(dim == 1 ? cols : 0);
  for (int64_t r = first_row; r < last_row; ++r) {
    const std::byte* src = base + row_of(r) * row_bytes;
    float* dst = out + (r - first_row) * width;
    float* into = dim == 1 ? row.data() : dst;
    if (absl::Status s = DequantizeToF32(tensor.type, src, cols, into); !s.ok()) {
      return error_context(s);
    }
    if (dim == 1) std::copy_n(row.data() + first_col, width, dst);
  }
  return absl::OkStatus();
}

absl::StatusOr<GgmlType> GgufWeights::TypeOf(const std::string& name) const {
  ASSIGN_OR_RETURN(const Source* source, Find(name));
  return source->tensor->type;
}

absl::Status GgufWeights::ReadBlocks(const std::string& name,
                                     const std::vector<int64_t>& expected_shape, int64_t row_begin,
                                     int64_t row_end, int64_t col_begin, int64_t col_end,
                                     std::vector<std::byte>* out) const {
  ASSIGN_OR_RETURN(const Source* source, Find(name));
  const GgufTensorInfo& tensor = *source->tensor;
  const std::vector<int64_t>& shape = source->hf_shape;
  auto describe = [&] {
    return absl::StrCat("tensor '", name, "' (GGUF '", tensor.name, "') in ", path());
  };
  if (shape != expected_shape || shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(describe(), " has shape ", ShapeString(shape),
                                                   ", expected the matrix ",
                                                   ShapeString(expected_shape)));
  }
  const int64_t rows = shape[0], cols = shape[1];
  if (row_begin < 0 || row_begin > row_end || row_end > rows || col_begin < 0 ||
      col_begin > col_end || col_end > cols) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_begin, ", ", row_end, ") columns [",
                                              col_begin, ", ", col_end, ") of ", describe(),
                                              " with shape ", ShapeString(shape)));
  }
  const GgmlTypeTraits traits = TraitsOf(tensor.type);
  if (col_begin % traits.block_elements != 0 || col_end % traits.block_elements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("columns [", col_begin, ", ", col_end, ") of ",
                                                   describe(), " are not whole ", traits.name,
                                                   " blocks of ", traits.block_elements));
  }
  const int heads = source->rope_permuted_heads;
  if (heads > 0 && (rows % heads != 0 || (rows / heads) % 2 != 0)) {
    return absl::InvalidArgumentError(absl::StrCat(describe(), " has ", rows,
                                                   " rows, not an even number for each of ", heads,
                                                   " permuted heads"));
  }
  const int64_t row_bytes = cols / traits.block_elements * traits.block_bytes;
  const std::byte* base =
      tensor.data + (source->expert >= 0 ? source->expert * rows * row_bytes : 0);
  const int64_t skip = col_begin / traits.block_elements * traits.block_bytes;
  const int64_t width = (col_end - col_begin) / traits.block_elements * traits.block_bytes;
  const size_t at = out->size();
  out->resize(at + static_cast<size_t>((row_end - row_begin) * width));
  std::byte* dst = out->data() + at;
  for (int64_t r = row_begin; r < row_end; ++r) {
    const int64_t gguf_row = heads > 0 ? GgufRowOfHfRow(r, rows / heads) : r;
    std::memcpy(dst + (r - row_begin) * width, base + gguf_row * row_bytes + skip, width);
  }
  return absl::OkStatus();
}

}  // namespace conveyor
