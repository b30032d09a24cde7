// conv.cu: 2-D convolution + bias + ReLU as an implicit GEMM (fp32 FFMA, NCHW), and the split-K reduction.
//
// Computes y[b, m, oh, ow] = relu(bias[m] + sum_{c, r, s} w[m, c, r, s] * x[b, c, oh*S - PH + r, ow*S - PW + s])
// (x is zero outside the image) for every convolution of Inception-V3: kernels 1x1, 3x3, 5x5, 1x7, 7x1, 1x3, 3x1,
// stride 1 or 2, padding 0..3.
//
// Idea: the convolution is the matrix product C[M, N] = A[M, K] B[K, N] with M = Cout, N = batch*Ho*Wo and
// K = Cin*KH*KW. A is the weights, uploaded transposed as wt[K][M] so that a tile row is contiguous along M.
// B is the im2col matrix, which never exists: whoever loads a B tile into shared memory gathers its elements from
// x. Each thread loads always the same output pixel n of the tile, so (b, oh, ow) is decoded once per block;
// KH and KW are template parameters, so decoding k -> (c, r, s) is multiplication by constants. A block computes a
// BM x BN tile of C, a thread a TM x TN micro-tile in registers: ffma_gemm.cuh's main loop, which winograd.cu's GEMM
// shares (global loads of tile t+1 to registers during the math of tile t, one barrier per tile).
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split). With one slice the epilogue adds the bias,
// applies the ReLU and writes y; with several it writes raw partial sums to the workspace ws[z][M][N]. The plain
// kernels then leave the rest to conv_splitk_reduce (one more launch; they get the workspace as y). The _fixup
// kernels finish in place: each block counts itself done on its tile's counter (after a fence, so its partial
// sums are visible device-wide), and the block that arrives last sums the tile's slices in the fixed order
// z = 0, 1, ... (so results do not depend on which block was last), adds bias, applies ReLU, writes y and resets
// the counter to 0 for the next launch. Batch-1 layers on 17x17 and 8x8 grids (N = 289, 64) need split-K to fill
// 132 SMs; the fixup saves the reduction's launch on the latency-bound path.
// Views: x points at channel 0 of the source view in batch item 0 and item b starts x_bstride floats later (the
// source buffer's C_total*H*W); y likewise. A conv reads a channel slice and writes into its concat's buffer.
//
// Launch: conv_<KH>x<KW>_<BM>x<BN>: block ((BM/TM)*(BN/TN)) = 256 threads, grid (ceil(N/BN), ceil(M/BM), splits).
//         conv_<KH>x<KW>_<BM>x<BN>_fixup: the same, two more arguments: ws (splits*M*N floats) and counters
//         (grid.x*grid.y zeroed unsigned ints, left zeroed). conv_splitk_reduce: block 256, grid ceil(M*N/256).
#include "common.cuh"
#include "ffma_gemm.cuh"

