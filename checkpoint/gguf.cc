#include "checkpoint/gguf.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "common/status_macros.h"

namespace conveyor {
namespace {

// GGUF numbers are copied with memcpy as host values; big-endian files are refused.
static_assert(std::endian::native == std::endian::little, "little-endian host required");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian uint32.
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8;
constexpr int kMaxDims = 4;          // GGML_MAX_DIMS.
constexpr int kMaxArrayNesting = 8;  // Deeper arrays are refused (no file needs any).
// The fewest bytes one entry can take, to refuse counts the file cannot hold before
// reserving anything: a key/value is a key length (8), a type (4) and a value (1 or
// more); a tensor info a name length (8), a dim count (4), a type (4) and an offset (8).
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 4 + 8;

// Bytes one array element of `type` takes at least (a string: its 8-byte length).
uint64_t MinValueBytes(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
    case GgufValueType::kInt8:
    case GgufValueType::kBool:
      return 1;
    case GgufValueType::kUint16:
    case GgufValueType::kInt16:
      return 2;
    case GgufValueType::kUint32:
    case GgufValueType::kInt32:
    case GgufValueType::kFloat32:
      return 4;
    case GgufValueType::kArray:
      return 4 + 8;
    case GgufValueType::kString:
    case GgufValueType::kUint64:
    case GgufValueType::kInt64:
    case GgufValueType::kFloat64:
      return 8;
  }
  return 1;
}

}  // namespace

// Reads one image front to back; every read is bounds-checked and every error names the
// file, the key or tensor being read, and the byte offset.
class GgufParser {
 public:
  GgufParser(GgufFile* file, std::span<const std::byte> image) : file_(*file), image_(image) {}

  absl::Status Run() {
    if (image_.size() < kHeaderBytes) {
      return Corrupt(absl::StrCat("file is ", image_.size(), " bytes, too short for the ",
                                  kHeaderBytes, "-byte GGUF header"));
    }
    uint32_t magic = 0;
    RETURN_IF_ERROR(ReadPod(&magic));
    if (magic != kMagic) {
      return Corrupt(absl::StrCat("bad magic 0x", absl::Hex(magic, absl::kZeroPad8),
                                  ": not a GGUF file (it starts with \"GGUF\")"));
    }
    uint32_t version = 0;
    RETURN_IF_ERROR(ReadPod(&version));
    if (version == 2 || version == 3) {
      file_.version_ = version;
    } else if ((version & 0xffff) == 0 && (version >> 16) != 0) {
      // A version of 2 or 3 written big-endian reads as 0x02000000 or 0x03000000.
      return absl::InvalidArgumentError(
          absl::StrCat(file_.path_, ": big-endian GGUF file (version reads as 0x",
                       absl::Hex(version), "); only little-endian files are supported"));
    } else {
      return absl::InvalidArgumentError(absl::StrCat(file_.path_, ": GGUF version ", version,
                                                     " is not supported (versions 2 and 3 are)"));
    }
    uint64_t tensor_count = 0, kv_count = 0;
    RETURN_IF_ERROR(ReadPod(&tensor_count));
    RETURN_IF_ERROR(ReadPod(&kv_count));
    if (kv_count > Remaining() / kMinKeyValueBytes) {
      return Corrupt(absl::StrCat("metadata count ", kv_count, " is more than the ", Remaining(),
                                  " remaining bytes can hold"));
    }
    if (tensor_count > Remaining() / kMinTensorInfoBytes) {
      return Corrupt(absl::StrCat("tensor count ", tensor_count, " is more than the ", Remaining(),
                                  " remaining bytes can hold"));
    }
    file_.metadata_.reserve(kv_count);
    for (uint64_t i = 0; i < kv_count; ++i) RETURN_IF_ERROR(ReadKeyValue(i));
    RETURN_IF_ERROR(ReadAlignment());
    file_.tensors_.reserve(tensor_count);
    for (uint64_t i = 0; i < tensor_count; ++i) RETURN_IF_ERROR(ReadTensorInfo(i));
    return PlaceTensors();
  }

