// The tensor types of ggml (and so of GGUF files): their ids as written in a file, their
// block layout (how many elements one block holds and how many bytes it takes), which of
// them Conveyor supports, and their dequantization to float32 for the supported ones.
//
// Block layouts and formulas are ggml's (ggml-common.h, dequantize_row_* in
// ggml-quants.c); checkpoint/gguf_test.cc checks the dequantization bit for bit against
// the `gguf` Python package's. docs/gguf.md lists the types.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"

namespace conveyor {

// ggml_type ids. Ids ggml has retired (4, 5, 31-33, 36-38) and ids past the last known
// one are not listed: a file using them is refused.
enum class GgmlType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ4_1 = 3,
  kQ5_0 = 6,
  kQ5_1 = 7,
  kQ8_0 = 8,
  kQ8_1 = 9,
  kQ2_K = 10,
  kQ3_K = 11,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kQ8_K = 15,
  kIQ2_XXS = 16,
  kIQ2_XS = 17,
  kIQ3_XXS = 18,
  kIQ1_S = 19,
  kIQ4_NL = 20,
  kIQ3_S = 21,
  kIQ2_S = 22,
  kIQ4_XS = 23,
  kI8 = 24,
  kI16 = 25,
  kI32 = 26,
  kI64 = 27,
  kF64 = 28,
  kIQ1_M = 29,
  kBF16 = 30,
  kTQ1_0 = 34,
  kTQ2_0 = 35,
  kMXFP4 = 39,
};

struct GgmlTypeTraits {
  GgmlType type;
  const char* name;        // ggml's spelling: "Q4_K".
  int64_t block_elements;  // Elements per block (1 for the plain types).
  int64_t block_bytes;     // Bytes per block.
  bool supported;          // Whether Conveyor loads (and dequantizes) it.
};

// The traits of the type with ggml id `id`, or nullopt for an unknown or retired id.
std::optional<GgmlTypeTraits> GgmlTypeFromId(uint32_t id);
// The traits of a known type.
GgmlTypeTraits TraitsOf(GgmlType type);
// "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K": the supported types, for messages.
std::string SupportedGgmlTypes();

// Converts `count` elements of `type` at `src` (count / block_elements whole blocks) to
// float32 at `dst`, exactly as ggml's dequantize_row_* does. INVALID_ARGUMENT when
// `count` is not a whole number of blocks, UNIMPLEMENTED for a type Conveyor does not
// support. `src` and `dst` may be null when `count` is 0.
absl::Status DequantizeToF32(GgmlType type, const std::byte* src, int64_t count, float* dst);

}  // namespace conveyor
