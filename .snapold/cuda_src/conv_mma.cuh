// conv_mma.cuh: the tensor-core implicit-GEMM convolution of conv_tf32.cu, and the PTX helpers (tf32::, f16::,
// ldmatrix::, cp_async::, pack8 / unpack8) and NHWC element types (NhwcF16, NhwcTf32, NhwcF32, NhwcI8) that
// conv_f16.cu, conv_nhwc_*.cu, conv_input_nhwc.cu and pool_nhwc.cu share.
//
// y[b, m, oh, ow] = relu(bias[m] + sum_{c, r, s} w[m, c, r, s] * x[b, c, oh*S - PH + r, ow*S - PW + s]) as
// C[M, N] = A[M, K] B[K, N] with M = Cout, N = batch*Ho*Wo, K = Cin*KH*KW, A = wt[K][M] (the weights as the backend
// uploads them), B = the im2col matrix, gathered from x while it is copied into shared memory. Memory and shared
// memory stay float32; the operand policy (Tf32Mma below) rounds the operands when it turns them into mma
// fragments and picks the mma shape. Rounding there, not when staging, keeps both tiles on cp.async straight from
// global to shared memory (no register staging, the loads of later tiles overlap the math).
//
// Both tiles travel by cp.async: A in 16-byte pieces when Cout is a multiple of 4 (else 4-byte ones), B one
// element at a time, since neighbouring k of one pixel are not adjacent in x; a zero-fill copy (source size 0)
// supplies padding and the tails past M, N and the K slice. STAGES buffers form a ring: tile t+STAGES-1 is in
// flight while tile t is multiplied, one barrier per tile. Each of the 8 warps owns a WM x WN piece of the block
// tile, (WM/16) x (WN/8) accumulators of m16n8 (PTX ISA "Matrix Fragments for mma.m16n8k8"; g = lane / 4,
// t = lane % 4):
//   C 16x8: c0 = C[g][2t], c1 = C[g][2t+1], c2 = C[g+8][2t], c3 = C[g+8][2t+1]
// Shared tiles are As[k][m] and Bs[k][n], rows padded by Op::PAD floats so that fragment loads hit 32 distinct
// banks (see Tf32Mma).
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split); with several slices the raw sums go to the
// workspace ws[z][M][N] for conv.cu's conv_splitk_reduce, with one the epilogue adds bias, applies ReLU, writes y.
// Views: as conv.cu (x, y point at channel 0 of the view in batch item 0; item b starts *_bstride floats later).
//
// Launch: block 256, grid (ceil(N/BN), ceil(M/BM), splits), static shared memory only (< 48 KB, no attribute).
#pragma once
#include <type_traits>

#include "common.cuh"
#include "i8_piece.cuh"
#include "wgmma.cuh"

#ifdef __CUDACC__
// Inline PTX for sm_80+. A host compiler (the CPU emulator, tests/cuda_emu/tf32_emu.h and f16_emu.h) supplies the
// same namespaces.
namespace tf32 {
__device__ __forceinline__ unsigned round(float v) {
    unsigned r;
    asm("cvt.rna.tf32.f32 %0, %1;" : "=r"(r) : "f"(v));
    return r;
}

// d += a * b for one warp's 16x8x8 fragments.
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
}  // namespace tf32

namespace f16 {
// Two floats rounded to fp16 (to nearest, ties to even), lo in bits 0..15, hi in 16..31. cvt.rn.f16x2.f32 puts
// its first source in the upper half.
__device__ __forceinline__ unsigned pack(float lo, float hi) {
    unsigned r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

// d += a * b for one warp's 16x8x16 fragments, fp16 products summed in fp32.
__device__ __forceinline__ void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The half at index `which` (0: bits 0..15, 1: bits 16..31) of a packed register, as a float (exact).
__device__ __forceinline__ float unpack(unsigned reg, unsigned which) {
    const unsigned short h = static_cast<unsigned short>(reg >> (16 * which));
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
}  // namespace f16

namespace ldmatrix {
// Four 8x8 matrices of 16-bit elements from shared memory; `row` is this lane's row address (16-byte aligned).
__device__ __forceinline__ void x4(unsigned (&r)[4], const void* row) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(row));
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(s));
}
}  // namespace ldmatrix

