// GemmQuantized's driver (activation quantization, tiling, threads, the kernel choice)
// and the portable kernel, which spells out the arithmetic the vector kernels reproduce.
// Compiled for any x86-64, without FP contraction.
#include "kernels/cpu/quant_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu_isa.h"
#include "kernels/cpu/quant_gemm_kernels.h"
#include "kernels/cpu/thread_pool.h"

namespace conveyor::kernels {
namespace internal {

float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const int exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ffu;
  uint32_t bits = 0;
  if (exponent == 0x1f) {
    bits = sign | 0x7f800000u | (mantissa << 13);
  } else if (exponent != 0) {
    bits = sign | static_cast<uint32_t>(exponent + 112) << 23 | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {  // A subnormal half is a normal float.
    int e = 113;
    while ((mantissa & 0x400u) == 0) {
      mantissa <<= 1;
      --e;
    }
    bits = sign | static_cast<uint32_t>(e) << 23 | ((mantissa & 0x3ffu) << 13);
  }
  float f = 0;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

void QuantizeActivations(const float* x, int ldx, int m, int k, int block, int8_t* q, float* d,
                         int16_t* bsum16, int16_t* bsum32) {
  const int blocks = k / block;
  for (int r = 0; r < m; ++r) {
    const float* row = x + static_cast<size_t>(r) * ldx;
    int8_t* qr = q + static_cast<size_t>(r) * k;
    for (int b = 0; b < blocks; ++b) {
      float most = 0.0f;
      for (int i = b * block; i < (b + 1) * block; ++i) most = std::max(most, std::fabs(row[i]));
      const float scale = most / 127.0f;
      const float inverse = scale != 0.0f ? 1.0f / scale : 0.0f;
      d[static_cast<size_t>(r) * blocks + b] = scale;
      for (int i = b * block; i < (b + 1) * block; ++i) {
        qr[i] = static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inverse), -127.0f, 127.0f));
      }
    }
    for (int g = 0; g < k / 16; ++g) {
      int sum = 0;
      for (int i = 0; i < 16; ++i) sum += qr[g * 16 + i];
      bsum16[static_cast<size_t>(r) * (k / 16) + g] = static_cast<int16_t>(sum);
    }
    for (int g = 0; g < k / 32; ++g) {
      const int16_t* pair = bsum16 + static_cast<size_t>(r) * (k / 16) + 2 * g;
      bsum32[static_cast<size_t>(r) * (k / 32) + g] = static_cast<int16_t>(pair[0] + pair[1]);
    }
  }
}

namespace {

uint16_t LoadU16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// One K-type super-block unpacked: unsigned q per weight, an integer scale and "min" per
// 16 weights (Q4_K/Q5_K: the 6-bit scale and min of the 32 they belong to; Q6_K: the int8
// scale and 32·scale), and the block's float d and dmin.
struct KBlock {
  uint8_t q[256];
  int sc[16];
  int mn[16];
  float d;
  float dmin;
};

void UnpackK(QuantBlockType type, const uint8_t* b, KBlock* out) {
  if (type == QuantBlockType::kQ6_K) {
    const uint8_t* ql = b;
    const uint8_t* qh = b + 128;
    out->d = HalfBitsToFloat(LoadU16(b + 208));
    out->dmin = 0.0f;
    for (int n = 0; n < 2; ++n) {
      for (int l = 0; l < 32; ++l) {
        uint8_t* q = out->q + 128 * n;
        q[l] = (ql[64 * n + l] & 0x0f) | (((qh[32 * n + l] >> 0) & 3) << 4);
        q[l + 32] = (ql[64 * n + l + 32] & 0x0f) | (((qh[32 * n + l] >> 2) & 3) << 4);
        q[l + 64] = (ql[64 * n + l] >> 4) | (((qh[32 * n + l] >> 4) & 3) << 4);
        q[l + 96] = (ql[64 * n + l + 32] >> 4) | (((qh[32 * n + l] >> 6) & 3) << 4);
      }
    }
    for (int i = 0; i < 16; ++i) {
      const int byte = b[192 + i];
      const int scale = byte >= 128 ? byte - 256 : byte;  // Q6_K's scales are int8.
      out->sc[i] = scale;
      out->mn[i] = 32 * scale;
    }
    return;
  }
  out->d = HalfBitsToFloat(LoadU16(b));
  out->dmin = HalfBitsToFloat(LoadU16(b + 2));
  const uint8_t* scales = b + 4;
  const bool five = type == QuantBlockType::kQ5_K;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = five ? b + 48 : b + 16;
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      int lo = ql[32 * g + l] & 0x0f, hi = ql[32 * g + l] >> 4;
      if (five) {
        lo += ((qh[l] >> (2 * g)) & 1) << 4;
        hi += ((qh[l] >> (2 * g + 1)) & 1) << 4;
      }
      out->q[64 * g + l] = static_cast<uint8_t>(lo);
      out->q[64 * g + 32 + l] = static_cast<uint8_t>(hi);
    }
  }
  for (int j = 0; j < 8; ++j) {
    int sc = 0, mn = 0;
    UnpackScaleMinK4(j, scales, &sc, &mn);
    out->sc[2 * j] = out->sc[2 * j + 1] = sc;
    out->mn[2 * j] = out->mn[2 * j + 1] = mn;
  }
}

}  // namespace

