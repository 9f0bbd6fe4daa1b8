// The AVX2 quantized GEMM kernel on the 16-row panels of the AVX-512 VNNI level
// (quant_gemm_kernels.h has the layout). Compiled with -mavx2 -mfma -mf16c
// -ffp-contract=off; called only where the CPU has AVX2.
//
// A 64-byte chunk of a panel is two 256-bit halves: rows 0-7 and rows 8-15, 4 consecutive
// weights of each row per 32-bit lane. A call runs one half at a time, so the 8 lanes of
// a vector are 8 outputs: vpmaddubsw against 4 activation bytes broadcast makes each
// lane's pair sums, vpmaddwd adds them into the lane, and the float32 combination of
// quant_gemm.h runs on the 8 outputs as lanes, in the portable kernel's order: the same
// bits. vpmaddubsw saturates its 16-bit pair sums, so every value it sees keeps them
// below 2^15: 4-bit weights (2·15·127) summed over up to 8 chunks in 16 bits, Q5_K's
// 5-bit (2·31·127) over 4, Q6_K's 6-bit over 2, and Q8_0 as |q| against the activations
// with q's sign (2·128·127), one chunk at a time.
//
// Up to 4 rows of X share each weight load; the second half reads the panel again, by
// then in L1 or L2 (a panel of k = 11008 Q4_K weights is 100 KiB).
#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/quant_gemm_kernels.h"

namespace conveyor::kernels::internal {
namespace {

inline __m256i Broadcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, sizeof(v));
  return _mm256_set1_epi32(v);
}

// The 32 bytes of half h of the chunk at p; the first half asks for the line 2 KiB on
// (as the VNNI kernel does: decode streams the weights from DRAM).
inline __m256i LoadHalf(const uint8_t* p, int h) {
  if (h == 0) _mm_prefetch(reinterpret_cast<const char*>(p + 2048), _MM_HINT_T0);
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * h));
}

// 8 halves (fp16) as floats: entries 8h..8h+7 of a 16-entry meta field at p.
inline __m256 Halves(const uint8_t* p, int h) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * h)));
}

// Adds each lane's 16-bit pair sums into its 32-bit lane.
inline __m256i Widen(__m256i pairs16) { return _mm256_madd_epi16(pairs16, _mm256_set1_epi16(1)); }

// Q8_0, Q4_0, Q4_1: per 32 weights, acc = fma(float(Σ q_w·q_x [− 8·Σ q_x]), d_w·d_x, acc)
// [Q4_1: then acc = fma(float(Σ q_x), m_w·d_x, acc)].
template <int R>
void Blocks32(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel,
              int h, __m256 (&acc)[R]) {
  const int k = a.k;
  const int blocks = k / 32;
  const bool q8 = type == QuantBlockType::kQ8_0;
  const bool q41 = type == QuantBlockType::kQ4_1;
  const int q_bytes = PanelQBytes(type);
  const int meta_bytes = PanelMetaBytes(type);
  const uint8_t* meta = panel + static_cast<size_t>(blocks) * q_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const int8_t* x[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) x[r] = a.q + static_cast<size_t>(r0 + r) * k;
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* q = panel + static_cast<size_t>(b) * q_bytes;
    __m256i dot[R];
    if (q8) {
      // The panel holds q as int8.
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) dot[r] = _mm256_setzero_si256();
#pragma GCC unroll 8
      for (int c = 0; c < 8; ++c) {
        const __m256i w = LoadHalf(q + 64 * c, h);
        const __m256i magnitude = _mm256_abs_epi8(w);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const __m256i xs = _mm256_sign_epi8(Broadcast4(x[r] + 32 * b + 4 * c), w);
          dot[r] = _mm256_add_epi32(dot[r], Widen(_mm256_maddubs_epi16(magnitude, xs)));
        }
      }
    } else {
      __m256i pairs[R];
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
      for (int c = 0; c < 4; ++c) {
        const __m256i v = LoadHalf(q + 64 * c, h);
        const __m256i lo = _mm256_and_si256(v, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int8_t* xs = x[r] + 32 * b + 8 * c;
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(lo, Broadcast4(xs)));
          pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(hi, Broadcast4(xs + 4)));
        }
      }
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) dot[r] = Widen(pairs[r]);
    }
    const uint8_t* mb = meta + static_cast<size_t>(b) * meta_bytes;
    const __m256 dw = Halves(mb, h);
    const int offset = type == QuantBlockType::kQ4_0 ? 8 : 0;
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const size_t at = static_cast<size_t>(r0 + r) * blocks + b;
      const __m256i sum = _mm256_sub_epi32(dot[r], _mm256_set1_epi32(offset * a.bsum32[at]));
      const __m256 dx = _mm256_set1_ps(a.d[at]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(sum), _mm256_mul_ps(dw, dx), acc[r]);
      if (q41) {
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(static_cast<float>(a.bsum32[at])),
                                 _mm256_mul_ps(Halves(mb + 32, h), dx), acc[r]);
      }
    }
  }
}

