#include "checkpoint/checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "checkpoint/file_util.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {

constexpr char kSingleFile[] = "model.safetensors";
constexpr char kIndexFile[] = "model.safetensors.index.json";

std::string ShapeString(const std::vector<int64_t>& shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

// INVALID_ARGUMENT naming the tensor, its file and both shapes unless they match.
absl::Status CheckShape(const TensorView& tensor, const std::string& path,
                        const std::vector<int64_t>& expected_shape) {
  if (tensor.shape == expected_shape) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("tensor '", tensor.name, "' in ", path,
                                                 " has shape ", ShapeString(tensor.shape),
                                                 ", expected ", ShapeString(expected_shape)));
}

// Reads `<index_path>`'s weight_map: tensor name -> shard file name.
absl::StatusOr<std::map<std::string, std::string>> ReadWeightMap(const std::string& index_path) {
  ASSIGN_OR_RETURN(const std::string text, ReadWholeFile(index_path));
  const nlohmann::json index =
      nlohmann::json::parse(text, /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (index.is_discarded()) {
    return absl::DataLossError(absl::StrCat(index_path, ": not valid JSON"));
  }
  auto weight_map = index.is_object() ? index.find("weight_map") : index.end();
  if (weight_map == index.end() || !weight_map->is_object()) {
    return absl::DataLossError(absl::StrCat(index_path, ": no 'weight_map' object"));
  }
  std::map<std::string, std::string> tensor_to_shard;
  for (const auto& [tensor, shard] : weight_map->items()) {
    if (!shard.is_string()) {
      return absl::DataLossError(absl::StrCat(index_path, ": weight_map entry for tensor '", tensor,
                                              "' is not a file name"));
    }
    tensor_to_shard.emplace(tensor, shard.get<std::string>());
  }
  return tensor_to_shard;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(
    const std::string& model_dir, const WeightQuantization& quantization) {
  std::unique_ptr<Checkpoint> checkpoint(new Checkpoint());
  checkpoint->dir_ = model_dir;
  const std::filesystem::path dir(model_dir);
  const std::string index_path = (dir / kIndexFile).string();
  const std::string single_path = (dir / kSingleFile).string();

  std::error_code ignored;  // A path that cannot be checked counts as absent.
  if (std::filesystem::exists(index_path, ignored)) {
    ASSIGN_OR_RETURN(auto tensor_to_shard, ReadWeightMap(index_path));
    std::map<std::string, const SafetensorsFile*> opened;  // Shard name -> file.
    for (const auto& [tensor, shard] : tensor_to_shard) {
      auto [it, inserted] = opened.try_emplace(shard, nullptr);
      if (inserted) {
        const std::string shard_path = (dir / shard).string();
        absl::StatusOr<std::unique_ptr<SafetensorsFile>> file = SafetensorsFile::Open(shard_path);
        if (!file.ok()) {
          return absl::Status(file.status().code(),
                              absl::StrCat(index_path, " names shard '", shard, "' for tensor '",
                                           tensor, "': ", file.status().message()));
        }
        it->second = file->get();
        checkpoint->files_.push_back(*std::move(file));
      }
      if (!it->second->Contains(tensor)) {
        return absl::DataLossError(absl::StrCat(index_path, " maps tensor '", tensor, "' to ",
                                                it->second->path(), ", which lacks it"));
      }
      checkpoint->tensor_to_file_.emplace(tensor, it->second);
    }
  } else if (std::filesystem::exists(single_path, ignored)) {
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const std::string& tensor : file->TensorNames()) {
      checkpoint->tensor_to_file_.emplace(tensor, file.get());
    }
    checkpoint->files_.push_back(std::move(file));
  } else {
    return absl::NotFoundError(
        absl::StrCat(model_dir, ": neither ", kSingleFile, " nor ", kIndexFile, " exists"));
  }
  RETURN_IF_ERROR(checkpoint->OpenQuantized(quantization));
  return checkpoint;
}

absl::Status Checkpoint::OpenFp8(const WeightQuantization& quantization) {
  constexpr absl::string_view kScale = ".weight_scale_inv";
  std::vector<std::string> layers;
  for (const auto& [tensor, file] : tensor_to_file_) {
    if (absl::EndsWith(tensor, kScale)) {
      layers.push_back(tensor.substr(0, tensor.size() - kScale.size()));
    }
  }
  std::sort(layers.begin(), layers.end());  // The first error is the same every time.
  for (const std::string& layer : layers) {
    const std::string weight_name = layer + ".weight";
    auto weight_file = tensor_to_file_.find(weight_name);
    if (weight_file == tensor_to_file_.end()) {
      return absl::NotFoundError(absl::StrCat(dir_, ": FP8 layer '", layer,
                                              "' has a weight_scale_inv but no tensor '",
                                              weight_name, "'"));
    }
    const SafetensorsFile* scale_file = tensor_to_file_.at(layer + std::string(kScale));
    ASSIGN_OR_RETURN(RawTensorView weight, weight_file->second->FindRaw(weight_name));
    ASSIGN_OR_RETURN(RawTensorView scale, scale_file->FindRaw(layer + std::string(kScale)));
    ASSIGN_OR_RETURN(
        QuantizedLinear linear,
        QuantizedLinear::MakeFp8(quantization, layer, weight_file->second->path(), weight, scale));
    quantized_.emplace(weight_name, Quantized{std::move(linear), weight_file->second});
  }
  return absl::OkStatus();
}

absl::Status Checkpoint::OpenQuantized(const WeightQuantization& quantization) {
  if (quantization.method == WeightQuantization::Method::kFp8) return OpenFp8(quantization);
  constexpr absl::string_view kQweight = ".qweight";
  std::vector<std::string> layers;
  for (const auto& [tensor, file] : tensor_to_file_) {
    if (absl::EndsWith(tensor, kQweight)) {
      layers.push_back(tensor.substr(0, tensor.size() - kQweight.size()));
    }
  }
  std::sort(layers.begin(), layers.end());  // The first error is the same every time.
  for (const std::string& layer : layers) {
    const SafetensorsFile* file = tensor_to_file_.at(layer + ".qweight");
    if (quantization.method == WeightQuantization::Method::kNone) {
      return absl::InvalidArgumentError(
          absl::StrCat(file->path(), ": tensor '", layer,
                       ".qweight' is a GPTQ/AWQ layer's, but config.json has no "
                       "quantization_config saying how it is packed"));
    }
    if (tensor_to_file_.contains(layer + ".weight")) {
      return absl::InvalidArgumentError(
          absl::StrCat(dir_, ": layer '", layer, "' has both a weight and a qweight"));
    }
    auto raw = [&](const std::string& suffix) -> absl::StatusOr<RawTensorView> {
      const std::string name = layer + suffix;
      auto it = tensor_to_file_.find(name);
      if (it == tensor_to_file_.end()) {
        return absl::NotFoundError(absl::StrCat(dir_, ": quantized layer '", layer,
                                                "' has a qweight but no tensor '", name, "'"));
      }
      return it->second->FindRaw(name);
    };
    QuantizedLinear::Tensors tensors;
    ASSIGN_OR_RETURN(tensors.qweight, raw(".qweight"));
    ASSIGN_OR_RETURN(tensors.qzeros, raw(".qzeros"));
    ASSIGN_OR_RETURN(tensors.scales, raw(".scales"));
    if (Contains(layer + ".g_idx")) {
      ASSIGN_OR_RETURN(tensors.g_idx, raw(".g_idx"));
    }
    ASSIGN_OR_RETURN(QuantizedLinear linear,
                     QuantizedLinear::Make(quantization, layer, file->path(), tensors));
    quantized_.emplace(layer + ".weight", Quantized{std::move(linear), file});
  }
  return absl::OkStatus();
}

absl::StatusOr<const Checkpoint::Quantized*> Checkpoint::FindQuantized(
    const std::string& name, const std::vector<int64_t>& expected_shape) const {
  auto it = quantized_.find(name);
  if (it == quantized_.end()) return nullptr;
  const QuantizedLinear& linear = it->second.linear;
  const std::vector<int64_t> shape = {linear.rows(), linear.cols()};
  if (shape != expected_shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("quantized tensor '", name, "' in ", it->second.file->path(), " has shape ",
                     ShapeString(shape), ", expected ", ShapeString(expected_shape)));
  }
  return &it->second;
}

