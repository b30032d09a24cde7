// f16_emu.h: the f16:: PTX helpers of cuda_src/conv_mma.cuh and conv_f16.cu's ldmatrix::x4 for the CPU emulator
// (tf32_emu.h includes it).
//
// pack is cvt.rn.f16x2.f32, with the float -> IEEE 754 binary16 rounding written from the standard's definition
// (round to nearest, ties to even, gradual underflow to subnormals, overflow to infinity, NaN stays NaN). mma is
// mma.m16n8k16 .f16 with f32 accumulators, warp-wide like tf32::mma (publish, yield, compute, yield), its fragment
// layout written from the PTX ISA ("Matrix Fragments for mma.m16n8k16", .f16) independently of the kernel, so
// a kernel that loads fragments in the wrong places gets wrong sums. ldmatrix::x4 is warp-wide too (publish the
// row addresses, yield, gather, yield), its layout written from the PTX ISA ("ldmatrix").
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "mma_emu.h"


namespace f16 {
// binary16: 1 sign bit, 5 exponent bits (bias 15), 10 fraction bits. A finite value v = sig * 2^(e - 23) with a
// 24-bit float significand sig is rounded to a multiple of the binary16 spacing 2^(max(e, -14) - 10) (below 2^-14
// the spacing stays 2^-24: subnormals). Counting in units of that spacing, the encoding is
// ((max(e, -14) + 14) << 10) + units: units = 1024 (an implicit 1) lands on the next exponent field, and a carry
// out of the fraction (units = 2048) moves to the next binade by itself.
inline uint16_t half_bits(float v) {
    uint32_t u;
    std::memcpy(&u, &v, 4);
    const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000u);
    const int exp_field = static_cast<int>((u >> 23) & 0xffu);
    const uint32_t frac = u & 0x7fffffu;
    if (exp_field == 0xff) return sign | (frac ? 0x7e00 | (frac >> 13) : 0x7c00);  // NaN (quiet) or infinity
    if (exp_field == 0) return sign;  // zero or an fp32 subnormal (< 2^-126): far below half of 2^-24
    const int e = exp_field - 127;
    if (e > 15) return sign | 0x7c00;
    const uint64_t sig = frac | 0x800000u;
    const int scale = std::max(e, -14);
    const int shift = scale - 10 - (e - 23);  // >= 13
    if (shift > 40) return sign;
    uint64_t units = sig >> shift;
    const uint64_t rest = sig & ((uint64_t{1} << shift) - 1), half_unit = uint64_t{1} << (shift - 1);
    if (rest > half_unit || (rest == half_unit && (units & 1))) ++units;
    const uint64_t bits = (static_cast<uint64_t>(scale + 14) << 10) + units;
    return sign | static_cast<uint16_t>(std::min<uint64_t>(bits, 0x7c00));
}

// Every binary16 value is a binary32 value: a normal one keeps its fraction bits and moves its exponent from bias 15
// to bias 127; a subnormal one is frac * 2^-24, a product of a 10-bit integer and a power of two, exact in float.
// (Bit assembly and a constant product rather than ldexp, a library call: the emulated mma decodes every operand.)
inline float half_value(uint16_t h) {
    const uint32_t exp_field = (h >> 10) & 0x1fu, frac = h & 0x3ffu;
    const float sign = (h & 0x8000) ? -1.f : 1.f;
    if (exp_field == 0x1f) return frac ? NAN : sign * INFINITY;
    if (exp_field == 0) return sign * (static_cast<float>(frac) * 0x1p-24f);
    const uint32_t bits = (static_cast<uint32_t>(h & 0x8000u) << 16) | (exp_field + 127 - 15) << 23 | frac << 13;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
}

inline float round(float v) { return half_value(half_bits(v)); }

inline unsigned pack(float lo, float hi) { return half_bits(lo) | static_cast<unsigned>(half_bits(hi)) << 16; }

// The half at index `which` (0: bits 0..15, 1: bits 16..31) of a packed register.
inline float unpack(unsigned reg, unsigned which) { return half_value(static_cast<uint16_t>(reg >> (16 * which))); }

inline void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    // A[row][k] sits in lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 * (k >= 8), half k % 2;
    // B[k][col] in lane col * 4 + (k % 8) / 2, register (k >= 8), half k % 2;
    // C[row][col] in lane (row % 8) * 4 + col / 2, register 2 * (row >= 8) + col % 2.
    mma_emu::warp_mma<16>(d, a, b, [](const unsigned (*la)[4], const unsigned (*lb)[2], unsigned row, unsigned col,
                                      unsigned k) {
        const float av = unpack(la[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
        const float bv = unpack(lb[col * 4 + (k % 8) / 2][k >= 8], k % 2);
        return (double)av * bv;
    });
}
}  // namespace f16

namespace ldmatrix {
inline const unsigned char* lane_row[1024];

// ldmatrix.sync.aligned.m8n8.x4.shared.b16: lane l gives the address of row l % 8 of matrix l / 8; register j of
// lane l receives halves 2 (l % 4) and 2 (l % 4) + 1 (the lower one in bits 0..15) of row l / 4 of matrix j.
inline void x4(unsigned (&r)[4], const void* row) {
    const unsigned me = threadIdx.x, warp0 = me & ~31u, lane = me & 31u;
    lane_row[me] = static_cast<const unsigned char*>(row);
    emu::yield();
    unsigned out[4];
    for (unsigned j = 0; j < 4; ++j) std::memcpy(&out[j], lane_row[warp0 + 8 * j + lane / 4] + 4 * (lane % 4), 4);
    emu::yield();
    std::memcpy(r, out, sizeof out);
}
}  // namespace ldmatrix
