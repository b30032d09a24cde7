// conv_f16.cu: 2-D convolution + bias + ReLU as an implicit GEMM on the tensor cores (fp16 multiply, fp32 sum).
//
// Same math, arguments (but for the weights), launch shape, tile names and split-K workspace as conv_tf32.cu
// (`--precision fp16`): y[b, m, oh, ow] = relu(bias[m] + sum_{c, r, s} w[m, c, r, s] * x[b, c, oh*S - PH + r,
// ow*S - PW + s]) as C[M, N] = A[M, K] B[K, N], M = Cout, N = batch*Ho*Wo, K = Cin*KH*KW in (c, r, s) order.
// Activations stay float32 in memory; the weights are uploaded as IEEE binary16, w16[M][K8] (K8 = K rounded up to a
// multiple of 8, zero-filled, so that every row is whole 16-byte pieces: cuda.params.direct_weights). Activations
// are rounded to fp16 (to nearest, ties to even) as they are staged, products are exact in the fp32 sums, so the
// error is ~1e-3 relative, as TF32's (both keep 10 mantissa bits).
//
// Idea: keep the tensor cores fed with as few instructions per mma as possible.
// - Shared tiles hold fp16, row-major along K: As[m][k], Bs[n][k], 32 k per stage. Rows are padded to 40 halves
//   (80 bytes), so the 8 rows of any 8 consecutive m or n start in 8 distinct 16-byte bank groups (80 r mod 128,
//   r = 0..7): ldmatrix phases and the B loader's 16-byte stores are conflict-free.
// - Fragments come from ldmatrix.x4 (PTX ISA, "Warp-level matrix load instruction: ldmatrix"): lane l gives the
//   address of row l % 8 of matrix l / 8 and receives in register j row l / 4, halves 2(l % 4) and 2(l % 4) + 1,
//   of matrix j, which is exactly the m16n8k16 .f16 fragment layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//     A 16x16 (row): a0 = A[g][2t, 2t+1], a1 = A[g+8][2t..], a2 = A[g][2t+8..], a3 = A[g+8][2t+8..]
//     B 16x8 (col):  b0 = B[2t, 2t+1][g], b1 = B[2t+8, 2t+9][g]     (g = lane / 4, t = lane % 4)
//   so A's four matrices are (rows 0-7 | 8-15) x (k 0-7 | 8-15) and one x4 on Bs gives two n8 fragments. Per k16 a
//   warp with an MI x NJ grid of m16n8 tiles issues MI + NJ/2 ldmatrix for MI*NJ mma (64x32 warp tile: 6 for 16).
// - A (fp16 weights) travels global -> shared by cp.async in 16-byte pieces, zero-filled past M and the K slice.
//   B (the im2col gather from x, one element at a time, since neighbouring k of one pixel are not adjacent in x)
//   goes through registers: each thread owns one output pixel of the tile and B_K consecutive k, loads them for tile
//   t+1 before the math of tile t, and after it rounds pairs to fp16 (cvt.rn.f16x2.f32) and stores them as 16-byte
//   rows into the other buffer: two stages, one barrier per tile. Consecutive threads own consecutive pixels, so
//   each load instruction of a warp reads 32 consecutive floats of one channel row.
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split) (k_split a multiple of 32); with several slices
// the raw sums go to the workspace ws[z][M][N] for conv.cu's conv_splitk_reduce, with one the epilogue adds bias,
// applies ReLU, writes y. Views: as conv.cu (x, y point at channel 0 of the view in batch item 0; item b starts
// *_bstride floats later).
//
// Launch: conv_f16_<KH>x<KW>_<BM>x<BN>: block 256, grid (ceil(N/BN), ceil(M/BM), splits), static shared memory
//         only. Tiles: 128x128 (warp 64x32, 40 KB), 128x64 (warp 32x32, 30 KB), 64x64 (warp 32x16, 20 KB).
#include "conv_mma.cuh"

