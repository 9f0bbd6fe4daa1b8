#include "checkpoint/safetensors.h"

#include <bit>
#include <cstring>
#include <limits>
#include <optional>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"
#include "nlohmann/json.hpp"

namespace conveyor {
namespace {

// Safetensors is little-endian; elements are copied with memcpy as host values.
static_assert(std::endian::native == std::endian::little, "little-endian host required");

constexpr size_t kHeaderLengthBytes = 8;

std::optional<DType> ParseDType(const std::string& name) {
  if (name == "F32") return DType::kF32;
  if (name == "F16") return DType::kF16;
  if (name == "BF16") return DType::kBF16;
  return std::nullopt;
}

// Bytes per element of every dtype safetensors defines, or 0 for another.
size_t ElementBytes(const std::string& dtype) {
  if (std::optional<DType> known = ParseDType(dtype)) return DTypeSize(*known);
  static constexpr std::pair<const char*, size_t> kOthers[] = {
      {"F64", 8}, {"I64", 8}, {"U64", 8}, {"I32", 4},  {"U32", 4},     {"I16", 2},
      {"U16", 2}, {"I8", 1},  {"U8", 1},  {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  for (const auto& [name, bytes] : kOthers) {
    if (dtype == name) return bytes;
  }
  return 0;
}

absl::Status Corrupt(const std::string& path, absl::string_view problem) {
  return absl::DataLossError(absl::StrCat(path, ": ", problem));
}

absl::Status CorruptTensor(const std::string& path, const std::string& tensor,
                           absl::string_view problem) {
  return absl::DataLossError(absl::StrCat(path, ": tensor '", tensor, "': ", problem));
}

// Reads a JSON array of non-negative integers that fit in int64.
bool ReadNonNegativeInts(const nlohmann::json& value, std::vector<int64_t>* out) {
  if (!value.is_array()) return false;
  out->clear();
  for (const nlohmann::json& element : value) {
    if (!element.is_number_unsigned() ||
        element.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return false;
    }
    out->push_back(element.get<int64_t>());
  }
  return true;
}

// Validates one header entry against a data section of `data_bytes` and stores its
// fields. A dtype safetensors does not define is kept as written; its size cannot be
// checked.
absl::Status ParseEntry(const std::string& path, const std::string& name,
                        const nlohmann::json& value, size_t data_bytes, std::string* dtype,
                        std::vector<int64_t>* shape, size_t* begin, size_t* end) {
  if (!value.is_object()) return CorruptTensor(path, name, "entry is not a JSON object");
  auto dtype_it = value.find("dtype");
  if (dtype_it == value.end() || !dtype_it->is_string()) {
    return CorruptTensor(path, name, "missing or non-string 'dtype'");
  }
  *dtype = dtype_it->get<std::string>();
  auto shape_it = value.find("shape");
  if (shape_it == value.end() || !ReadNonNegativeInts(*shape_it, shape)) {
    return CorruptTensor(path, name, "'shape' is not a list of non-negative integers");
  }
  std::vector<int64_t> offsets;
  auto offsets_it = value.find("data_offsets");
  if (offsets_it == value.end() || !ReadNonNegativeInts(*offsets_it, &offsets) ||
      offsets.size() != 2) {
    return CorruptTensor(path, name, "'data_offsets' is not a pair of non-negative integers");
  }
  if (offsets[0] > offsets[1]) {
    return CorruptTensor(
        path, name,
        absl::StrCat("data_offsets [", offsets[0], ", ", offsets[1], ") begin after they end"));
  }
  if (static_cast<uint64_t>(offsets[1]) > data_bytes) {
    return CorruptTensor(
        path, name,
        absl::StrCat("data_offsets [", offsets[0], ", ", offsets[1],
                     ") exceed the data section of ", data_bytes, " bytes (file truncated?)"));
  }
  *begin = static_cast<size_t>(offsets[0]);
  *end = static_cast<size_t>(offsets[1]);
  if (const size_t element_bytes = ElementBytes(*dtype); element_bytes != 0) {
    uint64_t expected_bytes = element_bytes;
    bool overflow = false;
    for (int64_t dim : *shape) {
      overflow |=
          __builtin_mul_overflow(expected_bytes, static_cast<uint64_t>(dim), &expected_bytes);
    }
    if (overflow || expected_bytes != *end - *begin) {
      return CorruptTensor(
          path, name,
          absl::StrCat("data_offsets span ", *end - *begin, " bytes but dtype ", *dtype,
                       " and its shape need ",
                       overflow ? "more than 2^64" : absl::StrCat(expected_bytes)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

size_t DTypeSize(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
  }
  return "?";
}

int64_t TensorView::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

SafetensorsFile::SafetensorsFile(std::string path, MappedFile mapping)
    : path_(std::move(path)), mapping_(std::move(mapping)) {}

SafetensorsFile::~SafetensorsFile() = default;

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::Map(path));
  return FromImage(path, std::move(mapping));
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(
    std::string path, std::span<const std::byte> image) {
  return FromImage(std::move(path), MappedFile(), image);
}

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::FromImage(
    std::string path, MappedFile mapping, std::span<const std::byte> image) {
  if (!mapping.bytes().empty()) image = mapping.bytes();
  if (image.size() < kHeaderLengthBytes) {
    return Corrupt(path, absl::StrCat("file is ", image.size(),
                                      " bytes, too short for the 8-byte header length"));
  }
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(path), std::move(mapping)));
  RETURN_IF_ERROR(file->ParseHeader(image));
  return file;
}

absl::Status SafetensorsFile::ParseHeader(std::span<const std::byte> image) {
  const std::byte* bytes = image.data();
  const size_t file_bytes = image.size();
  const std::string& path = path_;
  uint64_t header_bytes;
  std::memcpy(&header_bytes, bytes, kHeaderLengthBytes);
  if (header_bytes > file_bytes - kHeaderLengthBytes) {
    return Corrupt(path, absl::StrCat("header length ", header_bytes, " exceeds the ",
                                      file_bytes - kHeaderLengthBytes,
                                      " bytes after the length field (file truncated?)"));
  }
  const auto* header_begin = reinterpret_cast<const char*>(bytes + kHeaderLengthBytes);
  const nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + header_bytes,
                                                      /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (header.is_discarded()) return Corrupt(path, "header is not valid JSON");
  if (!header.is_object()) return Corrupt(path, "header is not a JSON object");

  data_section_ = bytes + kHeaderLengthBytes + header_bytes;
  const size_t data_bytes = file_bytes - kHeaderLengthBytes - header_bytes;
  for (const auto& [name, value] : header.items()) {
    if (name == "__metadata__") continue;
    Entry& entry = entries_[name];
    RETURN_IF_ERROR(ParseEntry(path, name, value, data_bytes, &entry.dtype, &entry.shape,
                               &entry.begin, &entry.end));
  }
  return absl::OkStatus();
}

absl::StatusOr<TensorView> SafetensorsFile::Find(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const Entry& entry = it->second;
  std::optional<DType> dtype = ParseDType(entry.dtype);
  if (!dtype) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor '", name,
                                                   "' has unsupported dtype '", entry.dtype,
                                                   "' (supported: F32, F16, BF16)"));
  }
  TensorView view;
  view.name = name;
  view.dtype = *dtype;
  view.shape = entry.shape;
  view.data = data_section_ + entry.begin;
  view.size_bytes = entry.end - entry.begin;
  return view;
}

absl::StatusOr<RawTensorView> SafetensorsFile::FindRaw(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor '", name, "'"));
  }
  const Entry& entry = it->second;
  return RawTensorView{name, entry.dtype, entry.shape, data_section_ + entry.begin,
                       entry.end - entry.begin};
}

bool SafetensorsFile::Contains(const std::string& name) const { return entries_.contains(name); }

std::vector<std::string> SafetensorsFile::TensorNames() const {
  std::vector<std::string> names;
  names.reserve(entries_.size());
  for (const auto& [name, entry] : entries_) names.push_back(name);
  return names;
}

void ConvertToF32(DType dtype, const std::byte* src, size_t count, float* dst) {
  // An empty tensor's buffers may be null, which memcpy must not get even for no bytes.
  if (count == 0) return;
  switch (dtype) {
    case DType::kF32:
      std::memcpy(dst, src, count * sizeof(float));
      return;
    case DType::kF16:
      for (size_t i = 0; i < count; ++i) {
        uint16_t half;
        std::memcpy(&half, src + 2 * i, sizeof(half));
        dst[i] = HalfToFloat(half);
      }
      return;
    case DType::kBF16:
      // bfloat16 is the top half of a float32.
      for (size_t i = 0; i < count; ++i) {
        uint16_t bf16;
        std::memcpy(&bf16, src + 2 * i, sizeof(bf16));
        dst[i] = std::bit_cast<float>(static_cast<uint32_t>(bf16) << 16);
      }
      return;
  }
}

}  // namespace conveyor
