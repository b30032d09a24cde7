// conv_nhwc.cu: 2-D convolution + bias + ReLU on fp16 NHWC activations, an implicit GEMM on the tensor cores whose
// operands both travel global -> shared memory by cp.async alone (`--precision fp16` with CudaBackend(nhwc=True)).
//
// y[b, oh, ow, m] = relu(bias[m] + sum_{r, s, c} w[m, r, s, c] * x[b, oh*S - PH + r, ow*S - PW + s, c]) as
// C[P, M] = A[P, K] B[K, M]: P = batch*Ho*Wo output pixels (GEMM rows), M = Cout (columns), K = KH*KW*Cin in
// (r, s, c) order. x and y are fp16 channel slices of NHWC buffers: pixel (b, h, w) of the view starts at
// x + ((b*H + h)*W + w)*x_cstride, where x points at the view's first channel and x_cstride is the buffer's channel
// count. Weights are fp16 rows w16[M][K] (cuda_backend.nhwc_weights), bias fp32, sums fp32 (mma.m16n8k16 .f16).
// Needs Cin, x_cstride and the view's first channel multiples of 8, Cout, y_cstride and y's first channel even.
//
// Idea: with channels innermost, the im2col row of an output pixel is, tap by tap, Cin consecutive halves of x, so
// 8 k (Cin % 8 == 0) are one 16-byte piece of one input pixel. conv_f16.cu's element-by-element gather through
// registers becomes one cp.async of 16 bytes per piece, with (r, s, c) of k kept per thread and advanced per tile, and
// padding and tails are the copy's zero fill (source size 0). The weight rows are 16-byte pieces too. Nothing passes
// through registers on its way to shared memory, so a ring of STAGES tiles keeps STAGES - 1 tiles of loads in flight
// behind the math of the current one, with one barrier per tile (conv_mma.cuh's cp_async_ring).
// Shared tiles As[pixel][k], Bs[m][k]: 32 k = 64 bytes per row, unpadded, so that 3 stages of 128x128 fit the 48 KB of
// static shared memory. 16-byte piece c of row r is stored at piece c ^ (r / 2 % 4): two rows share a 128-byte bank
// window, and the 8 rows one ldmatrix phase reads (the same logical piece of rows r0..r0+7, r0 even) then fall on
// bank groups 4 (r % 2) + (c ^ r / 2 % 4), all 8 distinct. Fragments by ldmatrix.x4 in the m16n8k16 layouts
// (conv_f16.cu's header): A rows are output pixels here, B rows output channels.
// Epilogue: a lane's accumulator pair (c0, c1) is two adjacent output channels of one pixel: bias, ReLU, one
// cvt.rn.f16x2 and one 4-byte store.
// Split-K: blockIdx.z selects K slice [z*k_split, (z+1)*k_split) (a multiple of 32); with several slices the raw fp32
// sums go to the workspace ws[z][P][M] (`out` is then ws) and conv_nhwc_splitk_reduce sums them in slice order, adds
// bias, applies ReLU and writes y.
// Block order: tile_n0 / tile_m0 (common.cuh) on grid (pixel tiles, channel tiles): consecutive blocks take the
// channel tiles of one pixel tile, which then share its input through L2.
//
// Launch: conv_nhwc_<BM>x<BN>: block 256, grid (ceil(P / BM), ceil(M / BN), splits), static shared memory
//         STAGES * (BM + BN) * 64 bytes. conv_nhwc_splitk_reduce: block 256, grid ceil(P * M / 2 / 256).
#include "conv_mma.cuh"

// Where 16-byte piece `piece` of shared row `row` lives (in halves from the row's start); see the header.
__device__ __forceinline__ int swizzled(int row, int piece) { return (piece ^ (row >> 1 & 3)) * 8; }