template <int KH, int KW, int BM, int BN, int WARPS_M>
__device__ __forceinline__ void conv_f16_gemm(const float* __restrict__ x, const unsigned short* __restrict__ w16,
                                              const float* __restrict__ bias, float* __restrict__ y, int batch,
                                              int cin, int h, int w, int x_bstride, int cout, int ho, int wo,
                                              int y_bstride, int stride, int pad_h, int pad_w, int k_split,
                                              int relu) {
    constexpr int NT = 256, BK = 32, ROW = BK + 8;  // threads; k per stage; halves per shared row
    constexpr int WARPS_N = NT / 32 / WARPS_M, WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MI = WM / 16, NJ = WN / 8;  // m16n8 tiles per warp
    constexpr int A_PIECES = BM * BK / 8 / NT;  // 16-byte pieces of the A tile per thread
    constexpr int B_K = BK * BN / NT;  // k of one pixel per thread in the B tile
    constexpr int KHW = KH * KW;
    static_assert(WM % 16 == 0 && NJ % 2 == 0 && NT % BN == 0 && B_K % 8 == 0 && BM * BK % (8 * NT) == 0,
                  "tile shape");

    __shared__ __align__(16) unsigned short As[2][BM][ROW];
    __shared__ __align__(16) unsigned short Bs[2][BN][ROW];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * WN;
    const int howo = ho * wo, n_total = batch * howo, hw = h * w;
    const int k_total = cin * KHW, k8 = (k_total + 7) & ~7;
    const int n0 = tile_n0(BN), m0 = tile_m0(BM);
    const int k_begin = blockIdx.z * k_split;
    const int k_end = min(k_total, k_begin + k_split);

    auto load_a = [&](int kt, int stage) {
#pragma unroll
        for (int i = 0; i < A_PIECES; ++i) {
            const int piece = tid + i * NT, m = piece / (BK / 8), kl = piece % (BK / 8) * 8;
            const int k = kt + kl;
            const bool ok = m0 + m < cout && k < k_end;  // a piece straddling K's end reads the zero fill of w16
            cp_async::copy16_or_zero(&As[stage][m][kl], ok ? w16 + (size_t)(m0 + m) * k8 + k : w16, ok);
        }
    };

    // B loader: output pixel b_n of the tile, k b_k .. b_k + B_K - 1 of each stage.
    const int b_n = tid % BN, b_k = tid / BN * B_K;
    const bool b_ok = n0 + b_n < n_total;
    const WindowOrigin win = b_ok ? window_origin(x, n0 + b_n, howo, wo, stride, pad_h, pad_w, x_bstride)
                                  : WindowOrigin{x, 0, 0};
    float breg[B_K];
    auto fetch_b = [&](int kt) {
#pragma unroll
        for (int e = 0; e < B_K; ++e) {
            const int k = kt + b_k + e;
            const int c = k / KHW, rs = k - c * KHW, r = rs / KW, s = rs - r * KW;
            const int ih = win.ih0 + r, iw = win.iw0 + s;
            const bool ok = b_ok && k < k_end && (unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w;
            breg[e] = ok ? __ldg(win.xb + (size_t)c * hw + ih * w + iw) : 0.f;
        }
    };
    auto store_b = [&](int stage) {
#pragma unroll
        for (int q = 0; q < B_K / 8; ++q) {
            const float* v = breg + 8 * q;
            *reinterpret_cast<uint4*>(&Bs[stage][b_n][b_k + 8 * q]) =
                uint4{f16::pack(v[0], v[1]), f16::pack(v[2], v[3]), f16::pack(v[4], v[5]), f16::pack(v[6], v[7])};
        }
    };

    float acc[MI][NJ][4];
    zero_acc(acc);

    // This lane's ldmatrix rows: A matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15); B matrices (n 0-7, k 0-7),
    // (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15), i.e. b0, b1 of n8 fragment 2jj, then of 2jj + 1.
    const int a_row = wm + lane % 16, a_col = lane / 16 * 8;
    const int b_row = wn + lane % 8 + lane / 16 * 8, b_col = lane / 8 % 2 * 8;

    const int tiles = (k_end - k_begin + BK - 1) / BK;
    if (tiles > 0) {
        load_a(k_begin, 0);
        cp_async::commit();
        fetch_b(k_begin);
        store_b(0);
    }
    cp_async::wait<0>();
    __syncthreads();
    for (int kt = 0; kt < tiles; ++kt) {
        const int st = kt % 2;
        const bool more = kt + 1 < tiles;
        if (more) {  // into the other buffer, which every warp finished reading before the last barrier
            load_a(k_begin + (kt + 1) * BK, st ^ 1);
            cp_async::commit();
            fetch_b(k_begin + (kt + 1) * BK);
        }
#pragma unroll
        for (int kk = 0; kk < BK; kk += 16) {
            unsigned b[NJ][2];
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                ldmatrix_b_pair(b[2 * jj], b[2 * jj + 1], &Bs[st][b_row + 16 * jj][kk + b_col]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                unsigned a[4];
                ldmatrix::x4(a, &As[st][a_row + 16 * i][kk + a_col]);
#pragma unroll
                for (int j = 0; j < NJ; ++j) f16::mma(acc[i][j], a, b[j]);
            }
        }
        if (more) store_b(st ^ 1);
        cp_async::wait<0>();
        __syncthreads();
    }

    store_mma_tile<MI, NJ>(acc, bias, y, m0 + wm, n0 + wn, lane, cout, n_total, howo, y_bstride, relu);
}

// One extern "C" entry point per (kernel size, tile). MIN_BLOCKS caps registers: 2 blocks of 256 threads leave 128
// a thread for the 64x32 warp tile's 64 accumulators and the 16 staged B values.
#define CONV_F16_KERNEL(KH, KW, BM, BN, WARPS_M, MIN_BLOCKS)                                                    \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) conv_f16_##KH##x##KW##_##BM##x##BN(          \
        const float* __restrict__ x, const unsigned short* __restrict__ w16, const float* __restrict__ bias,     \
        float* __restrict__ y, int batch, int cin, int h, int w, int x_bstride, int cout, int ho, int wo,        \
        int y_bstride, int stride, int pad_h, int pad_w, int k_split, int relu) {                               \
        conv_f16_gemm<KH, KW, BM, BN, WARPS_M>(x, w16, bias, y, batch, cin, h, w, x_bstride, cout, ho, wo,       \
                                               y_bstride, stride, pad_h, pad_w, k_split, relu);                  \
    }

#define CONV_F16_TILES(KH, KW)                \
    CONV_F16_KERNEL(KH, KW, 128, 128, 2, 2)   \
    CONV_F16_KERNEL(KH, KW, 128, 64, 4, 2)    \
    CONV_F16_KERNEL(KH, KW, 64, 64, 2, 3)

IE_FOR_EACH_CONV_SHAPE(CONV_F16_TILES)