void PackPanels(const QuantizedRows& part, int k, uint8_t* dst) {
  const QuantBlockType type = part.type;
  const int blocks = k / QuantBlockElements(type);
  const int block_bytes = QuantBlockBytes(type);
  const int q_bytes = PanelQBytes(type);
  const int meta_bytes = PanelMetaBytes(type);
  const size_t panel_bytes = PanelBytes(type, k);
  const size_t row_bytes = QuantRowBytes(type, k);
  const int panels = (part.rows + kQuantPanelRows - 1) / kQuantPanelRows;
  std::memset(dst, 0, panels * panel_bytes);
  const auto* src = static_cast<const uint8_t*>(part.blocks);
  KBlock kb;
  for (int row = 0; row < part.rows; ++row) {
    const int r = row % kQuantPanelRows;
    uint8_t* panel = dst + static_cast<size_t>(row / kQuantPanelRows) * panel_bytes;
    for (int b = 0; b < blocks; ++b) {
      const uint8_t* blk = src + row * row_bytes + static_cast<size_t>(b) * block_bytes;
      uint8_t* q = panel + static_cast<size_t>(b) * q_bytes;
      uint8_t* meta =
          panel + static_cast<size_t>(blocks) * q_bytes + static_cast<size_t>(b) * meta_bytes;
      // Byte i (< 4) of row r in 64-byte chunk c.
      auto at = [&](int c, int i) -> uint8_t& { return q[64 * c + 4 * r + i]; };
      switch (type) {
        case QuantBlockType::kQ8_0:
          for (int i = 0; i < 32; ++i) at(i / 4, i % 4) = blk[2 + i];
          std::memcpy(meta + 2 * r, blk, 2);
          break;
        case QuantBlockType::kQ4_0:
        case QuantBlockType::kQ4_1: {
          const bool q41 = type == QuantBlockType::kQ4_1;
          const uint8_t* qs = blk + (q41 ? 4 : 2);
          uint8_t v[32];
          for (int i = 0; i < 16; ++i) {
            v[i] = qs[i] & 0x0f;
            v[i + 16] = qs[i] >> 4;
          }
          for (int c = 0; c < 4; ++c) {
            for (int i = 0; i < 4; ++i) {
              at(c, i) = static_cast<uint8_t>(v[8 * c + i] | v[8 * c + 4 + i] << 4);
            }
          }
          std::memcpy(meta + 2 * r, blk, 2);
          if (q41) std::memcpy(meta + 32 + 2 * r, blk + 2, 2);
          break;
        }
        case QuantBlockType::kQ4_K:
        case QuantBlockType::kQ5_K:
        case QuantBlockType::kQ6_K:
          UnpackK(type, blk, &kb);
          if (type == QuantBlockType::kQ4_K) {
            for (int c = 0; c < 32; ++c) {
              for (int i = 0; i < 4; ++i) {
                at(c, i) = static_cast<uint8_t>(kb.q[8 * c + i] | kb.q[8 * c + 4 + i] << 4);
              }
            }
          } else {
            for (int c = 0; c < 64; ++c) {
              for (int i = 0; i < 4; ++i) at(c, i) = kb.q[4 * c + i];
            }
          }
          if (type == QuantBlockType::kQ6_K) {
            for (int i = 0; i < 16; ++i) meta[16 * i + r] = static_cast<uint8_t>(kb.sc[i]);
            std::memcpy(meta + 256 + 2 * r, blk + 208, 2);
          } else {
            for (int j = 0; j < 8; ++j) {
              meta[16 * j + r] = static_cast<uint8_t>(kb.sc[2 * j]);
              meta[128 + 32 * (j / 2) + 2 * r + j % 2] = static_cast<uint8_t>(kb.mn[2 * j]);
            }
            std::memcpy(meta + 256 + 2 * r, blk, 2);
            std::memcpy(meta + 288 + 2 * r, blk + 2, 2);
          }
          break;
      }
    }
  }
}

