// winograd.cu: stride-1 convolution + bias + ReLU by Winograd's minimal filtering, fp32, NCHW: F(MxM, 3x3),
// F(MxM, 5x5) and the 1-D F(M, 7) of the 1x7 and 7x1 kernels.
//
// Computes the same y[b, o, oh, ow] = relu(bias[o] + sum_{c, r, s} w[o, c, r, s] * x[b, c, oh - PH + r, ow - PW + s])
// as conv.cu's kernels at stride 1, with NH NW / (KH KW MH MW) of the multiplies: 0.25x for F(4x4, 3x3), 0.44x for
// F(2x2, 3x3), 0.36x for F(2x2, 5x5), 0.43x for F(3, 7).
//
// Idea: the "non-fused" scheme of Lavin & Gray 2016 ("Fast Algorithms for Convolutional Neural Networks",
// section 4): cut every output map into MH x MW tiles; tile t of image b needs the NH x NW input patch d
// (NH = MH + KH - 1, NW = MW + KW - 1) whose corner is (ty*MH - PH, tx*MW - PW). With the Toom-Cook matrices of
// F(M, K) along each axis the kernel extends in, BT (N x N), G (N x K), AT (M x N) (built by
// numpy_primitives.winograd_matrices and uploaded by the backend; nothing here hard-codes them), and the 1 x 1
// identity along an axis where it has one tap (MH = KH = NH = 1 for 1x7, MW = KW = NW = 1 for 7x1)
//     y_tile = AT_h [ sum_c U[c] (.) V[c] ] AT_w^T,   U[c] = G_h w[o, c] G_w^T,   V[c] = BT_h d[c] BT_w^T,
// and for each of the NH*NW positions xi the sum over c is a matrix product M[xi] = U[xi] V[xi] over O x C x T
// (T = batch * tiles). Square kernels use the same F(M, K) along both axes, so one BT and one AT describe every
// variant. Three kernels:
//   wino_input_<K>_F<M>:  one thread per (c, t): gathers d (zero outside the image: padding and the ragged edge),
//                     writes V[xi][c][t] for every xi (coalesced along t).
//   wino_gemm_<BM>x<BN>: NH*NW independent GEMMs M[xi][O][Tp] = U[xi]^T V[xi], U stored [xi][C][Op] (the
//                     weights, transformed on the host in float64, rounded once, padded with zero columns to Op),
//                     V [xi][C][Tp]. Split-K (_slices): blockIdx.z = s * NH*NW + xi sums only the channel slice
//                     [s * k_split, (s + 1) * k_split) into its own copy M_s (M_s[xi] at (s * NH*NW + xi) * O * Tp):
//                     at batch 1 and 8 a layer has too few tiles to fill the SMs, and each block's serial K loop
//                     is what the layer waits for. Both operands are dense rows along O and T padded to whole
//                     tiles, so every global load and store is one float4 with no bounds check along O or T (only
//                     along C). Tiling as conv.cu, the same main loop (ffma_gemm.cuh): a block computes BM x BN,
//                     a thread TM x TN from float4 shared-memory reads, the next BK slice loaded to registers
//                     during the math, one barrier per slice. It does not know the kernel shape: every variant
//                     shares it.
//   wino_output_<K>_F<M>: one thread per (o, t): reads M[xi][o][t] for every xi, y_tile = AT M AT^T + bias,
//                     ReLU, written where inside the output map, into a channel-slice view (y_bstride as conv.cu).
//                     The _slices version (split-K) reads the sum of the copies M_0 + M_1 + ..., in that order, so
//                     the result does not depend on scheduling and the reduction costs no launch of its own. It is
//                     a separate entry point, as wino_gemm's _slices version: the general code cost the plain
//                     case (batch 32 and 128, one slice) measurable time.
// Columns t >= T of V (the padding up to Tp) are never written; what the GEMM makes of them lands in columns of M
// that the output transform never reads.
//
// Launch: wino_input_*:  block 256, grid ceil(C*T / 256).
//         wino_gemm_<BM>x<BN>: block 256, grid (Tp / BN, Op / BM, NH*NW * splits); Tp and Op multiples of BN and
//                     BM, k_split a multiple of BK.
//         wino_output_*: block 256, grid ceil(O*T / 256).
#include "common.cuh"
#include "ffma_gemm.cuh"