// 8 bytes of a per-row meta field (entries 8h..8h+7 of 16) as 32-bit lanes.
inline __m256i ScalesU8(const uint8_t* p, int h) {
  return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
}
inline __m256i ScalesI8(const uint8_t* p, int h) {
  return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8 * h)));
}

// Q4_K, Q5_K and Q6_K: quant_gemm_avx512_vnni.cc's BlocksK, on 8 lanes.
template <int R>
void BlocksK(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel,
             int h, __m256 (&acc)[R]) {
  const int k = a.k;
  const int blocks = k / 256;
  const int q_bytes = PanelQBytes(type);
  const int meta_bytes = PanelMetaBytes(type);
  const uint8_t* meta = panel + static_cast<size_t>(blocks) * q_bytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256 negate = _mm256_set1_ps(-0.0f);
  const int8_t* x[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) x[r] = a.q + static_cast<size_t>(r0 + r) * k;
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* q = panel + static_cast<size_t>(b) * q_bytes;
    const uint8_t* m = meta + static_cast<size_t>(b) * meta_bytes;
    __m256i isum[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) isum[r] = _mm256_setzero_si256();
    if (type == QuantBlockType::kQ6_K) {
      for (int i = 0; i < 16; ++i) {
        __m256i t[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) {
          const int16_t bsum = a.bsum16[static_cast<size_t>(r0 + r) * (k / 16) + 16 * b + i];
          t[r] = _mm256_set1_epi32(-32 * bsum);
        }
#pragma GCC unroll 2
        for (int c = 0; c < 4; c += 2) {
          const __m256i w = LoadHalf(q + 64 * (4 * i + c), h);
          const __m256i w2 = LoadHalf(q + 64 * (4 * i + c + 1), h);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int8_t* xs = x[r] + 256 * b + 16 * i + 4 * c;
            const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(w, Broadcast4(xs)),
                                                   _mm256_maddubs_epi16(w2, Broadcast4(xs + 4)));
            t[r] = _mm256_add_epi32(t[r], Widen(pairs));
          }
        }
        const __m256i sc = ScalesI8(m + 16 * i, h);
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r)
          isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(t[r], sc));
      }
      const __m256 dw = Halves(m + 256, h);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const __m256 dx = _mm256_set1_ps(a.d[static_cast<size_t>(r0 + r) * blocks + b]);
        acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, dx), acc[r]);
      }
      continue;
    }
    const bool four = type == QuantBlockType::kQ4_K;
    for (int j = 0; j < 8; ++j) {
      __m256i t[R];
      if (four) {
        __m256i pairs[R];
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int c = 0; c < 4; ++c) {
          const __m256i v = LoadHalf(q + 64 * (4 * j + c), h);
          const __m256i lo = _mm256_and_si256(v, low4);
          const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) {
            const int8_t* xs = x[r] + 256 * b + 32 * j + 8 * c;
            pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(lo, Broadcast4(xs)));
            pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(hi, Broadcast4(xs + 4)));
          }
        }
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) t[r] = Widen(pairs[r]);
      } else {
#pragma GCC unroll 4
        for (int r = 0; r < R; ++r) t[r] = _mm256_setzero_si256();
          // Q5_K as bytes (< 32): 4 chunks' pair sums fit 16 bits.
#pragma GCC unroll 2
        for (int c = 0; c < 8; c += 4) {
          __m256i pairs[R];
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) pairs[r] = _mm256_setzero_si256();
#pragma GCC unroll 4
          for (int e = 0; e < 4; ++e) {
            const __m256i w = LoadHalf(q + 64 * (8 * j + c + e), h);
#pragma GCC unroll 4
            for (int r = 0; r < R; ++r) {
              const int8_t* xs = x[r] + 256 * b + 32 * j + 4 * (c + e);
              pairs[r] = _mm256_add_epi16(pairs[r], _mm256_maddubs_epi16(w, Broadcast4(xs)));
            }
          }
#pragma GCC unroll 4
          for (int r = 0; r < R; ++r) t[r] = _mm256_add_epi32(t[r], Widen(pairs[r]));
        }
      }
      const __m256i sc = ScalesU8(m + 16 * j, h);
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) isum[r] = _mm256_add_epi32(isum[r], _mm256_mullo_epi32(t[r], sc));
    }
    // The mins: pair p's 16-bit (min of sub-block 2p, min of 2p + 1) per row against the
    // row's two activation sums, vpmaddwd adding the two products (exact).
    __m256i msum[R];
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) msum[r] = _mm256_setzero_si256();
    for (int p = 0; p < 4; ++p) {
      const __m256i mins = _mm256_cvtepu8_epi16(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + 128 + 32 * p + 16 * h)));