namespace cp_async {
// One float, or zero when !valid (the source is then not read).
__device__ __forceinline__ void copy4(float* dst, const float* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(src), "r"(valid ? 4 : 0) : "memory");
}

// Four floats; both addresses 16-byte aligned.
__device__ __forceinline__ void copy16(float* dst, const float* src) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}

// 16 bytes, or 16 zero bytes when !valid (the source is then not read); both addresses 16-byte aligned. .cg (L2
// only): conv_nhwc_*.cu's input pieces with .ca, which keeps them in L1 for the next taps' overlapping windows, are
// no faster and up to 6 % slower (docs/performance-log.md).
__device__ __forceinline__ void copy16_or_zero(void* dst, const void* src, bool valid) {
    const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(src), "r"(valid ? 16 : 0) : "memory");
}

__device__ __forceinline__ void commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// An arrival on the mbarrier (wgmma.cuh) once every cp.async this thread has issued so far has landed; .noinc: the
// barrier's count includes it (cp.async.mbarrier.arrive).
__device__ __forceinline__ void arrive_on(unsigned long long* bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(
                     static_cast<unsigned>(__cvta_generic_to_shared(bar)))
                 : "memory");
}

// Wait until at most N of this thread's copy groups are still in flight.
template <int N>
__device__ __forceinline__ void wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}
}  // namespace cp_async
#endif

// Eight channels of an fp16 NHWC pixel (one 16-byte piece) to and from floats, lowest channel in the lowest half.
__device__ __forceinline__ void unpack8(float (&v)[8], uint4 q) {
    const unsigned r[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = f16::unpack(r[e / 2], e % 2);
}

__device__ __forceinline__ uint4 pack8(const float (&v)[8]) {
    return uint4{f16::pack(v[0], v[1]), f16::pack(v[2], v[3]), f16::pack(v[4], v[5]), f16::pack(v[6], v[7])};
}

namespace tf32 {
// v rounded to TF32 (cvt.rna), as a float again.
__device__ __forceinline__ float rounded(float v) { return __uint_as_float(round(v)); }
}  // namespace tf32

// The element types of the NHWC path's activations (conv_nhwc_*.cu, conv_input_nhwc.cu, pool_nhwc.cu). A 16-byte
// piece holds PIECE channels of one pixel; the kernels move whole pieces. load / store convert a piece from / to
// floats, store2 two adjacent channels; mma is the tensor-core step whose k spans two pieces. SPLIT: each operand
// goes to the tensor cores as two fp16 halves (NhwcF32).
// NhwcF16 (--precision fp16): binary16 words, rounded to nearest even at every store; mma.m16n8k16 .f16.
struct NhwcF16 {
    using T = unsigned short;
    using Acc = float;  // the tensor cores' sums
    static constexpr int PIECE = 8;
    static constexpr bool SPLIT = false, INT = false;
    // A piece's raw 16 bytes to floats (conv_nhwc_mma.cu's max-pool loader takes them raw first).
    __device__ __forceinline__ static void unpack(float (&v)[PIECE], uint4 q) { unpack8(v, q); }
    __device__ __forceinline__ static void load(float (&v)[PIECE], const T* p) {
        unpack(v, __ldg(reinterpret_cast<const uint4*>(p)));
    }
    __device__ __forceinline__ static void store(T* p, const float (&v)[PIECE]) {
        *reinterpret_cast<uint4*>(p) = pack8(v);
    }
    __device__ __forceinline__ static void store2(T* p, float v0, float v1) {
        *reinterpret_cast<unsigned*>(p) = f16::pack(v0, v1);
    }
    __device__ __forceinline__ static void store4(T* p, const float (&v)[4]) {
        *reinterpret_cast<uint2*>(p) = uint2{f16::pack(v[0], v[1]), f16::pack(v[2], v[3])};
    }
    __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        f16::mma(d, a, b);
    }
    template <int N>
    __device__ __forceinline__ static void wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b,
                                                 int accumulate) {
        ::wgmma::Mma<N>::f16(d, a, b, accumulate);
    }
};