template <int BM, int BN, int WARPS_M, int STAGES>
__device__ __forceinline__ void conv_nhwc_gemm(const unsigned short* __restrict__ x,
                                               const unsigned short* __restrict__ w16, const float* __restrict__ bias,
                                               void* __restrict__ out, int batch, int cin, int h, int w,
                                               int x_cstride, int cout, int ho, int wo, int y_cstride, int kh, int kw,
                                               int stride, int pad_h, int pad_w, int k_split, int relu) {
    constexpr int NT = 256, BK = 32, ROWS = NT / 4;  // threads; k per stage; tile rows one pass of the loader covers
    constexpr int WARPS_N = NT / 32 / WARPS_M, WM = BM / WARPS_M, WN = BN / WARPS_N;
    constexpr int MI = WM / 16, NJ = WN / 8;  // m16n8 tiles per warp
    constexpr int A_ROWS = BM / ROWS, B_ROWS = (BN + ROWS - 1) / ROWS;  // rows of each tile per thread
    static_assert(WM % 16 == 0 && NJ % 2 == 0 && BM % ROWS == 0 && (BN % ROWS == 0 || BN < ROWS), "tile shape");

    __shared__ __align__(128) unsigned short As[STAGES][BM][BK];
    __shared__ __align__(128) unsigned short Bs[STAGES][BN][BK];

    const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
    const int wm = (warp % WARPS_M) * WM, wn = (warp / WARPS_M) * WN;
    const int howo = ho * wo, p_total = batch * howo;
    const int k_total = kh * kw * cin;
    const int p0 = tile_n0(BM), m0 = tile_m0(BN);
    const int k_begin = blockIdx.z * k_split;
    const int k_end = min(k_total, k_begin + k_split);

    // Loader: this thread copies piece `piece` (k = 8 piece .. 8 piece + 7 of the stage) of tile rows row0 + ROWS i.
    // Per stage it costs a few integer operations per row: the pixels' window corners are computed once, and the
    // piece's k is decoded into (r, s, c) once and then advanced by BK per stage without a division (the stages are
    // loaded in order). Divisions per stage had made the loop issue ~29 instructions per mma (ncu, round 6).
    // Offsets are 32-bit (a buffer of x has fewer than 2^31 halves: cuda_backend.check_nhwc), and a piece outside
    // the input reads from offset 0 with zero fill, so no branch is needed.
    const int piece = tid % 4, row0 = tid / 4;
    int a_ih[A_ROWS], a_iw[A_ROWS];  // the pixel's window corner
    int a_corner[A_ROWS];            // offset of the corner's pixel (in the padding, maybe: read only when inside)
#pragma unroll
    for (int i = 0; i < A_ROWS; ++i) {
        const int p = p0 + row0 + ROWS * i;
        const int b = p / howo, q = p - b * howo, oh = q / wo, ow = q - oh * wo;
        a_ih[i] = p < p_total ? oh * stride - pad_h : -(1 << 20);  // a pixel past P reads only zero fill
        a_iw[i] = ow * stride - pad_w;
        a_corner[i] = ((b * h + oh * stride - pad_h) * w + a_iw[i]) * x_cstride;
    }
    int w_row[B_ROWS];  // offset of the weight row; -1 past Cout (zero fill)
#pragma unroll
    for (int i = 0; i < B_ROWS; ++i) w_row[i] = m0 + row0 + ROWS * i < cout ? (m0 + row0 + ROWS * i) * k_total : -1;
    int k = k_begin + 8 * piece, tap = k / cin, c = k - tap * cin, r = tap / kw, s = tap - r * kw;

    auto load = [&](int, int stage) {
        const bool k_ok = k < k_end;  // k_split and K are multiples of 8: a piece is wholly inside or outside
        const int tap_offset = (r * w + s) * x_cstride + c;
#pragma unroll
        for (int i = 0; i < A_ROWS; ++i) {
            const int row = row0 + ROWS * i, ih = a_ih[i] + r, iw = a_iw[i] + s;
            const bool ok = k_ok && (unsigned)ih < (unsigned)h && (unsigned)iw < (unsigned)w;
            cp_async::copy16_or_zero(&As[stage][row][swizzled(row, piece)], x + (ok ? a_corner[i] + tap_offset : 0),
                                     ok);
        }
#pragma unroll
        for (int i = 0; i < B_ROWS; ++i) {
            const int row = row0 + ROWS * i;
            if (BN < ROWS && row >= BN) break;  // a narrow tile: the threads of the first BN rows load it
            const bool ok = k_ok && w_row[i] >= 0;
            cp_async::copy16_or_zero(&Bs[stage][row][swizzled(row, piece)], w16 + (ok ? w_row[i] + k : 0), ok);
        }
        k += BK;  // the next stage's piece
        for (c += BK; c >= cin; c -= cin)
            if (++s == kw) {
                s = 0;
                ++r;
            }
    };

    float acc[MI][NJ][4];
    zero_acc(acc);

    // This lane's ldmatrix rows and pieces (conv_f16.cu): A matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15); B matrices
    // (n 0-7, k 0-7), (n 0-7, k 8-15), (n 8-15, k 0-7), (n 8-15, k 8-15). Tile rows start at multiples of 16, so the
    // swizzle of a lane's row depends on the lane only.
    const int a_row = lane % 16, a_piece = lane / 16;
    const int b_row = lane % 8 + lane / 16 * 8, b_piece = lane / 8 % 2;

    cp_async_ring<STAGES, BK>(k_begin, k_end, load, [&](int st) {
#pragma unroll
        for (int kk = 0; kk < BK / 8; kk += 2) {  // k16 steps, counted in pieces
            unsigned b[NJ][2];
#pragma unroll
            for (int jj = 0; jj < NJ / 2; ++jj) {
                const int row = wn + 16 * jj + b_row;
                ldmatrix_b_pair(b[2 * jj], b[2 * jj + 1], &Bs[st][row][swizzled(row, kk + b_piece)]);
            }
#pragma unroll
            for (int i = 0; i < MI; ++i) {
                const int row = wm + 16 * i + a_row;
                unsigned a[4];
                ldmatrix::x4(a, &As[st][row][swizzled(row, kk + a_piece)]);
#pragma unroll
                for (int j = 0; j < NJ; ++j) f16::mma(acc[i][j], a, b[j]);
            }
        }
    });
    cp_async::wait<0>();  // no copy may still target shared memory when the block exits

    // Epilogue: C[g (+8)][2t, 2t+1] of each m16n8 tile (conv_mma.cuh's C layout) = pixel p, channels m, m + 1.
    const int g = lane / 4, t = lane % 4;
    const bool split = gridDim.z > 1;
#pragma unroll
    for (int i = 0; i < MI; ++i)
#pragma unroll
        for (int half = 0; half < 2; ++half) {
            const int p = p0 + wm + 16 * i + g + 8 * half;
            if (p >= p_total) continue;
#pragma unroll
            for (int j = 0; j < NJ; ++j) {
                const int m = m0 + wn + 8 * j + 2 * t;
                if (m >= cout) continue;  // cout is even: m + 1 < cout too
                float v0 = acc[i][j][2 * half], v1 = acc[i][j][2 * half + 1];
                if (split) {
                    float* ws = static_cast<float*>(out) + ((size_t)blockIdx.z * p_total + p) * cout + m;
                    *reinterpret_cast<float2*>(ws) = float2{v0, v1};
                    continue;
                }
                v0 += __ldg(bias + m);
                v1 += __ldg(bias + m + 1);
                if (relu) {
                    v0 = fmaxf(v0, 0.f);
                    v1 = fmaxf(v1, 0.f);
                }
                unsigned short* y = static_cast<unsigned short*>(out) + (size_t)p * y_cstride + m;
                *reinterpret_cast<unsigned*>(y) = f16::pack(v0, v1);
            }
        }
}