#pragma GCC unroll 4
      for (int r = 0; r < R; ++r) {
        const int16_t* s = a.bsum32 + static_cast<size_t>(r0 + r) * (k / 32) + 8 * b + 2 * p;
        const uint32_t pair =
            static_cast<uint16_t>(s[0]) | static_cast<uint32_t>(static_cast<uint16_t>(s[1])) << 16;
        msum[r] = _mm256_add_epi32(
            msum[r], _mm256_madd_epi16(mins, _mm256_set1_epi32(static_cast<int>(pair))));
      }
    }
    const __m256 dw = Halves(m + 256, h);
    const __m256 dminw = Halves(m + 288, h);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      const __m256 dx = _mm256_set1_ps(a.d[static_cast<size_t>(r0 + r) * blocks + b]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[r]), _mm256_mul_ps(dw, dx), acc[r]);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(msum[r]),
                               _mm256_xor_ps(_mm256_mul_ps(dminw, dx), negate), acc[r]);
    }
  }
}

// Outputs [8h, 8h + n) of rows [r0, r0 + R) (n <= 8).
template <int R>
void Rows(QuantBlockType type, const QuantizedActivations& a, int r0, const uint8_t* panel, int h,
          int n, const float* bias, float* y, int ldy) {
  __m256 acc[R];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  if (QuantBlockElements(type) == 32) {
    Blocks32<R>(type, a, r0, panel, h, acc);
  } else {
    BlocksK<R>(type, a, r0, panel, h, acc);
  }
  alignas(32) float out[8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out, acc[r]);
    float* yr = y + static_cast<size_t>(r) * ldy + 8 * h;
    for (int o = 0; o < n; ++o) yr[o] = bias != nullptr ? out[o] + bias[8 * h + o] : out[o];
  }
}

}  // namespace

void QuantPanelAvx2(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                    const uint8_t* panel, int outputs, const float* bias, float* y, int ldy) {
  for (int h = 0; 8 * h < outputs; ++h) {
    const int n = outputs - 8 * h < 8 ? outputs - 8 * h : 8;
    int r = 0;
    for (; r + 4 <= rows; r += 4) {
      Rows<4>(type, a, r0 + r, panel, h, n, bias, y + static_cast<size_t>(r) * ldy, ldy);
    }
    float* yr = y + static_cast<size_t>(r) * ldy;
    switch (rows - r) {
      case 3:
        Rows<3>(type, a, r0 + r, panel, h, n, bias, yr, ldy);
        break;
      case 2:
        Rows<2>(type, a, r0 + r, panel, h, n, bias, yr, ldy);
        break;
      case 1:
        Rows<1>(type, a, r0 + r, panel, h, n, bias, yr, ldy);
        break;
      default:
        break;
    }
  }
}

}  // namespace conveyor::kernels::internal