// NhwcTf32 (--precision tf32): float32 words holding values already rounded to TF32 (cvt.rna at every store, and
// the backend rounds the weights alike), so mma.m16n8k8 .tf32 takes the bits ldmatrix delivers as they are: no
// conversion between shared memory and the tensor cores. The values are those a TF32 GEMM rounds its operands to
// anyway; only the classifier's features (global_avg_pool_nhwc_tf32) stay unrounded float32.
struct NhwcTf32 {
    using T = float;
    using Acc = float;
    static constexpr int PIECE = 4;
    static constexpr bool SPLIT = false, INT = false;
    __device__ __forceinline__ static void unpack(float (&v)[PIECE], uint4 q) {
        v[0] = __uint_as_float(q.x);
        v[1] = __uint_as_float(q.y);
        v[2] = __uint_as_float(q.z);
        v[3] = __uint_as_float(q.w);
    }
    __device__ __forceinline__ static void load(float (&v)[PIECE], const T* p) {
        unpack(v, __ldg(reinterpret_cast<const uint4*>(p)));
    }
    __device__ __forceinline__ static void store(T* p, const float (&v)[PIECE]) {
        *reinterpret_cast<float4*>(p) =
            float4{tf32::rounded(v[0]), tf32::rounded(v[1]), tf32::rounded(v[2]), tf32::rounded(v[3])};
    }
    __device__ __forceinline__ static void store2(T* p, float v0, float v1) {
        *reinterpret_cast<float2*>(p) = float2{tf32::rounded(v0), tf32::rounded(v1)};
    }
    __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        tf32::mma(d, a, b);
    }
    template <int N>
    __device__ __forceinline__ static void wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b,
                                                 int accumulate) {
        ::wgmma::Mma<N>::tf32(d, a, b, accumulate);
    }
};

// NhwcF32 (--precision fp32 on the NHWC path, sm_90a: conv_nhwc_wgmma.cu's wgmma tiles only): float32 words, stored
// unrounded, and products with float32's accuracy from the fp16 tensor cores by splitting each operand in two
// ("3xFP16"; Ootomo and Yokota, "Recovering single precision accuracy from Tensor Cores while surpassing the FP32
// theoretical peak performance", 2022, split so, the low half scaled): a = a_hi + a_lo 2^-11 with
// a_hi = rn_f16(a) and a_lo = rn_f16((a - a_hi) 2^11) (the difference and its product with 2^11 are exact in
// float32). a b = a_hi b_hi + (a_hi b_lo + a_lo b_hi) 2^-11 + a_lo b_lo 2^-22; the last term, and the roundings of
// a_lo and b_lo, are ~2^-24 |a b|: three fp16 products per product, each as accurate as float32's own rounding,
// at fp16's rate (twice TF32's). The low halves are scaled by 2^11 so that they stay normal fp16 numbers: unscaled,
// the low half of a weight of 0.01 would be a subnormal with a few bits. The high halves need |a| < 65520 (fp16's
// largest, rounded to): larger activations or weights become infinities (the backend checks the weights).
// split() turns a 16-byte piece into four fp16 high halves at `hi` and four low ones at `lo`: the activations' in
// shared memory, every stage; the weights' in global memory, once after the upload (conv_nhwc_wgmma.cu's
// conv_nhwc_f32_split_weights), so that the tiles only move theirs (copy_halves).
struct NhwcF32 : NhwcTf32 {
    static constexpr bool SPLIT = true;
    static constexpr float LO_SCALE = 2048.f, LO_UNSCALE = 1.f / 2048.f;  // 2^11 and back: exact
    __device__ __forceinline__ static void store(T* p, const float (&v)[PIECE]) {
        *reinterpret_cast<float4*>(p) = float4{v[0], v[1], v[2], v[3]};
    }
    __device__ __forceinline__ static void store2(T* p, float v0, float v1) {
        *reinterpret_cast<float2*>(p) = float2{v0, v1};
    }
    __device__ __forceinline__ static void split(const T* piece, unsigned short* hi, unsigned short* lo) {
        const float4 v = *reinterpret_cast<const float4*>(piece);
        const unsigned h01 = f16::pack(v.x, v.y), h23 = f16::pack(v.z, v.w);
        *reinterpret_cast<uint2*>(hi) = uint2{h01, h23};
        *reinterpret_cast<uint2*>(lo) = uint2{f16::pack((v.x - f16::unpack(h01, 0)) * LO_SCALE,
                                                        (v.y - f16::unpack(h01, 1)) * LO_SCALE),
                                              f16::pack((v.z - f16::unpack(h23, 0)) * LO_SCALE,
                                                        (v.w - f16::unpack(h23, 1)) * LO_SCALE)};
    }
    // A weight piece arrives split (conv_nhwc_wgmma.cu's conv_nhwc_f32_split_weights: the same halves, made once
    // after the upload): its 16 bytes are the four high halves, then the four low ones.
    __device__ __forceinline__ static void copy_halves(const T* piece, unsigned short* hi, unsigned short* lo) {
        const uint4 v = *reinterpret_cast<const uint4*>(piece);
        *reinterpret_cast<uint2*>(hi) = uint2{v.x, v.y};
        *reinterpret_cast<uint2*>(lo) = uint2{v.z, v.w};
    }
    // The split halves' products: fp16 wgmma (k16 a row of 32 bytes).
    template <int N>
    __device__ __forceinline__ static void wgmma(float (&d)[N / 2], unsigned long long a, unsigned long long b,
                                                 int accumulate) {
        ::wgmma::Mma<N>::f16(d, a, b, accumulate);
    }
};