// One extern "C" entry point per tile. MIN_BLOCKS caps registers: 2 blocks of 256 threads leave 128 a thread for the
// 64x32 warp tile's 64 accumulators.
#define CONV_NHWC_KERNEL(BM, BN, WARPS_M, STAGES, MIN_BLOCKS)                                                        \
    extern "C" __global__ void __launch_bounds__(256, MIN_BLOCKS) conv_nhwc_##BM##x##BN(                              \
        const unsigned short* __restrict__ x, const unsigned short* __restrict__ w16, const float* __restrict__ bias, \
        void* __restrict__ out, int batch, int cin, int h, int w, int x_cstride, int cout, int ho, int wo,            \
        int y_cstride, int kh, int kw, int stride, int pad_h, int pad_w, int k_split, int relu) {                     \
        conv_nhwc_gemm<BM, BN, WARPS_M, STAGES>(x, w16, bias, out, batch, cin, h, w, x_cstride, cout, ho, wo,         \
                                                y_cstride, kh, kw, stride, pad_h, pad_w, k_split, relu);              \
    }

CONV_NHWC_KERNEL(128, 128, 2, 3, 2)  // warp tile 64x32, 48 KB
CONV_NHWC_KERNEL(128, 64, 4, 4, 2)   // warp tile 32x32, 48 KB
CONV_NHWC_KERNEL(64, 128, 2, 4, 2)   // warp tile 32x32, 48 KB
CONV_NHWC_KERNEL(64, 64, 2, 4, 3)    // warp tile 32x16, 32 KB
CONV_NHWC_KERNEL(128, 32, 4, 4, 3)   // warp tile 32x16, 40 KB: Cout = 32 layers

// y[p, m] (fp16, NHWC view) = relu(bias[m] + sum over z of ws[z][p][m]), two channels per thread.
extern "C" __global__ void __launch_bounds__(256)
    conv_nhwc_splitk_reduce(const float* __restrict__ ws, const float* __restrict__ bias,
                            unsigned short* __restrict__ y, int splits, int p_total, int cout, int y_cstride,
                            int relu) {
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
    if (relu) {
        v0 = fmaxf(v0, 0.f);
        v1 = fmaxf(v1, 0.f);
    }
    *reinterpret_cast<unsigned*>(y + (size_t)p * y_cstride + m) = f16::pack(v0, v1);
}