// out = A in, A the R x K top-left of a; the identity when K == 1 (an axis the kernel does not extend in).
template <int R, int K, int C, int AR, int AC>
__device__ __forceinline__ void mul_left(float (&out)[R][C], const float (&a)[AR][AC], const float (&in)[K][C]) {
#pragma unroll
    for (int i = 0; i < R; ++i)
#pragma unroll
        for (int j = 0; j < C; ++j) {
            if constexpr (K == 1) {
                out[i][j] = in[0][j];
            } else {
                float s = 0.f;
#pragma unroll
                for (int k = 0; k < K; ++k) s = fmaf(a[i][k], in[k][j], s);
                out[i][j] = s;
            }
        }
}

// s + (in A^T)[i][j], A's rows of length K as above (the identity when K == 1).
template <int K, int R, int AR, int AC>
__device__ __forceinline__ float dot_right(float s, const float (&in)[R][K], const float (&a)[AR][AC], int i,
                                           int j) {
    if constexpr (K == 1) {
        return s + in[i][0];
    } else {
#pragma unroll
        for (int k = 0; k < K; ++k) s = fmaf(in[i][k], a[j][k], s);
        return s;
    }
}

// Tile geometry of F(MH x MW, KH x KW): square kernels have one transform size N, 1-D ones N along their axis.
template <int MH, int MW, int KH, int KW>
struct WinoTile {
    static constexpr int NH = MH + KH - 1, NW = MW + KW - 1;
    static constexpr int M = MH > MW ? MH : MW, N = NH > NW ? NH : NW;
    static_assert((NH == N || NH == 1) && (NW == N || NW == 1) && (MH == M || MH == 1) && (MW == M || MW == 1),
                  "one F(M, K) along each axis the kernel extends in");
};

// V[xi][c][t] = (BT_h d BT_w^T)[xi] for the patch of channel c under tile t; bt is N x N, row-major.
template <int MH, int MW, int KH, int KW>
__device__ __forceinline__ void wino_input(const float* __restrict__ x, const float* __restrict__ bt,
                                           float* __restrict__ v, int batch, int cin, int h, int w, int x_bstride,
                                           int tiles_h, int tiles_w, int t_pad, int pad_h, int pad_w) {
    using T = WinoTile<MH, MW, KH, KW>;
    constexpr int N = T::N, NH = T::NH, NW = T::NW;
    const int per_image = tiles_h * tiles_w, t_total = batch * per_image;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cin * t_total) return;
    const int c = idx / t_total, t = idx - c * t_total;
    const int b = t / per_image, p = t - b * per_image, ty = p / tiles_w, tx = p - ty * tiles_w;
    const int ih0 = ty * MH - pad_h, iw0 = tx * MW - pad_w;
    const float* xc = x + (size_t)b * x_bstride + (size_t)c * h * w;

    float d[NH][NW];
#pragma unroll
    for (int i = 0; i < NH; ++i)
#pragma unroll
        for (int j = 0; j < NW; ++j) {
            const int ih = ih0 + i, iw = iw0 + j;
            d[i][j] = ((unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w) ? __ldg(xc + ih * w + iw) : 0.f;
        }
    float bm[N][N];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) bm[i][j] = __ldg(bt + i * N + j);
    float r[NH][NW];  // BT_h d
    mul_left(r, bm, d);
    float* out = v + (size_t)c * t_pad + t;
    const size_t xi_step = (size_t)cin * t_pad;
#pragma unroll
    for (int i = 0; i < NH; ++i)
#pragma unroll
        for (int j = 0; j < NW; ++j) out[(i * NW + j) * xi_step] = dot_right(0.f, r, bm, i, j);
}