// NhwcI8 (--precision int8, sm_90a: conv_nhwc_wgmma.cu's wgmma tiles only): int8 values q standing for q * s (one
// float32 storage scale s per tensor; backends/int8_reference.py states the arithmetic), 16 channels a piece, so a
// stage's rows of 64 bytes hold 64 k and each wgmma m64nNk32 .s32.s8.s8 takes 32 of them: the same tiles, swizzle and
// descriptors as fp16. The sums are exact int32 (Acc); the epilogue (conv_nhwc.cuh's NhwcStore::column4) scales them
// in float32, adds the bias, applies ReLU and requantizes to the output's storage scale (i8_piece.cuh's i8q::quantize),
// saturating to +-127: -128 is never written (the poison of the tests and of the arena).
struct NhwcI8 {
    using T = signed char;
    using Acc = int;
    static constexpr int PIECE = 16;
    static constexpr bool SPLIT = false, INT = true;
    template <int N>
    __device__ __forceinline__ static void wgmma(int (&d)[N / 2], unsigned long long a, unsigned long long b,
                                                 int accumulate) {
        ::wgmma::Mma<N>::s8(d, a, b, accumulate);
    }
};

// Zero accumulators of a warp's MI x NJ m16n8 tiles (the tensor-core kernels' one initialisation).
template <int MI, int NJ>
__device__ __forceinline__ void zero_acc(float (&acc)[MI][NJ][4]) {
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.f;
}

// Two n8 B fragments of mma.m16n8k16 .f16 from one ldmatrix.x4 whose lanes give rows (n 0-7, k 0-7), (n 0-7, k 8-15),
// (n 8-15, k 0-7), (n 8-15, k 8-15): b0, b1 of n 0-7 into lo, of n 8-15 into hi (conv_f16.cu's header).
__device__ __forceinline__ void ldmatrix_b_pair(unsigned (&lo)[2], unsigned (&hi)[2], const void* row) {
    unsigned r[4];
    ldmatrix::x4(r, row);
    lo[0] = r[0];
    lo[1] = r[1];
    hi[0] = r[2];
    hi[1] = r[3];
}

// Operand policy: frags() loads one k step of a warp's MI A and NJ B fragments, given as = &As[st][kk][wm] and
// bs = &Bs[st][kk][wn] (rows of SA, SB floats), g = lane / 4, t = lane % 4, in the ISA's fragment layout, so the
// accumulators are in the C layout that store_mma_tile writes.