 private:
  uint64_t Remaining() const { return image_.size() - pos_; }

  absl::Status Corrupt(absl::string_view problem) const {
    return absl::DataLossError(absl::StrCat(file_.path_, ": ", problem));
  }
  absl::Status CorruptAt(absl::string_view what, absl::string_view problem) const {
    return absl::DataLossError(
        absl::StrCat(file_.path_, ": ", what, ": ", problem, " (at byte ", pos_, ")"));
  }

  absl::Status Truncated(uint64_t needed) const {
    return Corrupt(absl::StrCat("needs ", needed, " bytes at byte ", pos_, " but only ",
                                Remaining(), " remain (file truncated?)"));
  }

  template <typename T>
  absl::Status ReadPod(T* out) {
    static_assert(std::is_trivially_copyable_v<T>);
    if (Remaining() < sizeof(T)) return Truncated(sizeof(T));
    std::memcpy(out, image_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return absl::OkStatus();
  }

  absl::Status ReadString(std::string* out) {
    uint64_t length = 0;
    RETURN_IF_ERROR(ReadPod(&length));
    if (length > Remaining()) {
      pos_ -= sizeof(length);
      return Corrupt(absl::StrCat("string of ", length, " bytes at byte ", pos_,
                                  " runs past the end of the file (", image_.size(), " bytes)"));
    }
    out->assign(reinterpret_cast<const char*>(image_.data() + pos_), length);
    pos_ += length;
    return absl::OkStatus();
  }

  absl::Status WithContext(const absl::Status& status, absl::string_view what) const {
    if (status.ok()) return status;
    // Insert "key 'x': " after the path, keeping the code.
    std::string message(status.message());
    const std::string prefix = absl::StrCat(file_.path_, ": ");
    if (message.starts_with(prefix)) message = message.substr(prefix.size());
    return absl::Status(status.code(), absl::StrCat(prefix, what, ": ", message));
  }

  absl::Status ReadKeyValue(uint64_t index) {
    std::string key;
    RETURN_IF_ERROR(WithContext(ReadString(&key), absl::StrCat("metadata entry ", index)));
    const std::string what = absl::StrCat("key '", key, "'");
    if (file_.metadata_index_.contains(key)) return CorruptAt(what, "appears twice");
    uint32_t type = 0;
    RETURN_IF_ERROR(WithContext(ReadPod(&type), what));
    GgufValue value;
    RETURN_IF_ERROR(WithContext(ReadValue(type, 0, &value), what));
    file_.metadata_index_.emplace(key, file_.metadata_.size());
    file_.metadata_.emplace_back(std::move(key), std::move(value));
    return absl::OkStatus();
  }

  absl::Status ReadValue(uint32_t type, int depth, GgufValue* out) {
    switch (static_cast<GgufValueType>(type)) {
      case GgufValueType::kUint8:
        return ReadScalar<uint8_t>(out);
      case GgufValueType::kInt8:
        return ReadScalar<int8_t>(out);
      case GgufValueType::kUint16:
        return ReadScalar<uint16_t>(out);
      case GgufValueType::kInt16:
        return ReadScalar<int16_t>(out);
      case GgufValueType::kUint32:
        return ReadScalar<uint32_t>(out);
      case GgufValueType::kInt32:
        return ReadScalar<int32_t>(out);
      case GgufValueType::kFloat32:
        return ReadScalar<float>(out);
      case GgufValueType::kUint64:
        return ReadScalar<uint64_t>(out);
      case GgufValueType::kInt64:
        return ReadScalar<int64_t>(out);
      case GgufValueType::kFloat64:
        return ReadScalar<double>(out);
      case GgufValueType::kBool: {
        uint8_t byte = 0;
        RETURN_IF_ERROR(ReadPod(&byte));
        if (byte > 1) {
          return CorruptAt("bool", absl::StrCat("value ", byte, " is neither 0 nor 1"));
        }
        out->value = byte == 1;
        return absl::OkStatus();
      }
      case GgufValueType::kString:
        return ReadString(&out->value.emplace<std::string>());
      case GgufValueType::kArray:
        return ReadArray(depth, &out->value.emplace<GgufArray>());
    }
    return CorruptAt("value", absl::StrCat("unknown value type ", type));
  }

  template <typename T>
  absl::Status ReadScalar(GgufValue* out) {
    T value{};
    RETURN_IF_ERROR(ReadPod(&value));
    out->value = value;
    return absl::OkStatus();
  }

  absl::Status ReadArray(int depth, GgufArray* array) {
    if (depth >= kMaxArrayNesting) {
      return CorruptAt("array", absl::StrCat("arrays nest deeper than ", kMaxArrayNesting));
    }
    uint32_t element_type = 0;
    uint64_t count = 0;
    RETURN_IF_ERROR(ReadPod(&element_type));
    if (element_type > static_cast<uint32_t>(GgufValueType::kFloat64)) {
      return CorruptAt("array", absl::StrCat("unknown element type ", element_type));
    }
    array->element_type = static_cast<GgufValueType>(element_type);
    RETURN_IF_ERROR(ReadPod(&count));
    if (count > Remaining() / MinValueBytes(array->element_type)) {
      return CorruptAt(
          "array", absl::StrCat(count, " elements of type ", GgufValueTypeName(array->element_type),
                                " are more than the ", Remaining(), " remaining bytes can hold"));
    }
    array->elements.resize(count);
    for (GgufValue& element : array->elements) {
      RETURN_IF_ERROR(ReadValue(element_type, depth + 1, &element));
    }
    return absl::OkStatus();
  }

  absl::Status ReadAlignment() {
    const GgufValue* value = file_.FindMetadata("general.alignment");
    if (value == nullptr) return absl::OkStatus();
    const std::optional<int64_t> alignment = value->AsInt();
    // Up to 2^30: enough for any page size, and far from overflowing offset arithmetic.
    if (!alignment || *alignment <= 0 || *alignment > (int64_t{1} << 30) ||
        !std::has_single_bit(static_cast<uint64_t>(*alignment))) {
      return Corrupt("key 'general.alignment': must be an integer power of two from 1 to 2^30");
    }
    file_.alignment_ = static_cast<uint64_t>(*alignment);
    return absl::OkStatus();
  }

  absl::Status ReadTensorInfo(uint64_t index) {
    GgufTensorInfo info;
    RETURN_IF_ERROR(WithContext(ReadString(&info.name), absl::StrCat("tensor info ", index)));
    const std::string what = absl::StrCat("tensor '", info.name, "'");
    if (file_.tensor_index_.contains(info.name)) return CorruptAt(what, "appears twice");
    uint32_t n_dims = 0;
    RETURN_IF_ERROR(WithContext(ReadPod(&n_dims), what));
    if (n_dims > kMaxDims) {
      return CorruptAt(what, absl::StrCat(n_dims, " dimensions (at most ", kMaxDims, ")"));
    }
    info.dims.resize(n_dims);
    int64_t elements = 1;
    bool overflow = false;
    for (int64_t& dim : info.dims) {
      RETURN_IF_ERROR(WithContext(ReadPod(&dim), what));
      if (dim < 0) return CorruptAt(what, absl::StrCat("negative dimension ", dim));
      overflow |= __builtin_mul_overflow(elements, dim, &elements);
    }
    uint32_t type_id = 0;
    RETURN_IF_ERROR(WithContext(ReadPod(&type_id), what));
    const std::optional<GgmlTypeTraits> traits = GgmlTypeFromId(type_id);
    if (!traits) return CorruptAt(what, absl::StrCat("unknown tensor type ", type_id));
    info.type = traits->type;
    RETURN_IF_ERROR(WithContext(ReadPod(&info.offset), what));
    if (overflow) {
      return CorruptAt(what, absl::StrCat("the product of its dimensions overflows int64"));
    }
    const int64_t row = info.dims.empty() ? 1 : info.dims[0];
    if (row % traits->block_elements != 0) {
      return CorruptAt(what, absl::StrCat("rows of ", row, " elements are not whole ", traits->name,
                                          " blocks of ", traits->block_elements));
    }
    uint64_t bytes = 0;
    if (__builtin_mul_overflow(static_cast<uint64_t>(elements / traits->block_elements),
                               static_cast<uint64_t>(traits->block_bytes), &bytes)) {
      return CorruptAt(what, "its size in bytes overflows");
    }
    info.size_bytes = bytes;
    if (info.offset % file_.alignment_ != 0) {
      return CorruptAt(what,
                       absl::StrCat("offset ", info.offset, " is not a multiple of the alignment ",
                                    file_.alignment_));
    }
    file_.tensor_index_.emplace(info.name, file_.tensors_.size());
    file_.tensors_.push_back(std::move(info));
    return absl::OkStatus();
  }

  // The data section starts at the next multiple of the alignment; every tensor must lie
  // inside it, and no two may overlap.
  absl::Status PlaceTensors() {
    const uint64_t alignment = file_.alignment_;
    file_.data_offset_ = (pos_ + alignment - 1) / alignment * alignment;
    if (file_.data_offset_ > image_.size()) {
      // Not even an empty tensor has a place: its data pointer would lie past the end.
      if (file_.tensors_.empty()) return absl::OkStatus();
      return Corrupt(absl::StrCat("the data section would start at byte ", file_.data_offset_,
                                  ", past the end of the file (", image_.size(),
                                  " bytes; truncated?)"));
    }
    const uint64_t data_bytes = image_.size() - file_.data_offset_;
    std::vector<const GgufTensorInfo*> by_offset;
    by_offset.reserve(file_.tensors_.size());
    for (GgufTensorInfo& tensor : file_.tensors_) {
      if (tensor.offset > data_bytes || tensor.size_bytes > data_bytes - tensor.offset) {
        return Corrupt(absl::StrCat("tensor '", tensor.name, "': bytes [", tensor.offset, ", +",
                                    tensor.size_bytes, ") exceed the data section of ", data_bytes,
                                    " bytes at byte ", file_.data_offset_, " (file truncated?)"));
      }
      tensor.data = image_.data() + file_.data_offset_ + tensor.offset;
      by_offset.push_back(&tensor);
    }
    std::sort(
        by_offset.begin(), by_offset.end(),
        [](const GgufTensorInfo* a, const GgufTensorInfo* b) { return a->offset < b->offset; });
    for (size_t i = 1; i < by_offset.size(); ++i) {
      const GgufTensorInfo& before = *by_offset[i - 1];
      const GgufTensorInfo& after = *by_offset[i];
      if (before.offset + before.size_bytes > after.offset) {
        return Corrupt(absl::StrCat("tensors '", before.name, "' and '", after.name,
                                    "' overlap (offsets ", before.offset, " and ", after.offset,
                                    ")"));
      }
    }
    return absl::OkStatus();
  }

  GgufFile& file_;
  std::span<const std::byte> image_;
  uint64_t pos_ = 0;
};

const char* GgufValueTypeName(GgufValueType type) {
  switch (type) {
    case GgufValueType::kUint8:
      return "uint8";
    case GgufValueType::kInt8:
      return "int8";
    case GgufValueType::kUint16:
      return "uint16";
    case GgufValueType::kInt16:
      return "int16";
    case GgufValueType::kUint32:
      return "uint32";
    case GgufValueType::kInt32:
      return "int32";
    case GgufValueType::kFloat32:
      return "float32";
    case GgufValueType::kBool:
      return "bool";
    case GgufValueType::kString:
      return "string";
    case GgufValueType::kArray:
      return "array";
    case GgufValueType::kUint64:
      return "uint64";
    case GgufValueType::kInt64:
      return "int64";
    case GgufValueType::kFloat64:
      return "float64";
  }
  return "?";
}

std::optional<int64_t> GgufValue::AsInt() const {
  return std::visit(
      [](const auto& v) -> std::optional<int64_t> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_same_v<T, uint64_t>) {
          if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
          return static_cast<int64_t>(v);
        } else if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<int64_t>(v);
        } else {
          return std::nullopt;
        }
      },
      value);
}

