// The AVX2 quantized GEMM kernel on ggml's blocks as they are. Compiled with -mavx2
// -mfma -mf16c -ffp-contract=off; called only where the CPU has AVX2 and no AVX-512 VNNI
// (which runs the panel kernel, quant_gemm_avx512_vnni.cc).
//
// A call computes 8 outputs (rows of W) for up to kQuantMaxRows rows of X. Per weight
// block, each output's block is unpacked once (4/5/6-bit values to bytes, scales to
// 16-bit vectors) and then used for every row. A row's integer dot product with an
// output's block is a vector of 8 int32 partial sums; the 8 outputs' vectors are reduced
// together (exact) into one vector of 8 sums, and the float32 combination of
// quant_gemm.h runs on the 8 outputs as lanes: for each output the same operations, in
// the same order, as the portable kernel's scalar chain.

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant_gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

// Σ u8·s8 over each 4 consecutive bytes, as 8 int32 lanes (exact: vpmaddubsw's 16-bit
// pair sums stay below 2·128·127 for the values the kernel passes).
__m256i DotU8S8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// [Σ v[0], Σ v[1], …, Σ v[7]] (each over its 8 int32 lanes).
__m256i Sum8(const __m256i* v) {
  const __m256i a01 = _mm256_hadd_epi32(v[0], v[1]);
  const __m256i a23 = _mm256_hadd_epi32(v[2], v[3]);
  const __m256i a45 = _mm256_hadd_epi32(v[4], v[5]);
  const __m256i a67 = _mm256_hadd_epi32(v[6], v[7]);
  const __m256i b0 = _mm256_hadd_epi32(a01, a23);
  const __m256i b1 = _mm256_hadd_epi32(a45, a67);
  return _mm256_add_epi32(_mm256_permute2x128_si256(b0, b1, 0x20),
                          _mm256_permute2x128_si256(b0, b1, 0x31));
}

uint16_t LoadHalfBits(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// Stands in for the blocks of outputs past `outputs` (their results are not stored).
alignas(64) constexpr uint8_t kZeroBlock[256] = {};

// One output's K-type super-block, unpacked for every row of the call.
struct alignas(32) KUnpacked {
  uint8_t q[256];    // Unsigned values, in weight order.
  __m256i scale[8];  // Per 32 weights: the 16-bit scales of their two 16s.
  __m256i mins;      // 16-bit "mins" per 16 weights (Q6_K: 32·scale).
};

void UnpackKBlock(QuantBlockType type, const uint8_t* b, KUnpacked* out, uint16_t* d,
                  uint16_t* dmin) {
  const __m256i m4 = _mm256_set1_epi8(0x0f);
  if (type == QuantBlockType::kQ6_K) {
    const __m256i m3 = _mm256_set1_epi8(3);
    for (int n = 0; n < 2; ++n) {
      const __m256i lo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n));
      const __m256i hi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 64 * n + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * n));
      auto top = [&](int shift) {
        return _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, shift), m3), 4);
      };
      __m256i* q = reinterpret_cast<__m256i*>(out->q + 128 * n);
      _mm256_store_si256(q + 0, _mm256_or_si256(_mm256_and_si256(lo, m4), top(0)));
      _mm256_store_si256(q + 1, _mm256_or_si256(_mm256_and_si256(hi, m4), top(2)));
      _mm256_store_si256(q + 2,
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lo, 4), m4), top(4)));
      _mm256_store_si256(q + 3,
                         _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(hi, 4), m4), top(6)));
    }
    const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
    for (int c = 0; c < 8; ++c) {
      out->scale[c] = _mm256_set_m128i(_mm_set1_epi16(sc[2 * c + 1]), _mm_set1_epi16(sc[2 * c]));
    }
    const __m256i sc16 =
        _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc)));
    out->mins = _mm256_slli_epi16(sc16, 5);
    *d = LoadHalfBits(b + 208);
    *dmin = 0;
    return;
  }
  const bool five = type == QuantBlockType::kQ5_K;
  const uint8_t* ql = five ? b + 48 : b + 16;
  const __m256i h =
      five ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16)) : _mm256_setzero_si256();
  const __m256i one = _mm256_set1_epi8(1);
  for (int g = 0; g < 4; ++g) {
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32 * g));
    __m256i lo = _mm256_and_si256(v, m4);
    __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
    if (five) {
      lo = _mm256_or_si256(
          lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g), one), 4));
      hi = _mm256_or_si256(
          hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2 * g + 1), one), 4));
    }
    _mm256_store_si256(reinterpret_cast<__m256i*>(out->q + 64 * g), lo);
    _mm256_store_si256(reinterpret_cast<__m256i*>(out->q + 64 * g + 32), hi);
  }
  alignas(32) int16_t mins[16];
  for (int j = 0; j < 8; ++j) {
    int sc = 0, mn = 0;
    UnpackScaleMinK4(j, b + 4, &sc, &mn);
    out->scale[j] = _mm256_set1_epi16(static_cast<int16_t>(sc));
    mins[2 * j] = mins[2 * j + 1] = static_cast<int16_t>(mn);
  }
  out->mins = _mm256_load_si256(reinterpret_cast<const __m256i*>(mins));
  *d = LoadHalfBits(b);
  *dmin = LoadHalfBits(b + 2);
}