// mma.m16n8k8 .tf32 (PTX ISA, "Matrix Fragments for mma.m16n8k8", .tf32), fragment i on warp rows 16i.., j on
// columns 8j..:
//   A 16x8 (row): a0 = A[g][t], a1 = A[g+8][t], a2 = A[g][t+4], a3 = A[g+8][t+4]
//   B 8x8 (col):  b0 = B[t][g], b1 = B[t+4][g]
// A lane reads word t*S + g (+ const): with S % 32 == 8, banks 8t + g, all 32 distinct.
struct Tf32Mma {
    static constexpr int K = 8, PAD = 8;
    template <int MI, int NJ, int SA, int SB>
    __device__ __forceinline__ static void frags(unsigned (&a)[MI][4], unsigned (&b)[NJ][2], const float* as,
                                                 const float* bs, int g, int t) {
#pragma unroll
        for (int i = 0; i < MI; ++i) {
            const float* p = as + i * 16 + g + t * SA;
            a[i][0] = tf32::round(p[0]);
            a[i][1] = tf32::round(p[8]);
            a[i][2] = tf32::round(p[4 * SA]);
            a[i][3] = tf32::round(p[4 * SA + 8]);
        }
#pragma unroll
        for (int j = 0; j < NJ; ++j) {
            const float* p = bs + j * 8 + g + t * SB;
            b[j][0] = tf32::round(p[0]);
            b[j][1] = tf32::round(p[4 * SB]);
        }
    }
    __device__ __forceinline__ static void mma(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
        tf32::mma(d, a, b);
    }
};

// The epilogue of both tensor-core convs (conv_tf32.cu through conv_mma_gemm, conv_f16.cu): this lane's m16n8
// accumulators acc[i][j] (C layout above) of a warp tile whose first row is m_base and first column n_base go to y
// with bias and ReLU, or raw to the split-K workspace ws[blockIdx.z][M][N] (y is then the workspace) when
// gridDim.z > 1.
template <int MI, int NJ>
__device__ __forceinline__ void store_mma_tile(const float (&acc)[MI][NJ][4], const float* __restrict__ bias,
                                               float* __restrict__ y, int m_base, int n_base, int lane, int cout,
                                               int n_total, int howo, int y_bstride, int relu) {
    const int g = lane / 4, t = lane % 4;
    const bool split = gridDim.z > 1;
    float* ws = y + (size_t)blockIdx.z * cout * n_total;
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
            const int n = n_base + 8 * j + 2 * t + e;
            if (n >= n_total) continue;
            const int b = n / howo, p = n - b * howo;
            float* yp = split ? ws + n : y + (size_t)b * y_bstride + p;
            const size_t m_step = split ? (size_t)n_total : (size_t)howo;
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int half = 0; half < 2; ++half) {
                    const int m = m_base + 16 * i + g + 8 * half;
                    if (m >= cout) continue;
                    float v = acc[i][j][2 * half + e];
                    if (!split) {
                        v += __ldg(bias + m);
                        if (relu) v = fmaxf(v, 0.f);
                    }
                    yp[m * m_step] = v;
                }
        }
}

