// The AVX2 quantized GEMM kernel (quant_gemm_simd.h). Compiled with
// -mavx2 -mfma -mf16c -ffp-contract=off; called only where the CPU reports AVX2 and FMA.
#include "kernels/cpu/quant_gemm_simd.h"

namespace conveyor::kernels::internal {

void QuantTileAvx2(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                   const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                   int ldy) {
  QuantTileSimd<false>(type, a, r0, rows, w, row_bytes, outputs, bias, y, ldy);
}

}  // namespace conveyor::kernels::internal
