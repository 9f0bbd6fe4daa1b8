// The AVX-512 VNNI quantized GEMM kernel on 16-row panels (quant_gemm_kernels.h has the
// layout). Compiled with -mavx2 -mfma -mf16c -mavx512f -mavx512vl -mavx512bw
// -mavx512vnni -ffp-contract=off; called only where CpuHasAvx512Vnni().
//
// The 16 lanes of a vector are 16 outputs (rows of W). One 64-byte load holds 4 or 8
// consecutive weights of each; vpdpbusd against 4 activation bytes broadcast adds their
// products into each lane, so a sub-block's integer dot products come out as one vector
// with no horizontal sum. The integer scales multiply lanes (vpmulld), the mins meet the
// activation sums in vpdpwssd, and the float32 combination of quant_gemm.h then runs on
// the 16 outputs as lanes, in the portable kernel's order: the same bits.
//
// Up to 4 rows of X share each weight load (more would run out of registers); a call
// walks its rows 4 at a time, and each row's arithmetic is the same whatever its group.
#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant_gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

// 4 activation bytes, broadcast to every lane.
inline __m512i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm512_set1_epi32(v);
}

// −v (the sign bit flipped: AVX-512F has no float xor).
inline __m512 Negated(__m512 v, __m512i sign) {
  return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), sign));
}

// Loads the 64 bytes at p and asks for the line 2 KiB on: decode streams the weights from
// DRAM, and the hardware prefetchers alone keep too few lines in flight (a 1.8 GB Q4_K_M
// model: 63 against 75 ms per step at batch 1; 1 or 2 KiB ahead did best, 4 and 8 no
// better). A prefetch past the end of the weights is harmless (prefetches never fault).
inline __m512i Load64Ahead(const uint8_t* p) {
  _mm_prefetch(reinterpret_cast<const char*>(p + 2048), _MM_HINT_T0);
  return _mm512_loadu_si512(p);
}

inline __m512 Halves(const uint8_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// Q8_0, Q4_0, Q4_1: per 32 weights, acc = fma(float(Σ q_w·q_x [− 8·Σ q_x]), d_w·d_x, acc)
// [Q4_1: then acc = fma(float(Σ q_x), m_w·d_x, acc)].
template <int R>
void Blocks32(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel,
              __m512 (&acc)[R]) {
  const int k = a.k;
  const int blocks = k / 32;
  const bool q8 = type == QuantBlockType::kQ8_0;
  const int q_bytes = PanelQBytes(type);
  const uint8_t* meta = panel + static_cast<size_t>(blocks) * q_bytes;
  // vpdpbusd multiplies unsigned by signed bytes: Q8_0's int8 weights are read as
  // q + 128 (the sign bit flipped), Q4_0's nibbles are unsigned already; the offset
  // (128 or 8 times the activations' sum) comes off the exact integer sum.
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const bool q41 = type == QuantBlockType::kQ4_1;
  const int meta_bytes = PanelMetaBytes(type);
  const int offset = q8 ? 128 : q41 ? 0 : 8;
  const int8_t* x[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) x[r] = a.q + static_cast<size_t>(r0 + r) * k;
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* q = panel + static_cast<size_t>(b) * q_bytes;
    // Two accumulators per row halve the vpdpbusd dependency chain (integers: exact).
    __m512i dot[R], dot2[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) dot[r] = dot2[r] = _mm512_setzero_si512();
    if (q8) {
#pragma GCC unroll 8
      for (int c = 0; c < 8; c += 2) {
        const __m512i w = _mm512_xor_si512(Load64Ahead(q + 64 * c), flip);
        const __m512i w2 = _mm512_xor_si512(Load64Ahead(q + 64 * c + 64), flip);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dot[r] = _mm512_dpbusd_epi32(dot[r], w, Broadcast4(x[r] + 32 * b + 4 * c));
          dot2[r] = _mm512_dpbusd_epi32(dot2[r], w2, Broadcast4(x[r] + 32 * b + 4 * c + 4));
        }
      }
    } else {
#pragma GCC unroll 8
      for (int c = 0; c < 4; ++c) {
        const __m512i v = Load64Ahead(q + 64 * c);
        const __m512i lo = _mm512_and_si512(v, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          dot[r] = _mm512_dpbusd_epi32(dot[r], lo, Broadcast4(x[r] + 32 * b + 8 * c));
          dot2[r] = _mm512_dpbusd_epi32(dot2[r], hi, Broadcast4(x[r] + 32 * b + 8 * c + 4));
        }
      }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) dot[r] = _mm512_add_epi32(dot[r], dot2[r]);
    const uint8_t* mb = meta + static_cast<size_t>(b) * meta_bytes;
    const __m512 dw = Halves(mb);
    const __m512 mw = q41 ? Halves(mb + 32) : _mm512_setzero_ps();  // Q4_1's m.
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const size_t at = static_cast<size_t>(r0 + r) * blocks + b;
      const __m512i sum = _mm512_sub_epi32(dot[r], _mm512_set1_epi32(offset * a.bsum32[at]));
      const __m512 dx = _mm512_set1_ps(a.d[at]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(dw, dx), acc[r]);
      if (q41) {
        acc[r] = _mm512_fmadd_ps(_mm512_set1_ps(static_cast<float>(a.bsum32[at])),
                                 _mm512_mul_ps(mw, dx), acc[r]);
      }
    }
  }
}

