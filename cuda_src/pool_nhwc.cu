// pool_nhwc.cu: the pools of the NHWC path (CudaBackend's NHWC layout), for each of its element types (conv_mma.cuh's
// NhwcF16: fp16; NhwcTf32: float32 words rounded to TF32; NhwcF32: float32; i8_piece.cuh's I8Piece: int8).
//
// pool2d_nhwc[_tf32|_f32]: pool.cu's pool2d on channel slices of NHWC buffers: y[b, oh, ow, c] = max or mean of
// x[b, oh*S - P + r, ow*S - P + s, c] over the K x K window (max ignores padding; mean divides by K*K with
// count_include_pad, else by the positions inside the image); sums and maxima in fp32, one rounding at the store.
// With a bias (else null): relu(pool + bias[c]), the average pool moved behind the 1x1 conv it fed, which left its
// raw product in x (plan.fuse_pointwise; both are linear, so they commute).
// global_avg_pool_nhwc[_tf32|_f32]: y[b, c] = mean over H*W of x[b, :, :, c], written as float32 (the classifier's input,
// batch item b at y + b*y_bstride), so the FC runs on fp32 features as in the other modes.
// int8 (`--precision int8`, backends/int8_reference.py's integer semantics, exactly):
// pool2d_nhwc_i8: max pool exact on int8; average pool: the window's int8 sum in int32, divided by the count as one
// float32 division and rounded half to even (i8q::mean); then, where ratio != 1 (a pool feeding a concat stored at
// another scale), requantized: clamp(rint(q * ratio), -127, 127), ratio = float32(s_in) / float32(s_out).
// global_avg_pool_nhwc_i8: float32 features of the dequantized input, y[b, c] = (S * scale) / hw with S the exact
// int32 sum over H*W (|S| <= 127 * hw < 2^24, exact in float32) and two float32 roundings, a product and a quotient:
// within 2^-23 of the exact mean, relative (the reference's float32 mean of dequantized values is within a few
// ulps of it too, relative to the mean of |x|).
//
// Idea: memory-bound and tiny; each thread moves one 16-byte piece (8 fp16 or 4 float channels) of one pixel,
// consecutive threads the next piece of the same pixel, so a warp's loads and stores are contiguous runs of 16-byte
// pieces. Views as in conv_nhwc.cuh: x, y point at the view's first channel of pixel 0; pixel i starts i * *_cstride
// elements later. Channel counts, strides and view offsets are multiples of the piece.
//
// Launch: pool2d_nhwc[_tf32|_f32|_i8]: block 256, grid ceil(batch*Ho*Wo*channels/PIECE / 256).
//         global_avg_pool_nhwc[_tf32|_f32|_i8]: block 256, grid ceil(batch*channels/PIECE / 256).
#include "conv_mma.cuh"
#include "i8_piece.cuh"

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
        pool2d_nhwc_piece<E>(x, y, batch, channels, h, w, x_cstride, ho, wo, y_cstride, kernel, stride, pad,        \
                             is_max, count_include_pad, bias);                                                      \
    }                                                                                                               \
    extern "C" __global__ void __launch_bounds__(IE_THREADS)                                                        \
        global_avg_pool_nhwc##SUFFIX(const E::T* __restrict__ x, float* __restrict__ y, int batch, int channels,    \
                                     int hw, int x_cstride, int y_bstride) {                                        \
        global_avg_pool_nhwc_piece<E>(x, y, batch, channels, hw, x_cstride, y_bstride);                             \
    }

POOL_NHWC_KERNELS(, NhwcF16)
POOL_NHWC_KERNELS(_tf32, NhwcTf32)
POOL_NHWC_KERNELS(_f32, NhwcF32)


// --- int8 (I8Piece: 16 channels a thread) ------------------------------------------------------------------------

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    pool2d_nhwc_i8(const signed char* __restrict__ x, signed char* __restrict__ y, int batch, int channels, int h,
                   int w, int x_cstride, int ho, int wo, int y_cstride, int kernel, int stride, int pad, int is_max,
                   int count_include_pad, float ratio) {
    constexpr int PIECE = I8Piece::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * ho * wo * groups) return;
    const int cg = idx % groups, p = idx / groups;  // output pixel p = (b * Ho + oh) * Wo + ow
    const int ow = p % wo, oh = p / wo % ho, b = p / (wo * ho);
    const int h0 = oh * stride - pad, w0 = ow * stride - pad;
    int acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? -i8q::QMAX - 1 : 0;
    int inside = 0;
    for (int r = 0; r < kernel; ++r) {
        const int ih = h0 + r;
        if ((unsigned)ih >= (unsigned)h) continue;
        for (int s = 0; s < kernel; ++s) {
            const int iw = w0 + s;
            if ((unsigned)iw >= (unsigned)w) continue;
            int v[PIECE];
            I8Piece::load(v, x + ((size_t)(b * h + ih) * w + iw) * x_cstride + PIECE * cg);
#pragma unroll
            for (int e = 0; e < PIECE; ++e) acc[e] = is_max ? max(acc[e], v[e]) : acc[e] + v[e];
            ++inside;
        }
    }
    const int count = count_include_pad ? kernel * kernel : inside;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = i8q::requantize(is_max ? acc[e] : i8q::mean(acc[e], count), ratio);
    I8Piece::store(y + (size_t)p * y_cstride + PIECE * cg, acc);
}

extern "C" __global__ void __launch_bounds__(IE_THREADS)
    global_avg_pool_nhwc_i8(const signed char* __restrict__ x, float* __restrict__ y, int batch, int channels, int hw,
                            int x_cstride, int y_bstride, float scale) {
    constexpr int PIECE = I8Piece::PIECE;
    const int groups = channels / PIECE, idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= batch * groups) return;
    const int cg = idx % groups, b = idx / groups;
    int acc[PIECE];
#pragma unroll
    for (int e = 0; e < PIECE; ++e) acc[e] = 0;
    for (int i = 0; i < hw; ++i) {
        int v[PIECE];
        I8Piece::load(v, x + ((size_t)b * hw + i) * x_cstride + PIECE * cg);
#pragma unroll
        for (int e = 0; e < PIECE; ++e) acc[e] += v[e];
    }
    float* yp = y + (size_t)b * y_bstride + PIECE * cg;
#pragma unroll
    for (int e = 0; e < PIECE; ++e) yp[e] = i8q::div(i8q::mul(static_cast<float>(acc[e]), scale), (float)hw);
}
