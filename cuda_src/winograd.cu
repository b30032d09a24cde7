// winograd.cu: stride-1 3x3 convolution + bias + ReLU by Winograd's minimal filtering F(MxM, 3x3), fp32, NCHW.
//
// Computes the same y[b, o, oh, ow] = relu(bias[o] + sum_{c, r, s} w[o, c, r, s] * x[b, c, oh - PH + r, ow - PW + s])
// as conv.cu's conv_3x3 kernels at stride 1, with (M + 2)^2 / (9 M^2) of the multiplies: 0.25x for F(4x4, 3x3),
// 0.44x for F(2x2, 3x3).
//
// Idea: the "non-fused" scheme of Lavin & Gray 2016 ("Fast Algorithms for Convolutional Neural Networks",
// section 4): cut every output map into M x M tiles; tile t of image b needs the N x N input patch d (N = M + 2)
// whose corner is (ty*M - PH, tx*M - PW). With the Toom-Cook matrices BT (N x N), G (N x 3), AT (M x N) (built by
// numpy_backend.winograd_matrices and uploaded by the backend; nothing here hard-codes them)
//     y_tile = AT [ sum_c U[c] (.) V[c] ] AT^T,   U[c] = G w[o, c] G^T,   V[c] = BT d[c] BT^T,
// and for each of the N*N positions xi the sum over c is a matrix product M[xi] = U[xi] V[xi] over O x C x T
// (T = batch * tiles). Three kernels:
//   wino_input_F<M>:  one thread per (c, t): gathers d (zero outside the image: padding and the ragged edge),
//                     writes V[xi][c][t] for every xi (coalesced along t).
//   wino_gemm_<BM>x<BN>: grid.z = N*N independent GEMMs M[xi][O][Tp] = U[xi]^T V[xi], U stored [xi][C][Op] (the
//                     weights, transformed on the host in float64, rounded once, padded with zero columns to Op),
//                     V [xi][C][Tp]. Both operands are dense rows along O and T padded to whole tiles, so every
//                     global load and store is one float4 with no bounds check along O or T (only along C). Tiling
//                     as conv.cu: a block computes BM x BN, a thread TM x TN from float4 shared-memory reads, the
//                     next BK slice loaded to registers during the math, one barrier per slice.
//   wino_output_F<M>: one thread per (o, t): reads M[xi][o][t] for every xi, y_tile = AT M AT^T + bias, ReLU,
//                     written where inside the output map, into a channel-slice view (y_bstride as conv.cu).
// Columns t >= T of V (the padding up to Tp) are never written; what the GEMM makes of them lands in columns of M
// that the output transform never reads.
//
// Launch: wino_input_F<M>:  block 256, grid ceil(C*T / 256).
//         wino_gemm_<BM>x<BN>: block 256, grid (Tp / BN, Op / BM, N*N); Tp and Op multiples of BN and BM.
//         wino_output_F<M>: block 256, grid ceil(O*T / 256).
#include "common.cuh"

// V[xi][c][t] = (BT d BT^T)[xi] for the patch of channel c under tile t; bt is N x N, row-major.
template <int M>
__device__ __forceinline__ void wino_input(const float* __restrict__ x, const float* __restrict__ bt,
                                           float* __restrict__ v, int batch, int cin, int h, int w, int x_bstride,
                                           int tiles_h, int tiles_w, int t_pad, int pad_h, int pad_w) {
    constexpr int N = M + 2;
    const int per_image = tiles_h * tiles_w, t_total = batch * per_image;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cin * t_total) return;
    const int c = idx / t_total, t = idx - c * t_total;
    const int b = t / per_image, p = t - b * per_image, ty = p / tiles_w, tx = p - ty * tiles_w;
    const int ih0 = ty * M - pad_h, iw0 = tx * M - pad_w;
    const float* xc = x + (size_t)b * x_bstride + (size_t)c * h * w;

    float d[N][N];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            const int ih = ih0 + i, iw = iw0 + j;
            d[i][j] = ((unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w) ? __ldg(xc + ih * w + iw) : 0.f;
        }
    float bm[N][N];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) bm[i][j] = __ldg(bt + i * N + j);
    float r[N][N];  // BT d
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < N; ++k) s = fmaf(bm[i][k], d[k][j], s);
            r[i][j] = s;
        }
    float* out = v + (size_t)c * t_pad + t;
    const size_t xi_step = (size_t)cin * t_pad;
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < N; ++k) s = fmaf(r[i][k], bm[j][k], s);
            out[(i * N + j) * xi_step] = s;
        }
}