// Q4_K and Q5_K: per 256 weights, with j over the 8 sub-blocks of 32,
//   acc = fma(float(Σ_j sc_j·Σ q_w·q_x), d·d_x, acc); acc = fma(float(Σ_j m_j·Σ q_x), −(dmin·d_x),
//   acc).
// Q6_K: per 256 weights, i over the 16 sixteens, acc = fma(float(Σ_i sc_i·(Σ q_w·q_x −
// 32·Σ q_x)), d·d_x, acc). (The portable kernel's sums, regrouped: integers, exact.)
template <int R>
void BlocksK(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel,
             __m512 (&acc)[R]) {
  const int k = a.k;
  const int blocks = k / 256;
  const int q_bytes = PanelQBytes(type);
  const int meta_bytes = PanelMetaBytes(type);
  const uint8_t* meta = panel + static_cast<size_t>(blocks) * q_bytes;
  const __m512i low4 = _mm512_set1_epi8(0x0f);
  const __m512i sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  const int8_t* x[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) x[r] = a.q + static_cast<size_t>(r0 + r) * k;
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* q = panel + static_cast<size_t>(b) * q_bytes;
    const uint8_t* m = meta + static_cast<size_t>(b) * meta_bytes;
    __m512i isum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    if (type == QuantBlockType::kQ6_K) {
      for (int i = 0; i < 16; ++i) {
        __m512i t[R];
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r) {
          const int16_t bsum = a.bsum16[static_cast<size_t>(r0 + r) * (k / 16) + 16 * b + i];
          t[r] = _mm512_set1_epi32(-32 * bsum);
        }
#pragma GCC unroll 8
        for (int c = 0; c < 4; ++c) {
          const __m512i w = Load64Ahead(q + 64 * (4 * i + c));
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            t[r] = _mm512_dpbusd_epi32(t[r], w, Broadcast4(x[r] + 256 * b + 16 * i + 4 * c));
          }
        }
        const __m512i sc =
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 16 * i)));
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(t[r], sc));
      }
      const __m512 dw = Halves(m + 256);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const __m512 dx = _mm512_set1_ps(a.d[static_cast<size_t>(r0 + r) * blocks + b]);
        acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dw, dx), acc[r]);
      }
      continue;
    }
    const bool four = type == QuantBlockType::kQ4_K;
    for (int j = 0; j < 8; ++j) {
      __m512i t[R], t2[R];
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) t[r] = t2[r] = _mm512_setzero_si512();
      if (four) {
#pragma GCC unroll 8
        for (int c = 0; c < 4; ++c) {
          const __m512i v = Load64Ahead(q + 64 * (4 * j + c));
          const __m512i lo = _mm512_and_si512(v, low4);
          const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xs = x[r] + 256 * b + 32 * j + 8 * c;
            t[r] = _mm512_dpbusd_epi32(t[r], lo, Broadcast4(xs));
            t2[r] = _mm512_dpbusd_epi32(t2[r], hi, Broadcast4(xs + 4));
          }
        }
      } else {
#pragma GCC unroll 8
        for (int c = 0; c < 8; c += 2) {
          const __m512i w = Load64Ahead(q + 64 * (8 * j + c));
          const __m512i w2 = Load64Ahead(q + 64 * (8 * j + c) + 64);
#pragma GCC unroll 8
          for (int r = 0; r < R; ++r) {
            const int8_t* xs = x[r] + 256 * b + 32 * j + 4 * c;
            t[r] = _mm512_dpbusd_epi32(t[r], w, Broadcast4(xs));
            t2[r] = _mm512_dpbusd_epi32(t2[r], w2, Broadcast4(xs + 4));
          }
        }
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) t[r] = _mm512_add_epi32(t[r], t2[r]);
      const __m512i sc =
          _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 16 * j)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(t[r], sc));
    }
    __m512i msum[R];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) msum[r] = _mm512_setzero_si512();
    for (int p = 0; p < 4; ++p) {
      const __m512i mins = _mm512_cvtepu8_epi16(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(m + 128 + 32 * p)));
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const int16_t* s = a.bsum32 + static_cast<size_t>(r0 + r) * (k / 32) + 8 * b + 2 * p;
        const uint32_t pair =
            static_cast<uint16_t>(s[0]) | static_cast<uint32_t>(static_cast<uint16_t>(s[1])) << 16;
        msum[r] = _mm512_dpwssd_epi32(msum[r], mins, _mm512_set1_epi32(static_cast<int>(pair)));
      }
    }
    const __m512 dw = Halves(m + 256);
    const __m512 dminw = Halves(m + 288);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(a.d[static_cast<size_t>(r0 + r) * blocks + b]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dw, dx), acc[r]);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(msum[r]), Negated(_mm512_mul_ps(dminw, dx), sign),
                               acc[r]);
    }
  }
}