void QuantTilePortable(QuantBlockType type, const QuantizedActivations& a, int r0, int rows,
                       const uint8_t* w, size_t row_bytes, int outputs, const float* bias, float* y,
                       int ldy) {
  const int k = a.k;
  const int block = QuantBlockElements(type);
  const int block_bytes = QuantBlockBytes(type);
  const int blocks = k / block;
  const int x_blocks = k / a.block;
  KBlock kb;
  for (int o = 0; o < outputs; ++o) {
    const uint8_t* wr = w + o * row_bytes;
    for (int r = r0; r < r0 + rows; ++r) {
      const int8_t* xq = a.q + static_cast<size_t>(r) * k;
      const float* xd = a.d + static_cast<size_t>(r) * x_blocks;
      const int16_t* bs = a.bsum16 + static_cast<size_t>(r) * (k / 16);
      float acc = 0.0f;
      for (int b = 0; b < blocks; ++b) {
        const uint8_t* blk = wr + static_cast<size_t>(b) * block_bytes;
        const int8_t* xb = xq + b * block;
        if (block == 32) {
          int sum = 0;
          const int xsum = bs[2 * b] + bs[2 * b + 1];
          if (type == QuantBlockType::kQ8_0) {
            for (int i = 0; i < 32; ++i) sum += static_cast<int8_t>(blk[2 + i]) * xb[i];
          } else {
            const uint8_t* qs = blk + (type == QuantBlockType::kQ4_1 ? 4 : 2);
            for (int i = 0; i < 16; ++i) sum += (qs[i] & 0x0f) * xb[i] + (qs[i] >> 4) * xb[i + 16];
            if (type == QuantBlockType::kQ4_0) sum -= 8 * xsum;
          }
          const float dx = xd[b];
          acc = std::fma(static_cast<float>(sum), HalfBitsToFloat(LoadU16(blk)) * dx, acc);
          if (type == QuantBlockType::kQ4_1) {
            acc = std::fma(static_cast<float>(xsum), HalfBitsToFloat(LoadU16(blk + 2)) * dx, acc);
          }
          continue;
        }
        UnpackK(type, blk, &kb);
        int sum = 0, msum = 0;
        for (int g = 0; g < 16; ++g) {
          int dot = 0;
          for (int i = 0; i < 16; ++i) dot += kb.q[16 * g + i] * xb[16 * g + i];
          sum += kb.sc[g] * dot;
          msum += kb.mn[g] * bs[16 * b + g];
        }
        if (type == QuantBlockType::kQ6_K) {
          acc = std::fma(static_cast<float>(sum - msum), kb.d * xd[b], acc);
        } else {
          acc = std::fma(static_cast<float>(sum), kb.d * xd[b], acc);
          acc = std::fma(static_cast<float>(msum), -(kb.dmin * xd[b]), acc);
        }
      }
      y[static_cast<size_t>(r - r0) * ldy + o] = bias != nullptr ? acc + bias[o] : acc;
    }
  }
}

