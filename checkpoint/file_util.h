// Reading a model's files from paths that may come over the wire (a worker's Init carries
// the model path): the small text files of a model directory (config.json, the shard
// index) read whole, the weight files (safetensors, GGUF) mapped; and the float16 values
// both weight formats store.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "absl/status/statusor.h"

namespace conveyor {

// The whole of the regular file at `path`. NOT_FOUND when there is none (a directory is
// not a file); INVALID_ARGUMENT for a path with a NUL byte, which the C library would cut
// short and so open another file than the one named; DATA_LOSS when reading fails.
// Never throws (std::ifstream's buffer throws on a read error such as EISDIR).
absl::StatusOr<std::string> ReadWholeFile(const std::string& path);

// A whole regular file mapped read-only (private), unmapped when this is destroyed; the
// mapping stays valid without the descriptor. Default-constructed: no bytes (the owner of
// a borrowed image holds one of these).
class MappedFile {
 public:
  MappedFile() = default;
  // The errors of open, fstat and mmap with errno's code, naming `path`; INVALID_ARGUMENT
  // when `path` is not a regular file. An empty file maps to no bytes.
  static absl::StatusOr<MappedFile> Map(const std::string& path);
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }

 private:
  MappedFile(void* data, size_t size) : data_(data), size_(size) {}
  void* data_ = nullptr;
  size_t size_ = 0;
};

// An IEEE binary16 value as float32 (exact: every half is a float); NaN payloads kept.
float HalfToFloat(uint16_t half);
// The IEEE binary16 nearest `value` (ties to even, as numpy's float16 cast and the F16C
// instruction round): Inf past 65504, subnormals below 2^-14, NaN as a quiet NaN.
uint16_t FloatToHalf(float value);

}  // namespace conveyor
