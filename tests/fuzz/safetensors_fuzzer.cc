// Fuzzes checkpoint/safetensors.h's header parser on whole files held in memory
// (SafetensorsFile::Parse, which Open uses on its mapping), then reads every tensor it
// accepted: ASan catches any read a validated tensor makes outside the input. Beyond the
// sanitizers, it checks that each tensor's bytes are what its dtype and shape need.
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/safetensors.h"
#include "tests/fuzz/fuzz_support.h"

namespace conveyor::fuzz {
namespace {

void FuzzOne(const uint8_t* data, size_t size) {
  auto file = SafetensorsFile::Parse("fuzz.safetensors",
                                     std::span(reinterpret_cast<const std::byte*>(data), size));
  if (!file.ok()) return;
  std::vector<float> converted;
  for (const std::string& name : (*file)->TensorNames()) {
    if (!(*file)->Contains(name)) InvariantViolated("a listed tensor is missing", name);
    absl::StatusOr<TensorView> tensor = (*file)->Find(name);
    if (!tensor.ok()) continue;  // An unsupported dtype.
    const auto* begin = reinterpret_cast<const std::byte*>(data);
    if (tensor->data < begin || tensor->data + tensor->size_bytes > begin + size) {
      InvariantViolated("a tensor outside the file", name);
    }
    const size_t elements = tensor->size_bytes / DTypeSize(tensor->dtype);
    if (elements * DTypeSize(tensor->dtype) != tensor->size_bytes ||
        static_cast<uint64_t>(tensor->NumElements()) != elements) {
      InvariantViolated("a tensor's bytes do not match its shape",
                        absl::StrCat(name, ": ", tensor->size_bytes, " bytes"));
    }
    converted.resize(elements);
    ConvertToF32(tensor->dtype, tensor->data, elements, converted.data());
  }
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