// The cp.async ring of conv_mma_gemm and conv_nhwc_*.cu: load(k, stage) issues this thread's copies of the K tile that
// starts at k into buffer `stage`, math(stage) multiplies the tile in buffer `stage`. With STAGES buffers, tile
// t + STAGES - 1 is in flight while tile t is multiplied, one barrier per tile.
// ASYNC: math issues asynchronous reads of its buffer through the async proxy (wgmma) that may still run until the
// next tile's math returns. Each thread then fences its landed copies for the async proxy before the barrier, and
// the ring loads one tile less ahead (STAGES - 2), into the buffer of tile t - 2, whose reads the math of tile t - 1
// waited for. (With 3-4 stages that loses more than the overlap gains.)
// landed(stage), if given, runs in each thread once its own copies of the tile in `stage` have landed and before
// the barrier that lets everyone read them: a thread may rewrite its own pieces there (NhwcF32's split). It runs a
// tile ahead, off the chain of waits and barriers: tile 0's before the loop, tile t + 1's inside the math of tile t,
// which is then called as math(stage, ahead) and calls ahead() once it has issued its asynchronous work, so that the
// rewrite overlaps the tensor cores' work on tile t instead of lengthening every tile's chain of waits.
struct NoLanded {
    __device__ __forceinline__ void operator()(int) const {}
};
template <int STAGES, int BK, bool ASYNC = false, class Load, class Math, class Landed = NoLanded>
__device__ __forceinline__ void cp_async_ring(int k_begin, int k_end, Load&& load, Math&& math,
                                              Landed&& landed = Landed{}) {
    constexpr int AHEAD = ASYNC ? STAGES - 2 : STAGES - 1;  // tiles in flight behind the current one
    static_assert(AHEAD >= 1, "too few stages");
    const int tiles = (k_end - k_begin + BK - 1) / BK;
#pragma unroll
    for (int s = 0; s < AHEAD; ++s) {
        if (s < tiles) load(k_begin + s * BK, s);
        cp_async::commit();  // empty groups too: group i always holds tile i
    }
    // The buffers of tiles kt + AHEAD and kt, counted around the ring rather than taken modulo STAGES.
    int load_buf = AHEAD, math_buf = 0;
    constexpr bool LANDED = !std::is_same_v<std::decay_t<Landed>, NoLanded>;
    if constexpr (LANDED) {
        cp_async::wait<AHEAD - 1>();  // this thread's copies of tile 0 have landed
        landed(0);
    }
    for (int kt = 0; kt < tiles; ++kt) {
        cp_async::wait<AHEAD - 1>();  // this thread's copies of tile kt have landed ...
        if constexpr (ASYNC) wgmma::fence_proxy_async();
        __syncthreads();  // ... everyone's have, and everyone is done with tile kt - 1 (kt - 2 if ASYNC)
        if (kt + AHEAD < tiles) load(k_begin + (kt + AHEAD) * BK, load_buf);  // tile kt - 1's buffer (kt - 2 if ASYNC)
        cp_async::commit();
        const int next_buf = math_buf == STAGES - 1 ? 0 : math_buf + 1;
        if constexpr (LANDED) {
            math(math_buf, [&] {
                if (kt + 1 < tiles) {
                    cp_async::wait<AHEAD - 1>();  // this thread's copies of tile kt + 1 have landed
                    landed(next_buf);
                }
            });
        } else {
            math(math_buf);
        }
        load_buf = load_buf == STAGES - 1 ? 0 : load_buf + 1;
        math_buf = next_buf;
    }
}

