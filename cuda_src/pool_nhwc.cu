// pool_nhwc.cu: the pools of the NHWC path (CudaBackend's NHWC layout), for each of its element types (conv_mma.cuh's
// NhwcF16: fp16; NhwcTf32: float32 words rounded to TF32; NhwcF32: float32).
//
// pool2d_nhwc[_tf32|_f32]: pool.cu's pool2d on channel slices of NHWC buffers: y[b, oh, ow, c] = max or mean of
// x[b, oh*S - P + r, ow*S - P + s, c] over the K x K window (max ignores padding; mean divides by K*K with
// count_include_pad, else by the positions inside the image); sums and maxima in fp32, one rounding at the store.
// With a bias (else null): relu(pool + bias[c]), the average pool moved behind the 1x1 conv it fed, which left its
// raw product in x (plan.fuse_pointwise; both are linear, so they commute).
// global_avg_pool_nhwc[_tf32|_f32]: y[b, c] = mean over H*W of x[b, :, :, c], written as float32 (the classifier's input,
// batch item b at y + b*y_bstride), so the FC runs on fp32 features as in the other modes.
//
// Idea: memory-bound and tiny; each thread moves one 16-byte piece (8 fp16 or 4 float channels) of one pixel,
// consecutive threads the next piece of the same pixel, so a warp's loads and stores are contiguous runs of 16-byte
// pieces. Views as in conv_nhwc.cu: x, y point at the view's first channel of pixel 0; pixel i starts i * *_cstride
// elements later. Channel counts, strides and view offsets are multiples of the piece.
//
// The network's pools are all 3x3 (stride 2 max pools, stride 1 average pools): for those (pool_nhwc_strips) a
// thread takes a strip of pool_nhwc_rows(S) output rows of one column instead of one pixel. The first version, one
// output pixel a thread with its window in loops of run-time length, read each input piece 9 times (2.25 at stride 2)
// one load after another and ran at 1.5-3.5x the pools' HBM floor (session 7's per-op table, H200: Mixed_5c.avg_pool
// 0.032 ms against 0.009). A strip reduces each input row's three taps once (unrolled, loads in flight together) and
// adds the row to every output of the strip whose window holds it: (R - 1) S + 3 rows of 3 loads for R outputs
// (4.5 loads an output at stride 1, R = 4; 7.5 at stride 2, R = 2), all issued before the first is used, and the
// index arithmetic once per strip. (A first version with R = 4 at both strides and the loads behind branches on the
// image's edges ran slower than the pixel-a-thread kernel: each thread waited out its rows' loads one row at a
// time, with a quarter of the threads.)
//
// Launch: pool2d_nhwc[_tf32|_f32]: block 256, grid ceil(batch*rows*Wo*channels/PIECE / 256), rows = ceil(Ho /
//         pool_nhwc_rows(S)) where pool_nhwc_strips, else Ho (cuda.launch_nhwc.nhwc_pool_spec).
//         global_avg_pool_nhwc[_tf32|_f32]: block 256, grid ceil(batch*channels/PIECE / 256).
#include "conv_mma.cuh"

// Output rows of a strip (cuda.launch_nhwc.pool_nhwc_rows): 4 at stride 1 (6 input rows, 18 loads), 2 at stride 2
// (5 input rows, 15 loads): every load of a strip is issued before the first is used, in registers.
__host__ __device__ constexpr int pool_nhwc_rows(int stride) { return stride == 1 ? 4 : 2; }
__device__ __forceinline__ bool pool_nhwc_strips(int kernel, int stride) {
    return kernel == 3 && (stride == 1 || stride == 2);
}

// One strip: output rows oh0 .. oh0 + R - 1 (those below Ho) of column ow, one piece of channels.
template <class E, int S>
__device__ __forceinline__ void pool3_nhwc_strip(const typename E::T* __restrict__ x, typename E::T* __restrict__ y,
                                                 int batch, int channels, int h, int w, int x_cstride, int ho, int wo,
                                                 int y_cstride, int pad, int is_max, int count_include_pad,
                                                 const float* __restrict__ bias) {
    constexpr int K = 3, R = pool_nhwc_rows(S), IN_ROWS = (R - 1) * S + K, PIECE = E::PIECE;
    const int groups = channels / PIECE, strips = (ho + R - 1) / R, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * strips * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // p = (b * strips + strip) * Wo + ow
    const int ow = p % wo, bs = p / wo, strip = bs % strips, b = bs / strips;
    const int oh0 = strip * R, h0 = oh0 * S - pad, w0 = ow * S - pad;
    bool col_in[K], row_in[IN_ROWS];
    int cols_in = 0;
#pragma unroll
    for (int s = 0; s < K; ++s) {
        col_in[s] = (unsigned)(w0 + s) < (unsigned)w;
        cols_in += col_in[s];
    }
#pragma unroll
    for (int i = 0; i < IN_ROWS; ++i) row_in[i] = (unsigned)(h0 + i) < (unsigned)h;
    const float init = is_max ? -INFINITY : 0.f;
    // Tap (i, s) is pixel (b, h0 + i, w0 + s); one outside the image reads x's first piece instead (no branch, so
    // that every load can be in flight at once) and counts as init.
    const typename E::T* const xb = x + (((long long)b * h + h0) * w + w0) * x_cstride + PIECE * cg;
    float rows[IN_ROWS][PIECE];
#pragma unroll
    for (int i = 0; i < IN_ROWS; ++i) {
#pragma unroll
        for (int e = 0; e < PIECE; ++e) rows[i][e] = init;
#pragma unroll
        for (int s = 0; s < K; ++s) {
            const bool in = row_in[i] && col_in[s];
            float v[PIECE];
            E::load(v, in ? xb + ((long long)i * w + s) * x_cstride : x);
#pragma unroll
            for (int e = 0; e < PIECE; ++e) {
                const float t = in ? v[e] : init;
                rows[i][e] = is_max ? fmaxf(rows[i][e], t) : rows[i][e] + t;
            }
        }
    }
#pragma unroll
    for (int j = 0; j < R; ++j) {
        if (oh0 + j >= ho) break;
        float acc[PIECE];
        int rows_in = 0;
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] = init;
#pragma unroll
        for (int i = j * S; i < j * S + K; ++i) {
            rows_in += row_in[i];
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? fmaxf(acc[e], rows[i][e]) : acc[e] + rows[i][e];
        }
        if (!is_max) {
            const float scale = 1.f / (float)(count_include_pad ? K * K : rows_in * cols_in);
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] *= scale;
        }
        if (bias != nullptr) {
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] = fmaxf(acc[e] + __ldg(bias + PIECE * cg + e), 0.f);
        }
        E::store(y + ((size_t)(b * ho + oh0 + j) * wo + ow) * y_cstride + PIECE * cg, acc);
    }
}