template <int BM, int BN, int BK, int TM, int TN, bool SLICES>
__device__ __forceinline__ void wino_gemm(const float* __restrict__ u, const float* __restrict__ v,
                                          float* __restrict__ mo, int cin, int cout, int o_pad, int t_pad, int nn,
                                          int k_split) {
    constexpr int NT = (BM / TM) * (BN / TN);  // threads
    constexpr int TX = BN / TN;                // threads along T
    constexpr int A_VECS = BK * BM / 4, B_VECS = BK * BN / 4;  // float4s per shared-memory stage
    constexpr int A_LOADS = (A_VECS + NT - 1) / NT, B_LOADS = (B_VECS + NT - 1) / NT;
    constexpr int M_RUNS = TM / 4, N_RUNS = TN / 4;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are read as float4 runs");
    static_assert(A_VECS % NT == 0 || A_VECS < NT, "A loader shape");
    static_assert(B_VECS % NT == 0 || B_VECS < NT, "B loader shape");

    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];

    const int tid = threadIdx.x, xi = SLICES ? blockIdx.z % nn : blockIdx.z;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int k_begin = SLICES ? blockIdx.z / nn * k_split : 0;
    const int k_end = SLICES ? min(cin, k_begin + k_split) : cin;
    const float* a_src = u + (size_t)xi * cin * o_pad + m0;
    const float* b_src = v + (size_t)xi * cin * t_pad + n0;
    const float4 zero = {0.f, 0.f, 0.f, 0.f};

    float4 ra[A_LOADS], rb[B_LOADS];
    auto load = [&](int kt) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int e = tid + i * NT, k = kt + e / (BM / 4), col = e % (BM / 4) * 4;
            ra[i] = (e < A_VECS && k < k_end) ? __ldg(reinterpret_cast<const float4*>(a_src + (size_t)k * o_pad + col))
                                            : zero;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int e = tid + i * NT, k = kt + e / (BN / 4), col = e % (BN / 4) * 4;
            rb[i] = (e < B_VECS && k < k_end) ? __ldg(reinterpret_cast<const float4*>(b_src + (size_t)k * t_pad + col))
                                            : zero;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int e = tid + i * NT;
            if (e < A_VECS) *reinterpret_cast<float4*>(&As[buf][e / (BM / 4)][e % (BM / 4) * 4]) = ra[i];
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int e = tid + i * NT;
            if (e < B_VECS) *reinterpret_cast<float4*>(&Bs[buf][e / (BN / 4)][e % (BN / 4) * 4]) = rb[i];
        }
    };

    const int tx = tid % TX, ty = tid / TX;
    float acc[TM][TN];
    ffma_main_loop<BM, BN, BK, TM, TN>(acc, As, Bs, tx, ty, k_begin, k_end, load, store);

    float* out = mo + (size_t)blockIdx.z * cout * t_pad;
#pragma unroll
    for (int i = 0; i < TM; ++i) {
        const int m = m0 + (i / 4) * (BM / M_RUNS) + ty * 4 + i % 4;
        if (m >= cout) continue;
#pragma unroll
        for (int run = 0; run < N_RUNS; ++run) {
            const int n = n0 + run * (BN / N_RUNS) + tx * 4;
            const float4 q = {acc[i][run * 4 + 0], acc[i][run * 4 + 1], acc[i][run * 4 + 2], acc[i][run * 4 + 3]};
            *reinterpret_cast<float4*>(out + (size_t)m * t_pad + n) = q;
        }
    }
}

// y tile of (o, t) = AT_h M[.][o][t] AT_w^T + bias[o] (ReLU), at its place in the output view; at is M x N.
template <int MH, int MW, int KH, int KW, bool SLICES>
__device__ __forceinline__ void wino_output(const float* __restrict__ mi, const float* __restrict__ at,
                                            const float* __restrict__ bias, float* __restrict__ y, int batch,
                                            int cout, int ho, int wo, int y_bstride, int tiles_h, int tiles_w,
                                            int t_pad, int splits, int relu) {
    using T = WinoTile<MH, MW, KH, KW>;
    constexpr int M = T::M, N = T::N, NH = T::NH, NW = T::NW;
    const int per_image = tiles_h * tiles_w, t_total = batch * per_image;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cout * t_total) return;
    const int o = idx / t_total, t = idx - o * t_total;
    const int b = t / per_image, p = t - b * per_image, ty = p / tiles_w, tx = p - ty * tiles_w;

    const float* src = mi + (size_t)o * t_pad + t;
    const size_t xi_step = (size_t)cout * t_pad, slice_step = NH * NW * xi_step;
    float mm[NH][NW];
#pragma unroll
    for (int i = 0; i < NH; ++i)
#pragma unroll
        for (int j = 0; j < NW; ++j) mm[i][j] = src[(i * NW + j) * xi_step];
    if constexpr (SLICES) {
        for (int s = 1; s < splits; ++s)
#pragma unroll
            for (int i = 0; i < NH; ++i)
#pragma unroll
                for (int j = 0; j < NW; ++j) mm[i][j] += src[s * slice_step + (i * NW + j) * xi_step];
    }
    float am[M][N];
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) am[i][j] = __ldg(at + i * N + j);
    float r[MH][NW];  // AT_h M
    mul_left(r, am, mm);
    const float bo = __ldg(bias + o);
    float* yo = y + (size_t)b * y_bstride + (size_t)o * ho * wo;