template <class Op, int KH, int KW, int BM, int BN, int BK, int WARPS_M, int STAGES>
__device__ __forceinline__ void conv_mma_gemm(const float* __restrict__ x, const float* __restrict__ wt,
                                              const float* __restrict__ bias, float* __restrict__ y, int batch,
                                              int cin, int h, int w, int x_bstride, int cout, int ho, int wo,
                                              int y_bstride, int stride, int pad_h, int pad_w, int k_split,
                                              int relu) {
    constexpr int NT = 256, WARPS_N = NT / 32 / WARPS_M;
    constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;  // warp tile
    constexpr int MI = WM / 16, NJ = WN / 8;             // m16n8 fragments per warp
    constexpr int SA = BM + Op::PAD, SB = BN + Op::PAD;  // padded shared rows
    constexpr int A_VECS = BM / 4, A_ROWS = NT / A_VECS, A_LOADS = BK / A_ROWS;
    constexpr int B_STEP = NT / BN, B_LOADS = BK / B_STEP;
    constexpr int KHW = KH * KW;
    static_assert(WM % 16 == 0 && WN % 8 == 0 && BK % Op::K == 0, "warp tile of whole fragments");
    static_assert(NT % A_VECS == 0 && BK % A_ROWS == 0 && NT % BN == 0 && BK % B_STEP == 0, "loader shape");
    static_assert(SA % 4 == 0 && SB % 4 == 0, "16-byte aligned rows for the A copies");

    __shared__ __align__(16) float As[STAGES][BK][SA];
    __shared__ __align__(16) float Bs[STAGES][BK][SB];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int g = lane / 4, t = lane % 4;
    const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * WN;
    const int howo = ho * wo, n_total = batch * howo, hw = h * w;
    const int n0 = tile_n0(BN), m0 = tile_m0(BM);
    const int k_begin = blockIdx.z * k_split;
    const int k_end = min(cin * KHW, k_begin + k_split);

    // A loader: 4 consecutive columns a_m.. of the tile, rows a_k, a_k + A_ROWS, ...
    const int a_m = (tid % A_VECS) * 4, a_k = tid / A_VECS;
    const bool a_vec = cout % 4 == 0 && (reinterpret_cast<size_t>(wt) & 15) == 0;
    // B loader: output pixel b_n of the tile, rows b_k, b_k + B_STEP, ...
    const int b_n = tid % BN, b_k = tid / BN;
    const bool b_ok = n0 + b_n < n_total;
    const WindowOrigin win = b_ok ? window_origin(x, n0 + b_n, howo, wo, stride, pad_h, pad_w, x_bstride)
                                  : WindowOrigin{x, 0, 0};
    const int ih0 = win.ih0, iw0 = win.iw0;
    const float* xb = win.xb;

    auto load = [&](int kt, int stage) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int kl = a_k + i * A_ROWS, k = kt + kl, m = m0 + a_m;
            float* dst = &As[stage][kl][a_m];
            const float* src = wt + (size_t)k * cout + m;
            if (a_vec && k < k_end && m < cout) {
                cp_async::copy16(dst, src);
            } else {
#pragma unroll
                for (int e = 0; e < 4; ++e) {
                    const bool ok = k < k_end && m + e < cout;
                    cp_async::copy4(dst + e, ok ? src + e : wt, ok);
                }
            }
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int kl = b_k + i * B_STEP, k = kt + kl;
            const float* src = x;
            bool ok = b_ok && k < k_end;
            if (ok) {
                const int c = k / KHW, rs = k - c * KHW, r = rs / KW, s = rs - r * KW;
                const int ih = ih0 + r, iw = iw0 + s;
                ok = (unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w;
                if (ok) src = xb + (size_t)c * hw + ih * w + iw;
            }
            cp_async::copy4(&Bs[stage][kl][b_n], src, ok);
        }
    };

    float acc[MI][NJ][4];
    zero_acc(acc);

    cp_async_ring<STAGES, BK>(k_begin, k_end, load, [&](int st) {
#pragma unroll
        for (int kk = 0; kk < BK; kk += Op::K) {
            unsigned a[MI][4], b[NJ][2];
            Op::template frags<MI, NJ, SA, SB>(a, b, &As[st][kk][wm], &Bs[st][kk][wn], g, t);
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int j = 0; j < NJ; ++j) Op::mma(acc[i][j], a[i], b[j]);
        }
    });

    store_mma_tile<MI, NJ>(acc, bias, y, m0 + wm, n0 + wn, lane, cout, n_total, howo, y_bstride, relu);
}

#define CONV_MMA_PARAMS                                                                                             \
    const float *__restrict__ x, const float *__restrict__ wt, const float *__restrict__ bias, float *__restrict__ y, \
        int batch, int cin, int h, int w, int x_bstride, int cout, int ho, int wo, int y_bstride, int stride,       \
        int pad_h, int pad_w, int k_split, int relu
#define CONV_MMA_ARGS \
    x, wt, bias, y, batch, cin, h, w, x_bstride, cout, ho, wo, y_bstride, stride, pad_h, pad_w, k_split, relu

// One extern "C" entry point <PREFIX>_<KH>x<KW>_<BM>x<BN> per (kernel size, tile), named like conv.cu's.
// MIN_BLOCKS caps registers: 2 blocks of 256 threads leave 128 a thread for the 64x32 warp tile's 64 accumulators.
#define CONV_MMA_KERNEL(PREFIX, OP, KH, KW, BM, BN, BK, WARPS_M, STAGES, MIN_BLOCKS) \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS)                   \
        PREFIX##_##KH##x##KW##_##BM##x##BN(CONV_MMA_PARAMS) {                       \
        conv_mma_gemm<OP, KH, KW, BM, BN, BK, WARPS_M, STAGES>(CONV_MMA_ARGS);      \
    }
