// What a GGUF file says about its model, in Conveyor's terms: the ModelConfig from the
// metadata llama.cpp's convert_hf_to_gguf.py writes (`<arch>.block_count`, ...), and the
// Hugging Face name of each GGUF tensor, including the row permutation llama.cpp applies
// to the Q and K projections of the "llama" architecture, which must be undone.
// docs/gguf.md describes both.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "checkpoint/gguf.h"
#include "checkpoint/model_config.h"

namespace conveyor {

// The `general.architecture` values ModelConfigFromGguf accepts, for messages.
std::string SupportedGgufArchitectures();

// The type most of `file`'s layer matrices (blk.*) are stored in, as a config's
// torch_dtype: "float32", "float16" or "bfloat16", else ggml's name ("Q4_K", "Q8_0", ...);
// empty if it has none.
std::string WeightDtypeOfGguf(const GgufFile& file);

// The model's config from `file`'s metadata (and, where the metadata is silent, its
// tensors: tied embeddings, biases, per-head norms, which layers are sparse, and the
// weights' dtype as torch_dtype: WeightDtypeOfGguf).
// INVALID_ARGUMENT naming the file and key for an unknown architecture (listing the
// supported ones), a missing or ill-typed key, or a value out of range.
absl::StatusOr<ModelConfig> ModelConfigFromGguf(const GgufFile& file);

// Where a GGUF tensor's data goes in the Hugging Face checkpoint layout.
struct HfTensorName {
  // The HF name ("model.layers.3.self_attn.q_proj.weight"). For a GGUF tensor holding
  // all of a layer's experts (blk.N.ffn_gate_exps.weight, [experts, rows, cols]), the
  // name of expert 0's weight with "{expert}" in place of the index
  // ("model.layers.N.mlp.experts.{expert}.gate_proj.weight"); slice k of the outermost
  // dimension is expert k.
  std::string name;
  bool experts_merged = false;
  // The rows of this tensor were permuted by convert_hf_to_gguf (llama architecture Q and
  // K projections); UnpermuteRowIndex gives each GGUF row's HF row. 0 when not.
  int rope_permuted_heads = 0;
};

// The HF name of the GGUF tensor `gguf_name` in a model of `config`; nullopt for a name
// Conveyor has no use for (rope_freqs.weight, or anything unknown).
std::optional<HfTensorName> HfNameOfGgufTensor(std::string_view gguf_name,
                                               const ModelConfig& config);

// convert_hf_to_gguf's LlamaModel.permute reorders the rows of q_proj (and k_proj, with
// the KV head count) so that within each head of `head_rows` rows the two rotated halves
// interleave: GGUF row h*D + 2i + j holds HF row h*D + j*(D/2) + i (i < D/2, j in {0,1},
// D = head_rows). This returns the HF row that GGUF row `gguf_row` holds.
int64_t HfRowOfPermutedRow(int64_t gguf_row, int64_t head_rows);

}  // namespace conveyor