std::optional<double> GgufValue::AsDouble() const {
  return std::visit(
      [](const auto& v) -> std::optional<double> {
        using T = std::decay_t<decltype(v)>;
        if constexpr (std::is_arithmetic_v<T> && !std::is_same_v<T, bool>) {
          return static_cast<double>(v);
        } else {
          return std::nullopt;
        }
      },
      value);
}

int64_t GgufTensorInfo::NumElements() const {
  int64_t count = 1;
  for (int64_t dim : dims) count *= dim;  // Checked not to overflow when parsed.
  return count;
}

std::vector<int64_t> GgufTensorInfo::Shape() const { return {dims.rbegin(), dims.rend()}; }

GgufFile::GgufFile(std::string path, MappedFile mapping)
    : path_(std::move(path)), mapping_(std::move(mapping)) {}

GgufFile::~GgufFile() = default;

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(MappedFile mapping, MappedFile::Map(path));
  const std::span<const std::byte> image = mapping.bytes();
  if (image.size() < kHeaderBytes) {
    return absl::DataLossError(absl::StrCat(path, ": file is ", image.size(),
                                            " bytes, too short for the ", kHeaderBytes,
                                            "-byte GGUF header"));
  }
  std::unique_ptr<GgufFile> file(new GgufFile(path, std::move(mapping)));
  GgufParser parser(file.get(), image);
  RETURN_IF_ERROR(parser.Run());
  return file;
}