template <int KH, int KW, int BM, int BN, int BK, int TM, int TN, bool FIXUP>
__device__ __forceinline__ void conv_gemm(const float* __restrict__ x, const float* __restrict__ wt,
                                          const float* __restrict__ bias, float* __restrict__ y, int batch, int cin,
                                          int h, int w, int x_bstride, int cout, int ho, int wo, int y_bstride,
                                          int stride, int pad_h, int pad_w, int k_split, int relu,
                                          float* __restrict__ ws, unsigned* __restrict__ counters) {
    constexpr int NT = (BM / TM) * (BN / TN);  // threads
    constexpr int TX = BN / TN;                // threads along N
    constexpr int A_STEP = NT / BM, A_LOADS = BK / A_STEP;
    constexpr int B_STEP = NT / BN, B_LOADS = BK / B_STEP;
    constexpr int M_RUNS = TM / 4, N_RUNS = TN / 4;
    constexpr int KHW = KH * KW;
    static_assert(TM % 4 == 0 && TN % 4 == 0, "micro-tiles are read as float4 runs");
    static_assert(NT % BM == 0 && NT % BN == 0 && BK % A_STEP == 0 && BK % B_STEP == 0, "loader shape");

    __shared__ __align__(16) float As[2][BK][BM];
    __shared__ __align__(16) float Bs[2][BK][BN];

    const int tid = threadIdx.x;
    const int howo = ho * wo, n_total = batch * howo, hw = h * w;
    const int n0 = blockIdx.x * BN, m0 = blockIdx.y * BM;
    const int k_begin = blockIdx.z * k_split;
    const int k_end = min(cin * KHW, k_begin + k_split);

    // A loader: column a_m of the tile, rows a_k, a_k + A_STEP, ...
    const int a_m = tid % BM, a_k = tid / BM;
    const bool a_ok = m0 + a_m < cout;
    const float* a_src = wt + m0 + a_m;
    // B loader: output pixel b_n of the tile, rows b_k, b_k + B_STEP, ...
    const int b_n = tid % BN, b_k = tid / BN;
    const bool b_ok = n0 + b_n < n_total;
    const WindowOrigin win = b_ok ? window_origin(x, n0 + b_n, howo, wo, stride, pad_h, pad_w, x_bstride)
                                  : WindowOrigin{x, 0, 0};
    const int ih0 = win.ih0, iw0 = win.iw0;
    const float* xb = win.xb;

    float ra[A_LOADS], rb[B_LOADS];
    auto load = [&](int kt) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) {
            const int k = kt + a_k + i * A_STEP;
            ra[i] = (a_ok && k < k_end) ? __ldg(a_src + (size_t)k * cout) : 0.f;
        }
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) {
            const int k = kt + b_k + i * B_STEP;
            float v = 0.f;
            if (b_ok && k < k_end) {
                const int c = k / KHW, rs = k - c * KHW, r = rs / KW, s = rs - r * KW;
                const int ih = ih0 + r, iw = iw0 + s;
                if ((unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w) v = __ldg(xb + (size_t)c * hw + ih * w + iw);
            }
            rb[i] = v;
        }
    };
    auto store = [&](int buf) {
#pragma unroll
        for (int i = 0; i < A_LOADS; ++i) As[buf][a_k + i * A_STEP][a_m] = ra[i];
#pragma unroll
        for (int i = 0; i < B_LOADS; ++i) Bs[buf][b_k + i * B_STEP][b_n] = rb[i];
    };

    const int tx = tid % TX, ty = tid / TX;
    float acc[TM][TN];
    ffma_main_loop<BM, BN, BK, TM, TN>(acc, As, Bs, tx, ty, k_begin, k_end, load, store);

    const bool split = gridDim.z > 1;
    const size_t slice = (size_t)cout * n_total;
    float* part = (FIXUP ? ws : y) + blockIdx.z * slice;
#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const int n = n0 + (j / 4) * (BN / N_RUNS) + tx * 4 + j % 4;
        if (n >= n_total) continue;
        const int b = n / howo, p = n - b * howo;
        float* yp = split ? part + n : y + (size_t)b * y_bstride + p;
        const size_t m_step = split ? (size_t)n_total : (size_t)howo;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + (i / 4) * (BM / M_RUNS) + ty * 4 + i % 4;
            if (m >= cout) continue;
            float v = acc[i][j];
            if (!split) {
                v += __ldg(bias + m);
                if (relu) v = fmaxf(v, 0.f);
            }
            yp[m * m_step] = v;
        }
    }
    if (!FIXUP || !split) return;

    __shared__ bool last;
    __threadfence();  // this thread's partial sums reach L2 before the block is counted
    __syncthreads();
    if (tid == 0) {
        unsigned* count = counters + blockIdx.y * gridDim.x + blockIdx.x;
        last = atomicAdd(count, 1u) == gridDim.z - 1;
        if (last) *count = 0;  // every block of the tile has counted: ready for the next launch
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    // Each thread sums the elements it wrote itself, slice by slice (all TM*TN loads of a slice in flight at once),
    // through L2 (__ldcg: L1 is not coherent across SMs).
#pragma unroll
    for (int i = 0; i < TM; ++i)
#pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] = 0.f;
    for (int z = 0; z < (int)gridDim.z; ++z) {
        const float* src = ws + z * slice;
#pragma unroll
        for (int j = 0; j < TN; ++j) {
            const int n = n0 + (j / 4) * (BN / N_RUNS) + tx * 4 + j % 4;
#pragma unroll
            for (int i = 0; i < TM; ++i) {
                const int m = m0 + (i / 4) * (BM / M_RUNS) + ty * 4 + i % 4;
                if (n < n_total && m < cout) acc[i][j] += __ldcg(src + (size_t)m * n_total + n);
            }
        }
    }
#pragma unroll
    for (int j = 0; j < TN; ++j) {
        const int n = n0 + (j / 4) * (BN / N_RUNS) + tx * 4 + j % 4;
        if (n >= n_total) continue;
        const int b = n / howo, p = n - b * howo;
#pragma unroll
        for (int i = 0; i < TM; ++i) {
            const int m = m0 + (i / 4) * (BM / M_RUNS) + ty * 4 + i % 4;
            if (m >= cout) continue;
            float v = acc[i][j] + __ldg(bias + m);
            if (relu) v = fmaxf(v, 0.f);
            y[(size_t)b * y_bstride + (size_t)m * howo + p] = v;
        }
    }
}

