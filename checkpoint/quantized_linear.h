// One linear layer of a GPTQ or AWQ safetensors checkpoint: its `<layer>.qweight`,
// `.qzeros`, `.scales` (and GPTQ's `.g_idx`) in place of `<layer>.weight`, checked when the
// checkpoint opens, and read either as float32 (the exact dequantization, scale·(q − zero)
// in float: an 11-bit scale times a small integer, so no rounding) or as the ggml blocks
// its groups map to: each run of 32 input weights of one output row lies in one group, so
// it is one block with that group's scale:
//   4-bit, every zero point 8 (symmetric GPTQ)   -> Q4_0: d = scale, the same q. Exact.
//   4-bit otherwise (asymmetric GPTQ, AWQ)       -> Q4_1: d = scale, m = fp16(−scale·zero).
//     m's rounding is the only inexact step: a block's 32 weights all move by the same
//     m − (−scale·zero), at most half an fp16 ulp of scale·zero (≤ 2^-11·scale·zero,
//     under 0.74% of the quantization step), and by nothing where scale·zero is an fp16
//     (zero 0, 1, 2, 4 or 8, among others).
//   8-bit, every zero point 128 (symmetric GPTQ) -> Q8_0: d = scale, q − 128. Exact.
//
// Layouts (AutoGPTQ's QuantLinear.pack, AutoAWQ's WQLinear_GEMM.from_linear):
//   GPTQ: qweight int32 [in / (32/bits), out], input i of output o in word
//     [i / (32/bits)][o] at bits (i % (32/bits))·bits; qzeros int32 [groups, out /
//     (32/bits)] packed the same way along outputs; scales fp16 [groups, out]; g_idx
//     int32 [in] (the group of each input: must be i / group_size). Checkpoint format
//     "gptq" (v1) stores each zero point minus one, "gptq_v2" as it is.
//   AWQ (GEMM): qweight int32 [in, out / 8], output o of input i in word [i][o / 8] at
//     nibble kAwqNibble[o % 8] (AWQ's interleaved order 0, 2, 4, 6, 1, 3, 5, 7: nibble k
//     holds output 8·(o / 8) + that[k]); qzeros int32 [groups, out / 8] the same way;
//     scales fp16 [groups, out]. Zero points as they are.
// FP8 (transformers' FineGrainedFP8Config, quant_method "fp8"): `<layer>.weight` as
// float8_e4m3fn [out, in] and `<layer>.weight_scale_inv` (F32, BF16 or F16) [ceil(out /
// block rows), ceil(in / block columns)], w = float(e4m3) · scale in float32 (one rounding,
// as transformers' dequantization). No ggml block holds e4m3 values, so these layers are
// only read as floats.
// docs/cpu-weights.md describes what maps and what is refused.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "checkpoint/ggml_types.h"
#include "checkpoint/model_config.h"
#include "checkpoint/safetensors.h"

namespace conveyor {

class QuantizedLinear {
 public:
  struct Tensors {
    RawTensorView qweight, qzeros, scales;
    std::optional<RawTensorView> g_idx;
  };

  // Checks `tensors` of layer `layer` (its name without ".weight", for messages; `path`
  // names the file) against `quantization`: dtypes (int32 qweight, qzeros and g_idx, fp16
  // scales) and shapes INVALID_ARGUMENT; a layout that does not map to a block
  // UNIMPLEMENTED naming the layer, the quant_method and what does not map (a g_idx that
  // is not the identity, 8-bit zero points other than 128, a v1 zero point stored as
  // 2^bits − 1, which AutoGPTQ's and GPTQModel's readers decode differently, a scale that
  // is not finite or whose m overflows fp16). The tensors' bytes must outlive the result.
  static absl::StatusOr<QuantizedLinear> Make(const WeightQuantization& quantization,
                                              const std::string& layer, const std::string& path,
                                              const Tensors& tensors);
  // An FP8 layer: `weight` e4m3 [out, in] and `scale` its weight_scale_inv, checked
  // (dtypes, shapes INVALID_ARGUMENT; a scale that is not finite, or a weight that is
  // e4m3's NaN, INVALID_ARGUMENT naming the layer).
  static absl::StatusOr<QuantizedLinear> MakeFp8(const WeightQuantization& quantization,
                                                 const std::string& layer, const std::string& path,
                                                 const RawTensorView& weight,
                                                 const RawTensorView& scale);

  int64_t rows() const { return out_; }  // Output features.
  int64_t cols() const { return in_; }   // Input features.
  // Whether its weights map to ggml blocks (GPTQ, AWQ) or are only read as floats (FP8).
  bool has_blocks() const { return !fp8_; }
  // The block its groups map to: kQ4_0, kQ4_1 or kQ8_0 (has_blocks() only).
  GgmlType block_type() const { return block_type_; }

  // Rows [row_begin, row_end) and columns [col_begin, col_end), dequantized, into `out`
  // densely ([rows, columns] row-major). The ranges must be within the matrix.
  void Dequantize(int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                  float* out) const;
  // The same rows and columns as block_type() blocks, each row's blocks from the one
  // holding col_begin, appended to `out`. The columns must be multiples of 32; has_blocks()
  // only.
  void AppendBlocks(int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                    std::vector<std::byte>* out) const;

 private:
  QuantizedLinear() = default;
  // The quantized values of rows [row_begin, row_end), every column: q[(r − row_begin) ·
  // in + i].
  void Unpack(int64_t row_begin, int64_t row_end, std::vector<uint8_t>* q) const;
  uint16_t ScaleBits(int64_t group, int64_t row) const;

  void DequantizeFp8(int64_t row_begin, int64_t row_end, int64_t col_begin, int64_t col_end,
                     float* out) const;

  bool fp8_ = false;
  int64_t fp8_block_rows_ = 0, fp8_block_cols_ = 0;
  const std::byte* fp8_weight_ = nullptr;  // e4m3 [out, in].
  std::vector<float> fp8_scales_;          // [ceil(out / rows), ceil(in / cols)].
  bool awq_ = false;
  int bits_ = 4;
  int64_t in_ = 0, out_ = 0, group_size_ = 0, groups_ = 0;
  GgmlType block_type_ = GgmlType::kQ4_1;
  const std::byte* qweight_ = nullptr;
  const std::byte* scales_ = nullptr;  // fp16 [groups, out].
  std::vector<uint8_t> zeros_;         // Decoded zero points [groups, out].
};

}  // namespace conveyor
