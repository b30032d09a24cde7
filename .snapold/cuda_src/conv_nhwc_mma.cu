// conv_nhwc_mma.cu: the NHWC implicit-GEMM conv (conv_nhwc.cuh) on mma.sync tiles, fp16 and tf32, on every GPU with
// tensor cores; the same tiles behind a fused 3x3 max pool (_maxpool3_); and the split-K reduction of every NHWC
// conv tile, fp32's too.
//
// Idea: each warp of the block multiplies a WM x WN warp tile of the BM x BN block tile with m16n8 mma.sync steps,
// its fragments loaded by ldmatrix.x4 from the swizzled shared tiles the cp.async ring fills (conv_nhwc.cuh).
//
// Launch: conv_nhwc_<BM>x<BN> (fp16), conv_nhwc_tf32_<BM>x<BN> and their _maxpool3_ twins: block 256, grid
//         (ceil(P / BM), ceil(M / BN), splits), static shared memory STAGES * (BM + BN) * 64 bytes.
//         conv_nhwc[_tf32|_f32]_splitk_reduce: block 256, grid ceil(P * M / 2 / 256).
#include "conv_nhwc.cuh"

template <class E, int BM, int BN, int WARPS_M, int STAGES, class Loader = NhwcLoader<E, BM, BN, 256>>
__device__ __forceinline__ void conv_nhwc_gemm(const NhwcConvArgs<E>& a) {
    using T = typename E::T;
    constexpr int PIECE = E::PIECE, NT = 256, BK = Loader::BK;
    constexpr int WARPS_N = NT / 32 / WARPS_M, WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MI = WM / 16, NJ = WN / 8;  // m16n8 tiles per warp
    static_assert(WM % 16 == 0 && NJ % 2 == 0, "tile shape");

    __shared__ __align__(128) T As[STAGES][BM][BK];
    __shared__ __align__(128) T Bs[STAGES][BN][BK];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * WN;
    const int p_total = a.batch * a.ho * a.wo, k_total = a.kh * a.kw * a.cin;
    const int p0 = tile_n0(BM), m0 = tile_m0(BN);
    const int k_begin = blockIdx.z * a.k_split;
    const int k_end = min(k_total, k_begin + a.k_split);
    Loader load(a, As, Bs, p0, m0, k_begin, k_end, tid);

    float acc[MI][NJ][4];
    zero_acc(acc);

    // This lane's ldmatrix rows and pieces (the header): A matrices (rows 0-7 | 8-15) x (piece 0 | 1); B matrices
    // (n 0-7, piece 0), (n 0-7, piece 1), (n 8-15, piece 0), (n 8-15, piece 1). Tile rows start at multiples of 16,
    // so the swizzle of a lane's row depends on the lane only.
    const int a_row = lane % 16, a_piece = lane / 16;
    const int b_row = lane % 8 + lane / 16 * 8, b_piece = lane / 8 % 2;

    cp_async_ring<STAGES, BK>(k_begin, k_end, load, [&](int st) {
#pragma unroll
        for (int kk = 0; kk < 4; kk += 2) {  // mma k steps of two pieces (k16 of fp16, k8 of tf32)
            unsigned b[NJ][2];
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                const int row = wn + 16 * jj + b_row;
                ldmatrix_b_pair(b[2 * jj], b[2 * jj + 1], &Bs[st][row][swizzled<PIECE>(row, kk + b_piece)]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int row = wm + 16 * i + a_row;
                unsigned af[4];
                ldmatrix::x4(af, &As[st][row][swizzled<PIECE>(row, kk + a_piece)]);
#pragma unroll
                for (int j = 0; j < NJ; ++j) E::mma(acc[i][j], af, b[j]);
            }
        }
    });
    cp_async::wait<0>();  // no copy may still target shared memory when the block exits

    // Epilogue: C[g (+8)][2t, 2t+1] of each m16n8 tile (conv_mma.cuh's C layout) = pixel p, channels m, m + 1.
    const int g = lane / 4, t = lane % 4;
    const NhwcStore<E> store{a, p_total, (int)blockIdx.z, (int)gridDim.z};
#pragma unroll
    for (int j = 0; j < NJ; ++j)
        store.column(m0 + wn + 8 * j + 2 * t, [&](auto&& put) {
#pragma unroll
            for (int i = 0; i < MI; ++i)
#pragma unroll
                for (int half = 0; half < 2; ++half)
                    put(p0 + wm + 16 * i + g + 8 * half, acc[i][j][2 * half], acc[i][j][2 * half + 1]);
        });
}

