// The AVX-512 VNNI quantized GEMM kernel (quant_gemm_simd.h): vpdpbusd on 256-bit
// vectors. Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw
// -mavx512vnni -ffp-contract=off; called only where CpuHasAvx512Vnni().
#include "kernels/cpu/quant_gemm_simd.h"

namespace conveyor::kernels::internal {

void QuantTileAvx512Vnni(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                         const uint8_t* w, size_t row_bytes, int outputs, const float* bias,
                         float* y, int ldy) {
  QuantTileSimd<true>(type, a, r0, rows, w, row_bytes, outputs, bias, y, ldy);
}

}  // namespace conveyor::kernels::internal