absl::StatusOr<GgmlType> Checkpoint::QuantizedTypeOf(const std::string& name) const {
  auto it = quantized_.find(name);
  if (it == quantized_.end()) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": '", name, "' is not a GPTQ/AWQ layer's weight"));
  }
  if (!it->second.linear.has_blocks()) {
    return absl::UnimplementedError(
        absl::StrCat(dir_, ": '", name,
                     "' is an FP8 layer's weight, which no ggml block holds: it is read as floats "
                     "(--cpu_weight_dtype f32, bf16 or int8)"));
  }
  return it->second.linear.block_type();
}

absl::Status Checkpoint::ReadBlocks(const std::string& name,
                                    const std::vector<int64_t>& expected_shape, int64_t row_begin,
                                    int64_t row_end, int64_t col_begin, int64_t col_end,
                                    std::vector<std::byte>* out) const {
  ASSIGN_OR_RETURN(const Quantized* quantized, FindQuantized(name, expected_shape));
  if (quantized == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(dir_, ": '", name, "' is not a GPTQ/AWQ layer's weight"));
  }
  const QuantizedLinear& linear = quantized->linear;
  RETURN_IF_ERROR(QuantizedTypeOf(name).status());
  if (row_begin < 0 || row_begin > row_end || row_end > linear.rows() || col_begin < 0 ||
      col_begin > col_end || col_end > linear.cols()) {
    return absl::OutOfRangeError(absl::StrCat("rows [", row_begin, ", ", row_end, ") columns [",
                                              col_begin, ", ", col_end, ") of quantized tensor '",
                                              name, "' with shape ", ShapeString(expected_shape)));
  }
  const int64_t block = TraitsOf(linear.block_type()).block_elements;
  if (col_begin % block != 0 || col_end % block != 0) {
    return absl::InvalidArgumentError(absl::StrCat("columns [", col_begin, ", ", col_end,
                                                   ") of quantized tensor '", name,
                                                   "' are not whole blocks of ", block));
  }
  linear.AppendBlocks(row_begin, row_end, col_begin, col_end, out);
  return absl::OkStatus();
}