template <int R>
void Rows(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel,
          int outputs, const float* bias, float* y, int ldy) {
  __m512 acc[R];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  if (QuantBlockElements(type) == 32) {
    Blocks32<R>(type, a, r0, panel, acc);
  } else {
    BlocksK<R>(type, a, r0, panel, acc);
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << outputs) - 1);
  const __m512 b = bias != nullptr ? _mm512_maskz_loadu_ps(mask, bias) : _mm512_setzero_ps();
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const __m512 out = bias != nullptr ? _mm512_add_ps(acc[r], b) : acc[r];
    _mm512_mask_storeu_ps(y + static_cast<size_t>(r) * ldy, mask, out);
  }
}

}  // namespace

void QuantizeActivationsAvx512(const float* x, int ldx, int m, int k, int block, int8_t* q,
                               float* d, int16_t* bsum16, int16_t* bsum32) {
  const int blocks = k / block;
  const __m512 lowest = _mm512_set1_ps(-127.0f), highest = _mm512_set1_ps(127.0f);
  for (int r = 0; r < m; ++r) {
    const float* row = x + static_cast<size_t>(r) * ldx;
    int8_t* qr = q + static_cast<size_t>(r) * k;
    int16_t* s16 = bsum16 + static_cast<size_t>(r) * (k / 16);
    for (int b = 0; b < blocks; ++b) {
      const float* xb = row + b * block;
      __m512 most = _mm512_setzero_ps();
      for (int i = 0; i < block; i += 16) {
        most = _mm512_max_ps(most, _mm512_abs_ps(_mm512_loadu_ps(xb + i)));
      }
      // The portable code's operations, lane by lane: max (exact in any order), one
      // division, x · inverse, round to nearest even, clamp.
      const float scale = _mm512_reduce_max_ps(most) / 127.0f;
      const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
      d[static_cast<size_t>(r) * blocks + b] = scale;
      const __m512 inv = _mm512_set1_ps(inverse);
      for (int i = 0; i < block; i += 16) {
        const __m512 v = _mm512_roundscale_ps(_mm512_mul_ps(_mm512_loadu_ps(xb + i), inv),
                                              _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        const __m512i iv = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(v, lowest), highest));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + b * block + i), _mm512_cvtepi32_epi8(iv));
        s16[(b * block + i) / 16] = static_cast<int16_t>(_mm512_reduce_add_epi32(iv));
      }
    }
    for (int g = 0; g < k / 32; ++g) {
      bsum32[static_cast<size_t>(r) * (k / 32) + g] =
          static_cast<int16_t>(s16[2 * g] + s16[2 * g + 1]);
    }
  }
}

void QuantPanelAvx512Vnni(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                          const uint8_t* panel, int outputs, const float* bias, float* y, int ldy) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) {
    Rows<4>(type, a, r0 + r, panel, outputs, bias, y + static_cast<size_t>(r) * ldy, ldy);
  }
  float* yr = y + static_cast<size_t>(r) * ldy;
  switch (rows - r) {
    case 3:
      Rows<3>(type, a, r0 + r, panel, outputs, bias, yr, ldy);
      break;
    case 2:
      Rows<2>(type, a, r0 + r, panel, outputs, bias, yr, ldy);
      break;
    case 1:
      Rows<1>(type, a, r0 + r, panel, outputs, bias, yr, ldy);
      break;
    default:
      break;
  }
}

}  // namespace conveyor::kernels::internal
