// Read-only, memory-mapped access to one `.safetensors` file.
//
// Format: an 8-byte little-endian header length N, N bytes of JSON mapping tensor names
// to {dtype, shape, data_offsets}, then the raw tensor bytes. Every offset and size is
// checked against the file when it is opened, so a truncated or corrupt file is an error
// naming the file (and the tensor), never an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/file_util.h"

namespace conveyor {

enum class DType { kF32, kF16, kBF16 };

// Bytes per element of `dtype`.
size_t DTypeSize(DType dtype);
// "F32", "F16", "BF16": the safetensors spelling.
const char* DTypeName(DType dtype);

struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;  // Points into the mapping; valid while the file lives.
  size_t size_bytes = 0;

  int64_t NumElements() const;
};

// A tensor of any dtype, as stored: for the integer tensors of GPTQ and AWQ checkpoints
// (qweight, qzeros, g_idx: "I32"), which Find refuses.
struct RawTensorView {
  std::string name;
  std::string dtype;  // As written: "I32", "F16", ...
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t size_bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates its header. Unsupported dtypes (anything but F32, F16,
  // BF16) are an error only when such a tensor is looked up.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // The same checks on a whole file's bytes already in memory (Open maps the file and
  // calls this; the fuzzer feeds it directly). `image` is not copied: it must outlive
  // the result, whose tensors point into it. `path` names it in error messages.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Parse(std::string path,
                                                                std::span<const std::byte> image);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // Returns the tensor called `name`, or NOT_FOUND naming the file.
  absl::StatusOr<TensorView> Find(const std::string& name) const;
  // The tensor called `name` whatever its dtype, or NOT_FOUND naming the file. Its size
  // was checked against its shape when the file was opened where the dtype is one of
  // safetensors' (F64 ... BOOL), else not at all.
  absl::StatusOr<RawTensorView> FindRaw(const std::string& name) const;
  bool Contains(const std::string& name) const;
  std::vector<std::string> TensorNames() const;
  const std::string& path() const { return path_; }

 private:
  struct Entry {
    std::string dtype;  // As written in the header.
    std::vector<int64_t> shape;
    size_t begin = 0;  // Offsets relative to the start of the data section.
    size_t end = 0;
  };
  // `mapping` is empty for Parse's borrowed image.
  SafetensorsFile(std::string path, MappedFile mapping);
  // Open's and Parse's common part: the file `mapping` holds, or else `image`.
  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> FromImage(
      std::string path, MappedFile mapping, std::span<const std::byte> image = {});
  // Validates the header of `image` and fills entries_ and data_section_.
  absl::Status ParseHeader(std::span<const std::byte> image);

  std::string path_;
  MappedFile mapping_;
  const std::byte* data_section_ = nullptr;
  std::map<std::string, Entry> entries_;
};

// Converts `count` elements of `dtype` at `src` to float32 at `dst` (either may be null
// when `count` is 0).
void ConvertToF32(DType dtype, const std::byte* src, size_t count, float* dst);

}  // namespace conveyor