bool Checkpoint::Contains(const std::string& name) const {
  return tensor_to_file_.contains(name) || quantized_.contains(name);
}

absl::StatusOr<TensorView> Checkpoint::Find(const std::string& name) const {
  auto it = tensor_to_file_.find(name);
  if (it == tensor_to_file_.end()) {
    return absl::NotFoundError(absl::StrCat(dir_, ": checkpoint has no tensor '", name, "'"));
  }
  return it->second->Find(name);
}

absl::Status Checkpoint::ReadF32(const std::string& name,
                                 const std::vector<int64_t>& expected_shape, float* out) const {
  ASSIGN_OR_RETURN(const Quantized* quantized, FindQuantized(name, expected_shape));
  if (quantized != nullptr) {
    const QuantizedLinear& linear = quantized->linear;
    linear.Dequantize(0, linear.rows(), 0, linear.cols(), out);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const TensorView tensor, Find(name));
  RETURN_IF_ERROR(CheckShape(tensor, tensor_to_file_.at(name)->path(), expected_shape));
  ConvertToF32(tensor.dtype, tensor.data, static_cast<size_t>(tensor.NumElements()), out);
  return absl::OkStatus();
}

absl::Status Checkpoint::ReadF32Slice(const std::string& name,
                                      const std::vector<int64_t>& expected_shape, int dim,
                                      int64_t begin, int64_t end, float* out) const {
  ASSIGN_OR_RETURN(const Quantized* quantized, FindQuantized(name, expected_shape));
  if (quantized != nullptr) {
    const QuantizedLinear& linear = quantized->linear;
    const int64_t size = dim == 0 ? linear.rows() : linear.cols();
    if (dim < 0 || dim > 1 || begin < 0 || begin > end || end > size) {
      return absl::OutOfRangeError(absl::StrCat(
          "slice [", begin, ", ", end, ") of dimension ", dim, " of quantized tensor '", name,
          "' in ", quantized->file->path(), " with shape ", ShapeString(expected_shape)));
    }
    if (dim == 0) {
      linear.Dequantize(begin, end, 0, linear.cols(), out);
    } else {
      linear.Dequantize(0, linear.rows(), begin, end, out);
    }
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(const TensorView tensor, Find(name));
  const std::string& path = tensor_to_file_.at(name)->path();
  RETURN_IF_ERROR(CheckShape(tensor, path, expected_shape));
  const int rank = static_cast<int>(tensor.shape.size());
  if (rank < 1 || rank > 2 || dim < 0 || dim >= rank) {
    return absl::InvalidArgumentError(absl::StrCat("tensor '", name, "' in ", path, " with shape ",
                                                   ShapeString(tensor.shape),
                                                   " cannot be sliced along dimension ", dim));
  }
  if (begin < 0 || begin > end || end > tensor.shape[dim]) {
    return absl::OutOfRangeError(absl::StrCat("slice [", begin, ", ", end, ") of dimension ", dim,
                                              " of tensor '", name, "' in ", path, " with shape ",
                                              ShapeString(tensor.shape)));
  }
  const size_t element_bytes = DTypeSize(tensor.dtype);
  const int64_t rows = tensor.shape[0];
  const int64_t cols = rank == 2 ? tensor.shape[1] : 1;
  if (dim == 0) {  // Whole rows: one contiguous run.
    ConvertToF32(tensor.dtype, tensor.data + begin * cols * element_bytes,
                 static_cast<size_t>((end - begin) * cols), out);
    return absl::OkStatus();
  }
  const int64_t width = end - begin;
  for (int64_t row = 0; row < rows; ++row) {
    ConvertToF32(tensor.dtype, tensor.data + (row * cols + begin) * element_bytes,
                 static_cast<size_t>(width), out + row * width);
  }
  return absl::OkStatus();
}

uint64_t Checkpoint::TotalTensorBytes() const {
  // Tensors of unsupported dtypes are never read, so they are not counted, except the
  // integer tensors of quantized layers.
  auto quantized_part = [&](const std::string& name) {
    if (quantized_.contains(name)) return true;  // An FP8 weight.
    for (absl::string_view suffix : {".qweight", ".qzeros", ".g_idx"}) {
      if (absl::EndsWith(name, suffix) &&
          quantized_.contains(
              absl::StrCat(name.substr(0, name.size() - suffix.size()), ".weight"))) {
        return true;
      }
    }
    return false;
  };
  uint64_t total = 0;
  for (const auto& [name, file] : tensor_to_file_) {
    absl::StatusOr<TensorView> tensor = file->Find(name);
    if (tensor.ok()) {
      total += tensor->size_bytes;
    } else if (quantized_part(name)) {
      total += file->FindRaw(name)->size_bytes;
    }
  }
  return total;
}

}  // namespace conveyor
