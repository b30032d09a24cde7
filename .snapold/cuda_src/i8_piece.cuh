// i8_piece.cuh: the int8 NHWC activations of `--precision int8` as pool_nhwc.cu's and conv_input_nhwc.cu's int8
// kernels move them (I8Piece: 16 channels, one 16-byte piece), and the integer rounding rules of the 8-bit network
// (backends/int8_reference.py's module doc), each one IEEE operation so that the kernels reproduce the NumPy
// reference bit for bit:
// - quantize: q = clamp(rint(v * inv), -127, 127), inv = float32(1) / float32(scale): one correctly rounded float32
//   product (__fmul_rn: never contracted into an FMA), rounded half to even (cvt.rni, __float2int_rn), saturated
//   symmetrically, so -128 is never written;
// - requantize: the same with q itself for v and ratio = float32(s_in) / float32(s_out) for inv;
// - average: rint(sum / count) as one correctly rounded float32 division (__fdiv_rn). sum * float32(1 / count)
//   is not the same in general: with count 14 it misses 78 of the half-integer quotients in range (-1771 / 14 =
//   -126.5 among them), which then round to the wrong neighbour. For counts 1..9 (every 3x3 window) the product
//   rounds every |sum| <= 127 count to the same integer (mean_small; tests/kernels/test_int8_nhwc.py checks all of
//   them), and costs one multiply where the division costs a dozen instructions. The division rounds right:
//   |sum| <= 127 * count < 2^12 and count <= 25, so a quotient that is not a half-integer is at least
//   1 / (2 count) >= 2^-6 away from one, far more than float32's half ulp there (<= 2^-13); a half-integer quotient
//   is representable and stays one.
// - a store's bytes (quantized_bits): the same quantize without a conversion instruction (F2I issues at a quarter of
//   the FP32 rate on sm_90, and an epilogue converts every output): x = v * inv clamped to [lo, 127], plus 1.5 * 2^23.
//   The sum lies in [2^23, 2^24), where float32's spacing is 1, so the addition rounds x to the nearest integer, ties
//   to even, as cvt.rni does, and leaves that integer in the low mantissa bits: the low byte is q in two's complement.
//   Clamping before the rounding equals saturating after it (rounding is monotone, +-127 are integers). With lo = 0
//   it is quantize(fmaxf(v, 0), inv) as well, for inv > 0 (v * inv has v's sign): a ReLU costs nothing more. For
//   finite v only (NaN would give lo, where quantize gives 0): the operands are integer sums times finite scales (the
//   weight file's arrays are checked finite).
// The CPU emulator (tests/cuda_emu) compiles this with g++: the host branches are the same operations in IEEE
// float32 (default rounding mode: to nearest, ties to even).
#pragma once

#ifndef __CUDACC__
#include <climits>
#include <cmath>
#endif

namespace i8q {
constexpr int QMAX = 127;

// v rounded to the nearest integer, ties to even, saturated to int (NaN: 0), as cvt.rni.s32.f32.
__device__ __forceinline__ int rint(float v) {
#ifdef __CUDACC__
    return __float2int_rn(v);
#else
    if (v != v) return 0;
    const float r = std::nearbyint(v);
    return r >= 2147483648.f ? INT_MAX : r < -2147483648.f ? INT_MIN : static_cast<int>(r);
#endif
}

__device__ __forceinline__ float mul(float a, float b) {
#ifdef __CUDACC__
    return __fmul_rn(a, b);
#else
    return a * b;
#endif
}

__device__ __forceinline__ float div(float a, float b) {
#ifdef __CUDACC__
    return __fdiv_rn(a, b);
#else
    return a / b;
#endif
}

__device__ __forceinline__ float add(float a, float b) {
#ifdef __CUDACC__
    return __fadd_rn(a, b);
#else
    return a + b;
#endif
}

__device__ __forceinline__ int saturate(int q) { return q < -QMAX ? -QMAX : q > QMAX ? QMAX : q; }

// float -> int8 at the scale whose float32 reciprocal is inv.
__device__ __forceinline__ int quantize(float v, float inv) { return saturate(rint(mul(v, inv))); }

// quantize(v, inv) in the low byte of the result (the header); lo = -QMAX, or 0 for quantize(fmaxf(v, 0), inv).
__device__ __forceinline__ unsigned quantized_bits(float v, float inv, float lo) {
    constexpr float ROUNDER = 12582912.f;  // 1.5 * 2^23
    return __float_as_uint(add(fminf(fmaxf(mul(v, inv), lo), static_cast<float>(QMAX)), ROUNDER));
}

// The low bytes of b0 .. b3 as one word, b0's lowest: three byte permutes.
__device__ __forceinline__ unsigned pack_low_bytes(unsigned b0, unsigned b1, unsigned b2, unsigned b3) {
    return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

// int8 at s_in -> int8 at s_out, ratio = float32(s_in) / float32(s_out); ratio 1 leaves q as it is.
__device__ __forceinline__ int requantize(int q, float ratio) {
    return ratio == 1.f ? q : quantize(static_cast<float>(q), ratio);
}

// rint(sum / count), the average pool's integer mean.
__device__ __forceinline__ int mean(int sum, int count) {
    return rint(div(static_cast<float>(sum), static_cast<float>(count)));
}

constexpr int MEAN_SMALL_MAX = 9;

// float32(1) / float32(count) for count 1..MEAN_SMALL_MAX, as constants (the compiler rounds each quotient
// correctly, as div would): selects, where div has a slow path that costs a call and a stack frame.
__device__ __forceinline__ float recip_small(int count) {
    float r = 1.f;
#pragma unroll
    for (int c = 2; c <= MEAN_SMALL_MAX; ++c) r = count == c ? 1.f / static_cast<float>(c) : r;
    return r;
}

// rint(sum / count) for count <= MEAN_SMALL_MAX, recip = recip_small(count): the same integer as mean (see above).
__device__ __forceinline__ int mean_small(int sum, float recip) { return rint(mul(static_cast<float>(sum), recip)); }
}  // namespace i8q

// 16 int8 channels, a 16-byte piece of an NHWC pixel (channel counts, strides and view offsets multiples of 16).
struct I8Piece {
    using T = signed char;
    static constexpr int PIECE = 16;
    __device__ __forceinline__ static void load(int (&v)[PIECE], const T* p) {
        const uint4 q = __ldg(reinterpret_cast<const uint4*>(p));
        const unsigned w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int e = 0; e < PIECE; ++e) v[e] = static_cast<signed char>(w[e / 4] >> (8 * (e % 4)) & 0xFF);
    }
    __device__ __forceinline__ static void store(T* p, const int (&v)[PIECE]) {
        unsigned w[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) w[i] = i8q::pack_low_bytes(v[4 * i], v[4 * i + 1], v[4 * i + 2], v[4 * i + 3]);
        *reinterpret_cast<uint4*>(p) = uint4{w[0], w[1], w[2], w[3]};
    }
};
