// Read-only, memory-mapped access to one GGUF file (llama.cpp's checkpoint format),
// versions 2 and 3, little-endian.
//
// Layout: "GGUF", a version, the tensor and metadata counts, the metadata (typed
// key/value pairs: numbers, bools, strings and arrays of them, arrays nesting), the
// tensor infos (name, dims, ggml type, offset), then, at the next multiple of the
// alignment (`general.alignment`, default 32), the data section the offsets count from.
// Everything is checked when the file is opened: a truncated or corrupt file (bad magic,
// absurd counts, offsets or sizes past the end, overflowing shapes, misaligned or
// overlapping tensors, duplicate names, unknown value or tensor types) is an error naming
// the file and the key or tensor, never an out-of-bounds read. docs/gguf.md has the
// details; checkpoint/gguf_model.h turns the metadata into a ModelConfig.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/file_util.h"
#include "checkpoint/ggml_types.h"

namespace conveyor {

// gguf_type: the type ids of metadata values. The order is that of GgufValue's variant.
enum class GgufValueType : uint32_t {
  kUint8 = 0,
  kInt8 = 1,
  kUint16 = 2,
  kInt16 = 3,
  kUint32 = 4,
  kInt32 = 5,
  kFloat32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kUint64 = 10,
  kInt64 = 11,
  kFloat64 = 12,
};

// "uint32", "string", ...: for messages.
const char* GgufValueTypeName(GgufValueType type);

struct GgufValue;
struct GgufArray {
  GgufValueType element_type = GgufValueType::kUint8;
  std::vector<GgufValue> elements;  // All of element_type.
};

// One metadata value. The variant's index is the value's GgufValueType.
struct GgufValue {
  std::variant<uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t, float, bool, std::string,
               GgufArray, uint64_t, int64_t, double>
      value;

  GgufValueType type() const { return static_cast<GgufValueType>(value.index()); }
  // The value of an integer type (not bool) when it fits in int64.
  std::optional<int64_t> AsInt() const;
  // The value of any number type (integers converted; not bool).
  std::optional<double> AsDouble() const;
  const std::string* AsString() const { return std::get_if<std::string>(&value); }
  const GgufArray* AsArray() const { return std::get_if<GgufArray>(&value); }
};

struct GgufTensorInfo {
  std::string name;
  // ggml order: dims[0] is the contiguous one (a row's length), the reverse of the
  // row-major shape PyTorch and safetensors write. At most 4.
  std::vector<int64_t> dims;
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;  // From the start of the data section; a multiple of the alignment.
  uint64_t size_bytes = 0;
  const std::byte* data = nullptr;  // Points into the mapping; valid while the file lives.

  int64_t NumElements() const;
  // The row-major shape: dims reversed ([rows, row length] for a matrix).
  std::vector<int64_t> Shape() const;
};

class GgufFile {
 public:
  static constexpr uint64_t kDefaultAlignment = 32;

  // Maps `path` and validates all of it.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // The same checks on a whole file's bytes already in memory (Open maps the file and
  // calls this; the fuzzer and tests feed it directly). `image` is not copied: it must
  // outlive the result, whose tensors point into it. `path` names it in error messages.
  static absl::StatusOr<std::unique_ptr<GgufFile>> Parse(std::string path,
                                                         std::span<const std::byte> image);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Where the data section starts, in bytes from the start of the file.
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return metadata_; }
  // The value of `key`, or null.
  const GgufValue* FindMetadata(std::string_view key) const;
  // Typed reads of `key`: NOT_FOUND when absent, INVALID_ARGUMENT when of another type
  // (GetInt takes any integer type that fits, GetFloat any number), both naming the file
  // and the key.
  absl::StatusOr<int64_t> GetInt(std::string_view key) const;
  absl::StatusOr<double> GetFloat(std::string_view key) const;
  absl::StatusOr<std::string> GetString(std::string_view key) const;

  // Tensor infos in file order.
  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  // The tensor called `name`, or null.
  const GgufTensorInfo* FindTensor(std::string_view name) const;

  // The tensor's elements as float32 (DequantizeToF32); UNIMPLEMENTED naming the file, the
  // tensor and its type for a type Conveyor does not support.
  absl::StatusOr<std::vector<float>> DequantizeTensor(const GgufTensorInfo& tensor) const;

 private:
  friend class GgufParser;
  // `mapping` is empty for Parse's borrowed image.
  GgufFile(std::string path, MappedFile mapping);

  std::string path_;
  MappedFile mapping_;
  uint32_t version_ = 0;
  uint64_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace conveyor
