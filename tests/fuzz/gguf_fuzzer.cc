// Fuzzes checkpoint/gguf.h's parser on whole files held in memory (GgufFile::Parse, which
// Open uses on its mapping), then reads what it accepted: every metadata value, every
// tensor's bytes (ASan catches any read outside the input), the dequantization of the
// supported types, the ModelConfig and HF names (checkpoint/gguf_model.h), and the tokenizer
// the metadata describes (text/gguf_tokenizer.h), which then encodes and decodes. Beyond the
// sanitizers, it checks that each tensor lies inside the input, its bytes are what its
// type and dims need, and tensors do not overlap.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/gguf.h"
#include "checkpoint/gguf_model.h"
#include "tests/fuzz/fuzz_support.h"
#include "text/gguf_tokenizer.h"

namespace conveyor::fuzz {
namespace {

// Touches every value (so ASan sees any string or array pointing outside its storage).
size_t Visit(const GgufValue& value) {
  if (const std::string* s = value.AsString()) return s->size();
  if (const GgufArray* array = value.AsArray()) {
    size_t total = array->elements.size();
    for (const GgufValue& element : array->elements) {
      if (element.type() != array->element_type) {
        InvariantViolated("an array element of another type", GgufValueTypeName(element.type()));
      }
      total += Visit(element);
    }
    return total;
  }
  return value.AsDouble().has_value() ? 1 : 0;
}

void FuzzOne(const uint8_t* data, size_t size) {
  const auto* begin = reinterpret_cast<const std::byte*>(data);
  auto file = GgufFile::Parse("fuzz.gguf", std::span(begin, size));
  if (!file.ok()) return;
  for (const auto& [key, value] : (*file)->metadata()) {
    if ((*file)->FindMetadata(key) != &value) InvariantViolated("a key is not found", key);
    Visit(value);
  }
  std::vector<std::pair<uint64_t, uint64_t>> extents;
  for (const GgufTensorInfo& tensor : (*file)->tensors()) {
    if ((*file)->FindTensor(tensor.name) != &tensor) {
      InvariantViolated("a tensor is not found", tensor.name);
    }
    if (tensor.data < begin || tensor.size_bytes > size ||
        tensor.data + tensor.size_bytes > begin + size) {
      InvariantViolated("a tensor outside the file", tensor.name);
    }
    const GgmlTypeTraits traits = TraitsOf(tensor.type);
    if (static_cast<uint64_t>(tensor.NumElements() / traits.block_elements) * traits.block_bytes !=
        tensor.size_bytes) {
      InvariantViolated("a tensor's bytes do not match its dims",
                        absl::StrCat(tensor.name, ": ", tensor.size_bytes, " bytes"));
    }
    extents.emplace_back(tensor.offset, tensor.offset + tensor.size_bytes);
    if (traits.supported) {
      absl::StatusOr<std::vector<float>> values = (*file)->DequantizeTensor(tensor);
      if (!values.ok()) InvariantViolated("a supported tensor does not dequantize", tensor.name);
    }
  }
  std::sort(extents.begin(), extents.end());
  for (size_t i = 1; i < extents.size(); ++i) {
    if (extents[i - 1].second > extents[i].first) InvariantViolated("tensors overlap", "");
  }
  // Any tokenizer metadata: an error, or a tokenizer that runs.
  if (auto tokenizer = LoadGgufTokenizer(**file); tokenizer.ok()) {
    absl::StatusOr<std::vector<int>> ids =
        (*tokenizer)
            ->EncodeWithSpecialTokens("Hello  world\n<s> 12345 caf\xC3\xA9 \xF0\x9F\x9A\x80");
    if (!ids.ok()) InvariantViolated("a GGUF tokenizer cannot encode valid text", "");
    std::vector<int> all(std::min((*tokenizer)->vocab_size(), 512));
    for (size_t i = 0; i < all.size(); ++i) all[i] = static_cast<int>(i);
    (*tokenizer)->Decode(all);
    (*tokenizer)->Decode(*ids);
  }
  absl::StatusOr<ModelConfig> config = ModelConfigFromGguf(**file);
  if (!config.ok()) return;
  for (const GgufTensorInfo& tensor : (*file)->tensors()) {
    HfNameOfGgufTensor(tensor.name, *config);
  }
}

}  // namespace
}  // namespace conveyor::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  conveyor::fuzz::FuzzOne(data, size);
  return 0;
}