#pragma unroll
    for (int i = 0; i < MH; ++i) {
        const int oh = ty * MH + i;
        if (oh >= ho) continue;
#pragma unroll
        for (int j = 0; j < MW; ++j) {
            const int ow = tx * MW + j;
            if (ow >= wo) continue;
            const float s = dot_right(bo, r, am, i, j);
            yo[oh * wo + ow] = relu ? fmaxf(s, 0.f) : s;
        }
    }
}

// NAME: <KH>x<KW>_F<M>, the names cuda.kernels.wino_kernel_names makes.
#define WINO_TRANSFORMS(NAME, MH, MW, KH, KW)                                                                    \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                     \
        wino_input_##NAME(const float* __restrict__ x, const float* __restrict__ bt, float* __restrict__ v,      \
                          int batch, int cin, int h, int w, int x_bstride, int tiles_h, int tiles_w, int t_pad,  \
                          int pad_h, int pad_w) {                                                                \
        wino_input<MH, MW, KH, KW>(x, bt, v, batch, cin, h, w, x_bstride, tiles_h, tiles_w, t_pad, pad_h, pad_w); \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                     \
        wino_output_##NAME(const float* __restrict__ mi, const float* __restrict__ at,                           \
                           const float* __restrict__ bias, float* __restrict__ y, int batch, int cout, int ho,   \
                           int wo, int y_bstride, int tiles_h, int tiles_w, int t_pad, int splits, int relu) {   \
        wino_output<MH, MW, KH, KW, false>(mi, at, bias, y, batch, cout, ho, wo, y_bstride, tiles_h, tiles_w,    \
                                           t_pad, splits, relu);                                                 \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                     \
        wino_output_##NAME##_slices(const float* __restrict__ mi, const float* __restrict__ at,                  \
                                    const float* __restrict__ bias, float* __restrict__ y, int batch, int cout,  \
                                    int ho, int wo, int y_bstride, int tiles_h, int tiles_w, int t_pad,          \
                                    int splits, int relu) {                                                      \
        wino_output<MH, MW, KH, KW, true>(mi, at, bias, y, batch, cout, ho, wo, y_bstride, tiles_h, tiles_w,     \
                                          t_pad, splits, relu);                                                  \
    }

// cuda.winograd.WINO_VARIANTS lists these (kernel shape -> output tiles).
WINO_TRANSFORMS(3x3_F2, 2, 2, 3, 3)
WINO_TRANSFORMS(3x3_F4, 4, 4, 3, 3)
WINO_TRANSFORMS(5x5_F2, 2, 2, 5, 5)
WINO_TRANSFORMS(1x7_F3, 1, 3, 1, 7)
WINO_TRANSFORMS(7x1_F3, 3, 1, 7, 1)

// The GEMM tiles (the same shapes as conv.cu's; cuda.tiles.WINO_TILES lists them). MIN_BLOCKS caps registers.
// _slices: split-K (grid.z = positions x slices); the plain one (one slice) has no slice arithmetic, which makes the
// whole batch-128 forward a few per cent faster than the general kernel would.
#define WINO_GEMM(BM, BN, BK, TM, TN, MIN_BLOCKS)                                                                  \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)                               \
        wino_gemm_##BM##x##BN(const float* __restrict__ u, const float* __restrict__ v, float* __restrict__ mo,    \
                              int cin, int cout, int o_pad, int t_pad, int nn, int k_split) {                     \
        wino_gemm<BM, BN, BK, TM, TN, false>(u, v, mo, cin, cout, o_pad, t_pad, nn, k_split);                     \
    }                                                                                                             \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)                               \
        wino_gemm_##BM##x##BN##_slices(const float* __restrict__ u, const float* __restrict__ v,                   \
                                       float* __restrict__ mo, int cin, int cout, int o_pad, int t_pad, int nn,   \
                                       int k_split) {                                                             \
        wino_gemm<BM, BN, BK, TM, TN, true>(u, v, mo, cin, cout, o_pad, t_pad, nn, k_split);                      \
    }

WINO_GEMM(128, 128, 8, 8, 8, 2)
WINO_GEMM(64, 64, 16, 4, 4, 4)
WINO_GEMM(32, 128, 8, 4, 4, 4)