QuantLevel ActiveQuantLevel() {
  static const QuantLevel level = [] {
    const CpuIsa isa = ActiveCpuIsa();
    if (isa >= CpuIsa::kAvx512 && CpuHasAvx512Vnni()) return QuantLevel::kAvx512Vnni;
    if (isa >= CpuIsa::kAvx2) return QuantLevel::kAvx2;
    return QuantLevel::kPortable;
  }();
  return level;
}

namespace {

bool IsKType(QuantBlockType type) { return QuantBlockElements(type) == 256; }

bool UsesPanels(QuantLevel level) { return level != QuantLevel::kPortable; }

// Bytes one part takes at `level`.
size_t PartBytes(QuantLevel level, const QuantizedRows& p, int k) {
  if (UsesPanels(level)) {
    return static_cast<size_t>((p.rows + kQuantPanelRows - 1) / kQuantPanelRows) *
           PanelBytes(p.type, k);
  }
  return (QuantRowBytes(p.type, k) * p.rows + 63) / 64 * 64;
}

// One thread's activations, per block size, kept between calls.
struct ActivationBuffers {
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bsum16, bsum32;
  QuantizedActivations Quantize(QuantLevel level, const float* x, int ldx, int m, int k,
                                int block) {
    q.resize(static_cast<size_t>(m) * k);
    d.resize(static_cast<size_t>(m) * (k / block));
    bsum16.resize(static_cast<size_t>(m) * (k / 16));
    bsum32.resize(static_cast<size_t>(m) * (k / 32));
    (level == QuantLevel::kAvx512Vnni ? QuantizeActivationsAvx512 : QuantizeActivations)(
        x, ldx, m, k, block, q.data(), d.data(), bsum16.data(), bsum32.data());
    return {q.data(), d.data(), bsum16.data(), bsum32.data(), k, block};
  }
};

}  // namespace

size_t QuantizedPackBytesAt(QuantLevel level, std::span<const QuantizedRows> parts, int k) {
  size_t bytes = 0;
  for (const QuantizedRows& p : parts) bytes += PartBytes(level, p, k);
  return bytes;
}

std::vector<QuantizedRows> PackQuantizedAt(QuantLevel level, std::span<const QuantizedRows> parts,
                                           int k, void* dst) {
  std::vector<QuantizedRows> packed;
  auto* at = static_cast<uint8_t*>(dst);
  for (const QuantizedRows& p : parts) {
    if (p.rows == 0) {
      // Nothing to copy (and the part may have no bytes at all).
    } else if (UsesPanels(level)) {
      PackPanels(p, k, at);
    } else {
      std::memcpy(at, p.blocks, QuantRowBytes(p.type, k) * p.rows);
    }
    packed.push_back({p.type, p.rows, at});
    at += PartBytes(level, p, k);
  }
  return packed;
}