#define CONV_PARAMS                                                                                                 \
    const float *__restrict__ x, const float *__restrict__ wt, const float *__restrict__ bias, float *__restrict__ y, \
        int batch, int cin, int h, int w, int x_bstride, int cout, int ho, int wo, int y_bstride, int stride,       \
        int pad_h, int pad_w, int k_split, int relu
#define CONV_ARGS x, wt, bias, y, batch, cin, h, w, x_bstride, cout, ho, wo, y_bstride, stride, pad_h, pad_w, k_split, relu

// Two extern "C" entry points per (kernel size, tile), plain and _fixup; the names are what cuda/kernels.py asks
// the module for. MIN_BLOCKS caps registers: 2 blocks of 256 threads per SM leave 128 registers a thread for the
// 8x8 tile.
#define CONV_KERNEL(KH, KW, BM, BN, BK, TM, TN, MIN_BLOCKS)                                                     \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)                            \
        conv_##KH##x##KW##_##BM##x##BN(CONV_PARAMS) {                                                          \
        conv_gemm<KH, KW, BM, BN, BK, TM, TN, false>(CONV_ARGS, nullptr, nullptr);                             \
    }                                                                                                          \
    extern "C" __global__ void __launch_bounds__((BM / TM) * (BN / TN), MIN_BLOCKS)                            \
        conv_##KH##x##KW##_##BM##x##BN##_fixup(CONV_PARAMS, float* __restrict__ ws, unsigned* __restrict__ counters) { \
        conv_gemm<KH, KW, BM, BN, BK, TM, TN, true>(CONV_ARGS, ws, counters);                                  \
    }

#define CONV_TILES(KH, KW)                        \
    CONV_KERNEL(KH, KW, 128, 128, 8, 8, 8, 2)     \
    CONV_KERNEL(KH, KW, 64, 64, 16, 4, 4, 4)      \
    CONV_KERNEL(KH, KW, 32, 128, 16, 4, 4, 4)

IE_FOR_EACH_CONV_SHAPE(CONV_TILES)

// y[b, m, p] = relu(bias[m] + sum_z ws[z][m][n]) for n = b*howo + p; the slices are added in order z = 0, 1, ...
// so the result does not depend on scheduling.
extern "C" __global__ void __launch_bounds__(IE_THREADS)
    conv_splitk_reduce(const float* __restrict__ ws, const float* __restrict__ bias, float* __restrict__ y,
                       int splits, int cout, int n_total, int howo, int y_bstride, int relu) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= cout * n_total) return;
    const int m = idx / n_total, n = idx - m * n_total;
    const size_t slice = (size_t)cout * n_total;
    float v = 0.f;
    for (int z = 0; z < splits; ++z) v += __ldg(ws + z * slice + idx);
    v += __ldg(bias + m);
    if (relu) v = fmaxf(v, 0.f);
    const int b = n / howo, p = n - b * howo;
    y[(size_t)b * y_bstride + (size_t)m * howo + p] = v;
}