absl::StatusOr<std::unique_ptr<GgufFile>> GgufFile::Parse(std::string path,
                                                          std::span<const std::byte> image) {
  std::unique_ptr<GgufFile> file(new GgufFile(std::move(path), MappedFile()));
  GgufParser parser(file.get(), image);
  RETURN_IF_ERROR(parser.Run());
  return file;
}

const GgufValue* GgufFile::FindMetadata(std::string_view key) const {
  auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

absl::StatusOr<int64_t> GgufFile::GetInt(std::string_view key) const {
  const GgufValue* value = FindMetadata(key);
  if (value == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no metadata key '", std::string(key), "'"));
  }
  if (std::optional<int64_t> result = value->AsInt()) return *result;
  return absl::InvalidArgumentError(absl::StrCat(path_, ": key '", std::string(key),
                                                 "' must be an integer that fits in int64, is ",
                                                 GgufValueTypeName(value->type())));
}

absl::StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const GgufValue* value = FindMetadata(key);
  if (value == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no metadata key '", std::string(key), "'"));
  }
  if (std::optional<double> result = value->AsDouble()) return *result;
  return absl::InvalidArgumentError(absl::StrCat(path_, ": key '", std::string(key),
                                                 "' must be a number, is ",
                                                 GgufValueTypeName(value->type())));
}

absl::StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const GgufValue* value = FindMetadata(key);
  if (value == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no metadata key '", std::string(key), "'"));
  }
  if (const std::string* result = value->AsString()) return *result;
  return absl::InvalidArgumentError(absl::StrCat(path_, ": key '", std::string(key),
                                                 "' must be a string, is ",
                                                 GgufValueTypeName(value->type())));
}

const GgufTensorInfo* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

absl::StatusOr<std::vector<float>> GgufFile::DequantizeTensor(const GgufTensorInfo& tensor) const {
  std::vector<float> values(static_cast<size_t>(tensor.NumElements()));
  const absl::Status status =
      DequantizeToF32(tensor.type, tensor.data, tensor.NumElements(), values.data());
  if (!status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat(path_, ": tensor '", tensor.name, "': ", status.message()));
  }
  return values;
}

}  // namespace conveyor