void GemmQuantizedAt(QuantLevel level, const float* x, int ldx, int m, int k,
                     std::span<const QuantizedRows> packed, const float* bias, float* y, int ldy,
                     ThreadPool* pool) {
  if (m <= 0) return;
  // X quantized once per call, in 32- and/or 256-blocks as the parts need (the pool's
  // threads only read it).
  thread_local ActivationBuffers small, large;
  bool need_small = false, need_large = false;
  for (const QuantizedRows& p : packed) (IsKType(p.type) ? need_large : need_small) = true;
  QuantizedActivations a32, a256;
  if (need_small) a32 = small.Quantize(level, x, ldx, m, k, 32);
  if (need_large) a256 = large.Quantize(level, x, ldx, m, k, 256);

  // Tiles of W's rows (a panel, or kQuantTileOutputs rows of blocks) within one part; a
  // thread takes a chunk of tiles and runs every row tile of X over it, so the chunk's
  // weights are read from memory once.
  const bool panels = UsesPanels(level);
  const auto panel_kernel =
      level == QuantLevel::kAvx512Vnni ? QuantPanelAvx512Vnni : QuantPanelAvx2;
  const int tile_rows = panels ? kQuantPanelRows : kQuantTileOutputs;
  struct Tile {
    const QuantizedRows* part;
    int first_row;  // Within the part.
    int column;     // Of Y.
  };
  std::vector<Tile> tiles;
  size_t weight_bytes = 0;
  int column = 0;
  for (const QuantizedRows& p : packed) {
    for (int r = 0; r < p.rows; r += tile_rows) tiles.push_back({&p, r, column + r});
    column += p.rows;
    weight_bytes += PartBytes(level, p, k);
  }
  const int64_t num_tiles = static_cast<int64_t>(tiles.size());
  if (num_tiles == 0) return;
  // Chunks of about 256 KiB of weights (L2), fewer where that leaves a thread idle.
  const size_t tile_bytes = std::max<size_t>(1, weight_bytes / num_tiles);
  int64_t grain = std::max<int64_t>(1, static_cast<int64_t>((256u << 10) / tile_bytes));
  if (pool != nullptr) {
    grain = std::clamp<int64_t>(num_tiles / (4 * pool->num_threads()), 1, grain);
  }
  auto run = [&](int64_t begin, int64_t end) {
    for (int r = 0; r < m; r += kQuantMaxRows) {
      const int rows = std::min(kQuantMaxRows, m - r);
      for (int64_t t = begin; t < end; ++t) {
        const Tile& tile = tiles[t];
        const QuantizedRows& p = *tile.part;
        const QuantizedActivations& a = IsKType(p.type) ? a256 : a32;
        const int outputs = std::min(tile_rows, p.rows - tile.first_row);
        const float* b = bias != nullptr ? bias + tile.column : nullptr;
        float* yt = y + static_cast<size_t>(r) * ldy + tile.column;
        const auto* base = static_cast<const uint8_t*>(p.blocks);
        if (panels) {
          panel_kernel(p.type, a, r, rows,
                       base + (tile.first_row / kQuantPanelRows) * PanelBytes(p.type, k), outputs,
                       b, yt, ldy);
        } else {
          const size_t row_bytes = QuantRowBytes(p.type, k);
          QuantTilePortable(p.type, a, r, rows, base + tile.first_row * row_bytes, row_bytes,
                            outputs, b, yt, ldy);
        }
      }
    }
  };
  if (pool == nullptr) {
    run(0, num_tiles);
  } else {
    pool->ParallelFor(num_tiles, grain, run);
  }
}

}  // namespace internal

const char* QuantGemmKernelName() {
  switch (internal::ActiveQuantLevel()) {
    case internal::QuantLevel::kAvx512Vnni:
      return "avx512_vnni on 16-row panels repacked at load";
    case internal::QuantLevel::kAvx2:
      return "avx2 on 16-row panels repacked at load";
    case internal::QuantLevel::kPortable:
    default:
      return "portable";
  }
}

bool QuantGemmBeatsInt8() {
  return internal::ActiveQuantLevel() != internal::QuantLevel::kPortable;
}

size_t QuantizedPackBytes(std::span<const QuantizedRows> parts, int k) {
  return internal::QuantizedPackBytesAt(internal::ActiveQuantLevel(), parts, k);
}

std::vector<QuantizedRows> PackQuantized(std::span<const QuantizedRows> parts, int k, void* dst) {
  return internal::PackQuantizedAt(internal::ActiveQuantLevel(), parts, k, dst);
}

void GemmQuantized(const float* x, int ldx, int m, int k, std::span<const QuantizedRows> packed,
                   const float* bias, float* y, int ldy, ThreadPool* pool) {
  internal::GemmQuantizedAt(internal::ActiveQuantLevel(), x, ldx, m, k, packed, bias, y, ldy, pool);
}

}  // namespace conveyor::kernels
