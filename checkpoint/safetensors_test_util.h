// Builds `.safetensors` file contents in memory, for tests only.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "nlohmann/json.hpp"

namespace conveyor {

struct FakeTensor {
  std::string name;
  std::string dtype;  // Safetensors spelling, e.g. "F32".
  std::vector<int64_t> shape;
  std::string bytes;  // Raw little-endian element bytes.
};

// The raw bytes of `values`.
template <typename T>
std::string RawBytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

inline std::string FloatBytes(const std::vector<float>& values) { return RawBytes(values); }

inline FakeTensor F32Tensor(std::string name, std::vector<int64_t> shape,
                            const std::vector<float>& values) {
  return {std::move(name), "F32", std::move(shape), FloatBytes(values)};
}

// A file: the 8-byte little-endian length of `header`, `header`, then `data`.
inline std::string AssembleSafetensors(const std::string& header, const std::string& data) {
  const uint64_t length = header.size();
  std::string bytes(sizeof(length), '\0');
  std::memcpy(bytes.data(), &length, sizeof(length));
  return bytes + header + data;
}

// A well-formed file holding `tensors`, their data laid out in order.
inline std::string SafetensorsBytes(const std::vector<FakeTensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const FakeTensor& tensor : tensors) {
    header[tensor.name] = {{"dtype", tensor.dtype},
                           {"shape", tensor.shape},
                           {"data_offsets", {data.size(), data.size() + tensor.bytes.size()}}};
    data += tensor.bytes;
  }
  return AssembleSafetensors(header.dump(), data);
}

}  // namespace conveyor