template <int BM, int BN, int BK, int TM, int TN>
__device__ __forceinline__ void wino_gemm(const float* __restrict__ u, const float* __restrict__ v,
                                          float* __restrict__ mo, int cin, int cout, int o_pad, int t_pad) {
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

    const int tid = threadIdx.x, xi = blockIdx.z;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const float* a_src = u + (size_t)xi * cin * o_pad + m0;
    const float* b_src = v + (size_t)xi * cin * t_pad + n0;
    const float4 zero = {0.f, 0.f, 0.f, 0.f};

    float4 ra[A_LOADS], rb[B_LOADS];
    auto load = [&](int kt) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int e = tid + i * NT, k = kt + e / (BM / 4), col = e % (BM / 4) * 4;
            ra[i] = (e < A_VECS && k < cin) ? __ldg(reinterpret_cast<const float4*>(a_src + (size_t)k * o_pad + col))
                                            : zero;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int e = tid + i * NT, k = kt + e / (BN / 4), col = e % (BN / 4) * 4;
            rb[i] = (e < B_VECS && k < cin) ? __ldg(reinterpret_cast<const float4*>(b_src + (size_t)k * t_pad + col))
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
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;

    load(0);
    store(0);
    __syncthreads();
    int buf = 0;
    for (int kt = 0; kt < cin; kt += BK) {
        const bool more = kt + BK < cin;
        if (more) load(kt + BK);
#pragma unroll
        for (int kk = 0; kk < BK; ++kk) {
            float a[TM], b[TN];
#pragma unroll
            for (int run = 0; run < M_RUNS; ++run) {
                const float4 q = *reinterpret_cast<const float4*>(&As[buf][kk][run * (BM / M_RUNS) + ty * 4]);
                a[run * 4 + 0] = q.x; a[run * 4 + 1] = q.y; a[run * 4 + 2] = q.z; a[run * 4 + 3] = q.w;
            }
#pragma unroll
            for (int run = 0; run < N_RUNS; ++run) {
                const float4 q = *reinterpret_cast<const float4*>(&Bs[buf][kk][run * (BN / N_RUNS) + tx * 4]);
                b[run * 4 + 0] = q.x; b[run * 4 + 1] = q.y; b[run * 4 + 2] = q.z; b[run * 4 + 3] = q.w;
            }
#pragma unroll
            for (int i = 0; i < TM; ++i)
#pragma unroll
                for (int j = 0; j < TN; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
        }
        if (more) store(buf ^ 1);
        __syncthreads();
        buf ^= 1;
    }

    float* out = mo + (size_t)xi * cout * t_pad;
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

// y tile of (o, t) = AT M[.][o][t] AT^T + bias[o] (ReLU), at its place in the output view; at is M x N, row-major.
template <int M>
__device__ __forceinline__ void wino_output(const float* __restrict__ mi, const float* __restrict__ at,
                                            const float* __restrict__ bias, float* __restrict__ y, int batch,
                                            int cout, int ho, int wo, int y_bstride, int tiles_h, int tiles_w,
                                            int t_pad, int relu) {
    constexpr int N = M + 2;
    const int per_image = tiles_h * tiles_w, t_total = batch * per_image;
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cout * t_total) return;
    const int o = idx / t_total, t = idx - o * t_total;
    const int b = t / per_image, p = t - b * per_image, ty = p / tiles_w, tx = p - ty * tiles_w;

    const float* src = mi + (size_t)o * t_pad + t;
    const size_t xi_step = (size_t)cout * t_pad;
    float mm[N][N];
#pragma unroll
    for (int i = 0; i < N; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) mm[i][j] = src[(i * N + j) * xi_step];
    float am[M][N];
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) am[i][j] = __ldg(at + i * N + j);
    float r[M][N];  // AT M
#pragma unroll
    for (int i = 0; i < M; ++i)
#pragma unroll
        for (int j = 0; j < N; ++j) {
            float s = 0.f;
#pragma unroll
            for (int k = 0; k < N; ++k) s = fmaf(am[i][k], mm[k][j], s);
            r[i][j] = s;
        }
    const float bo = __ldg(bias + o);
    float* yo = y + (size_t)b * y_bstride + (size_t)o * ho * wo;
#pragma unroll
    for (int i = 0; i < M; ++i) {
        const int oh = ty * M + i;
        if (oh >= ho) continue;
#pragma unroll
        for (int j = 0; j < M; ++j) {
            const int ow = tx * M + j;
            if (ow >= wo) continue;
            float s = bo;
#pragma unroll
            for (int k = 0; k < N; ++k) s = fmaf(r[i][k], am[j][k], s);
            yo[oh * wo + ow] = relu ? fmaxf(s, 0.f) : s;
        }
    }
}

#define WINO_TRANSFORMS(M)                                                                                       \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                     \
        wino_input_F##M(const float* __restrict__ x, const float* __restrict__ bt, float* __restrict__ v,        \
                        int batch, int cin, int h, int w, int x_bstride, int tiles_h, int tiles_w, int t_pad,    \
                        int pad_h, int pad_w) {                                                                  \
        wino_input<M>(x, bt, v, batch, cin, h, w, x_bstride, tiles_h, tiles_w, t_pad, pad_h, pad_w);             \
    }                                                                                                            \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                     \
        wino_output_F##M(const float* __restrict__ mi, const float* __restrict__ at,                             \
                         const float* __restrict__ bias, float* __restrict__ y, int batch, int cout, int ho,     \
                         int wo, int y_bstride, int tiles_h, int tiles_w, int t_pad, int relu) {                 \
        wino_output<M>(mi, at, bias, y, batch, cout, ho, wo, y_bstride, tiles_h, tiles_w, t_pad, relu);          \
    }

WINO_TRANSFORMS(2)
WINO_TRANSFORMS(4)

// The GEMM tiles (the same shapes as conv.cu's; cuda_backend.WINO_TILES lists them). MIN_BLOCKS caps registers.
#define WINO_GEMM(BM, BN, BK, TM, TN, MIN_BLOCKS)                                                           \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)                        \
        wino_gemm_##BM##x##BN(const float* __restrict__ u, const float* __restrict__ v, float* __restrict__ mo, \
                              int cin, int cout, int o_pad, int t_pad) {                                   \
        wino_gemm<BM, BN, BK, TM, TN>(u, v, mo, cin, cout, o_pad, t_pad);                                  \
    }

WINO_GEMM(128, 128, 8, 8, 8, 2)
WINO_GEMM(64, 64, 16, 4, 4, 4)
WINO_GEMM(32, 128, 8, 4, 4, 4)