void QuantTile(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
               const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
               int ldy) {
  const int k = a.k;
  const int block = QuantBlockElements(type);
  const int block_bytes = QuantBlockBytes(type);
  const int blocks = k / block;
  const int x_blocks = k / a.block;
  __m256 acc[kQuantMaxRows];
  for (int r = 0; r < rows; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* row[kQuantTileOutputs];
  size_t step[kQuantTileOutputs];  // Bytes from one block of the row to the next.
  for (int o = 0; o < kQuantTileOutputs; ++o) {
    row[o] = o < outputs ? w + o * row_bytes : kZeroBlock;
    step[o] = o < outputs ? block_bytes : 0;
  }
  alignas(16) uint16_t d_bits[kQuantTileOutputs], dmin_bits[kQuantTileOutputs];
  __m256i dots[kQuantTileOutputs], mins[kQuantTileOutputs];

  if (block == 32) {
    const bool q8 = type == QuantBlockType::kQ8_0;
    const bool q41 = type == QuantBlockType::kQ4_1;
    const __m256i m4 = _mm256_set1_epi8(0x0f);
    __m256i wq[kQuantTileOutputs], wabs[kQuantTileOutputs];
    for (int b = 0; b < blocks; ++b) {
      for (int o = 0; o < kQuantTileOutputs; ++o) {
        const uint8_t* blk = row[o] + b * step[o];
        d_bits[o] = LoadHalfBits(blk);
        if (q8) {
          wq[o] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 2));
          wabs[o] = _mm256_abs_epi8(wq[o]);
        } else {
          if (q41) dmin_bits[o] = LoadHalfBits(blk + 2);  // Q4_1's m.
          const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + (q41 ? 4 : 2)));
          wabs[o] = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(v, 4), v),
                                     m4);  // Weights 0-15, 16-31.
        }
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d_bits)));
      const __m256 mw =
          q41 ? _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dmin_bits)))
              : _mm256_setzero_ps();
      for (int r = 0; r < rows; ++r) {
        const size_t xr = static_cast<size_t>(r0) + r;
        const __m256i xv =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.q + xr * k + 32 * b));
        for (int o = 0; o < kQuantTileOutputs; ++o) {
          dots[o] = q8 ? DotU8S8(wabs[o], _mm256_sign_epi8(xv, wq[o])) : DotU8S8(wabs[o], xv);
        }
        __m256i sum = Sum8(dots);
        const int16_t* bs = a.bsum16 + xr * (k / 16) + 2 * b;
        if (!q8 && !q41) sum = _mm256_sub_epi32(sum, _mm256_set1_epi32(8 * (bs[0] + bs[1])));
        const __m256 dx = _mm256_set1_ps(a.d[xr * x_blocks + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, dx), acc[r]);
        if (q41) {
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(bs[0] + bs[1])),
                                   _mm256_mul_ps(mw, dx), acc[r]);
        }
      }
    }
  } else {
    alignas(32) KUnpacked unpacked[kQuantTileOutputs];
    const bool q6 = type == QuantBlockType::kQ6_K;
    const __m256 sign = _mm256_set1_ps(-0.0f);
    for (int b = 0; b < blocks; ++b) {
      for (int o = 0; o < kQuantTileOutputs; ++o) {
        UnpackKBlock(type, row[o] + b * step[o], &unpacked[o], &d_bits[o], &dmin_bits[o]);
      }
      const __m256 dw = _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(d_bits)));
      const __m256 dminw =
          _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dmin_bits)));
      for (int r = 0; r < rows; ++r) {
        const size_t xr = static_cast<size_t>(r0) + r;
        const int8_t* xb = a.q + xr * k + 256 * b;
        __m256i xv[8];
        for (int c = 0; c < 8; ++c) {
          xv[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xb + 32 * c));
        }
        const __m256i bsum =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.bsum16 + xr * (k / 16) + 16 * b));
        for (int o = 0; o < kQuantTileOutputs; ++o) {
          const KUnpacked& u = unpacked[o];
          __m256i v = _mm256_setzero_si256();
          for (int c = 0; c < 8; ++c) {
            const __m256i p = _mm256_maddubs_epi16(
                _mm256_load_si256(reinterpret_cast<const __m256i*>(u.q + 32 * c)), xv[c]);
            v = _mm256_add_epi32(v, _mm256_madd_epi16(p, u.scale[c]));
          }
          dots[o] = v;
          mins[o] = _mm256_madd_epi16(u.mins, bsum);
        }
        const __m256i sum = Sum8(dots);
        const __m256i msum = Sum8(mins);
        const __m256 dx = _mm256_set1_ps(a.d[xr * x_blocks + b]);
        if (q6) {
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_sub_epi32(sum, msum)),
                                   _mm256_mul_ps(dw, dx), acc[r]);
        } else {
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, dx), acc[r]);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum),
                                   _mm256_xor_ps(_mm256_mul_ps(dminw, dx), sign), acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < rows; ++r) {
    alignas(32) float out[kQuantTileOutputs];
    _mm256_store_ps(out, acc[r]);
    float* yr = y + static_cast<size_t>(r) * ldy;
    for (int o = 0; o < outputs; ++o) yr[o] = bias != nullptr ? out[o] + bias[o] : out[o];
  }
}

}  // namespace

void QuantTileAvx2(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                   const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                   int ldy) {
  QuantTile(type, a, r0, rows, w, row_bytes, outputs, bias, y, ldy);
}

}  // namespace conveyor::kernels::internal