template <class E>
__device__ __forceinline__ void pool2d_nhwc_piece(const typename E::T* __restrict__ x, typename E::T* __restrict__ y,
                                                  int batch, int channels, int h, int w, int x_cstride, int ho, int wo,
                                                  int y_cstride, int kernel, int stride, int pad, int is_max,
                                                  int count_include_pad, const float* __restrict__ bias) {
    constexpr int PIECE = E::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // output pixel p = (b * Ho + oh) * Wo + ow
    const int ow = p % wo, oh = p / wo % ho, b = p / (wo * ho);
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    float acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? -INFINITY : 0.f;
    int inside = 0;
    for (int r = 0; r < kernel; ++r) {
        const int ih = h0 + r;
        if ((unsigned)ih >= (unsigned)h) continue;
        for (int s = 0; s < kernel; ++s) {
            const int iw = w0 + s;
            if ((unsigned)iw >= (unsigned)w) continue;
            float v[PIECE];
            E::load(v, x + ((size_t)(b * h + ih) * w + iw) * x_cstride + PIECE * cg);
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? fmaxf(acc[e], v[e]) : acc[e] + v[e];
            ++inside;
        }
    }
    if (!is_max) {
        const float scale = 1.f / (float)(count_include_pad ? kernel * kernel : inside);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] *= scale;
    }
    if (bias != nullptr) {
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] = fmaxf(acc[e] + __ldg(bias + PIECE * cg + e), 0.f);
    }
    E::store(y + (size_t)p * y_cstride + PIECE * cg, acc);
}

template <class E>
__device__ __forceinline__ void global_avg_pool_nhwc_piece(const typename E::T* __restrict__ x, float* __restrict__ y,
                                                           int batch, int channels, int hw, int x_cstride,
                                                           int y_bstride) {
    constexpr int PIECE = E::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * groups) return;
    const int cg = idx % groups, b = idx / groups;
    float acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = 0.f;
    for (int i = 0; i < hw; ++i) {
        float v[PIECE];
        E::load(v, x + ((size_t)b * hw + i) * x_cstride + PIECE * cg);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] += v[e];
    }
    float* yp = y + (size_t)b * y_bstride + PIECE * cg;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) yp[e] = acc[e] / (float)hw;
}

#define POOL_NHWC_KERNELS(SUFFIX, E)                                                                                \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                        \
        pool2d_nhwc##SUFFIX(const E::T* __restrict__ x, E::T* __restrict__ y, int batch, int channels, int h,       \
                            int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad,   \
                            int is_max, int count_include_pad, const float* __restrict__ bias) {                    \
        if (!pool_nhwc_strips(kernel, stride))                                                                      \
            pool2d_nhwc_piece<E>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, kernel, stride, pad,    \
                                 is_max, count_include_pad, bias);                                                  \
        else if (stride == 1)                                                                                       \
            pool3_nhwc_strip<E, 1>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, pad, is_max,          \
                                   count_include_pad, bias);                                                        \
        else                                                                                                        \
            pool3_nhwc_strip<E, 2>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, pad, is_max,          \
                                   count_include_pad, bias);                                                        \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                        \
        global_avg_pool_nhwc##SUFFIX(const E::T* __restrict__ x, float* __restrict__ y, int batch, int channels,    \
                                     int hw, int x_cstride, int y_bstride) {                                        \
        global_avg_pool_nhwc_piece<E>(x, y, batch, channels, hw, x_cstride, y_bstride);                             \
    }

POOL_NHWC_KERNELS(, NhwcF16)
POOL_NHWC_KERNELS(_tf32, NhwcTf32)
POOL_NHWC_KERNELS(_f32, NhwcF32)