// Each mma.sync tile also as NAME_maxpool3_BMxBN: the 1x1 conv behind a 3x3 max pool (NhwcMaxPoolLoader).
#define CONV_NHWC_KERNEL(NAME, E, BM, BN, WARPS_M, STAGES, MIN_BLOCKS)                                        \
    CONV_NHWC_ENTRY(NAME##_##BM##x##BN, E, 256, MIN_BLOCKS, (conv_nhwc_gemm<E, BM, BN, WARPS_M, STAGES>)) \
    CONV_NHWC_ENTRY(NAME##_maxpool3_##BM##x##BN, E, 256, MIN_BLOCKS,                                      \
                    (conv_nhwc_gemm<E, BM, BN, WARPS_M, STAGES, NhwcMaxPoolLoader<E, BM, BN, 256, 3>>))

// Warp tiles and shared memory: 128x128 64x32, 48 KB; 128x64 and 64x128 32x32, 48 KB; 64x64 32x16, 32 KB; 128x32
// (the Cout = 32 layers) 32x16, 40 KB. Bytes per stage are the same in both element types.
#define CONV_NHWC_TILES(NAME, E)                   \
    CONV_NHWC_KERNEL(NAME, E, 128, 128, 2, 3, 2)   \
    CONV_NHWC_KERNEL(NAME, E, 128, 64, 4, 4, 2)    \
    CONV_NHWC_KERNEL(NAME, E, 64, 128, 2, 4, 2)    \
    CONV_NHWC_KERNEL(NAME, E, 64, 64, 2, 4, 3)     \
    CONV_NHWC_KERNEL(NAME, E, 128, 32, 4, 4, 3)

#ifdef IE_NHWC_FP16
CONV_NHWC_TILES(conv_nhwc, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_TILES(conv_nhwc_tf32, NhwcTf32)
#endif

// y[p, m] (a view of the element type E, or its parts) = relu(bias[m] + sum over z of ws[z][p][m]), two channels per
// thread.
template <class E>
__device__ __forceinline__ void conv_nhwc_splitk_sum(const float* __restrict__ ws, const float* __restrict__ bias,
                                                     typename E::T* __restrict__ y, int splits, int p_total, int cout,
                                                     int y_cstride, const NhwcParts& parts) {
    const int idx = blockIdx.x * blockDim.x + threadIdx.x, pairs = cout / 2;
    if (idx >= p_total * pairs) return;
    const int p = idx / pairs, m = 2 * (idx - p * pairs);
    float v0 = 0.f, v1 = 0.f;
    for (int z = 0; z < splits; ++z) {
        const float2 s = __ldg(reinterpret_cast<const float2*>(ws + ((size_t)z * p_total + p) * cout + m));
        v0 += s.x;
        v1 += s.y;
    }
    v0 += __ldg(bias + m);
    v1 += __ldg(bias + m + 1);
    if (m < parts.relu_end) {
        v0 = fmaxf(v0, 0.f);
        v1 = fmaxf(v1, 0.f);
    }
    const NhwcParts::Column col = parts.column(y_cstride, m);
    E::store2(y + (col.base + p * col.cstride), v0, v1);
}

#define CONV_NHWC_SPLITK_REDUCE(NAME, E)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                             \
        NAME(const float* __restrict__ ws, const float* __restrict__ bias, E::T* __restrict__ y, int splits,      \
             int p_total, int cout, int y_cstride, NHWC_PARTS_PARAMS) {                                           \
        conv_nhwc_splitk_sum<E>(ws, bias, y, splits, p_total, cout, y_cstride, NHWC_PARTS_ARGS);                  \
    }

#ifdef IE_NHWC_FP16
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_splitk_reduce, NhwcF16)
#endif
#ifdef IE_NHWC_TF32
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_tf32_splitk_reduce, NhwcTf32)
#endif
#ifdef IE_NHWC_FP32
CONV_NHWC_SPLITK_REDUCE(conv_nhwc_f32_splitk_reduce, NhwcF32)
#endif
